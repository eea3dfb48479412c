"""Files of any size through any per-chunk function: streamed reading, bounded memory, exact resume.

    records.py  input files as `Record`s: txt, jsonl, csv/tsv, CoNLL, SQuAD (`read_records`)
    job.py      `run_file` (its settings: `RunFileConfig`): records chunk by chunk through `process`
                into one .npy / .jsonl output
    state.py    what a run keeps beside its output so that a killed run resumes exactly
    group.py    the processes that share one file under torchrun

Nothing here knows about models; `inference.jobs` gives each use of a model its chunk function.
"""

from bertkit.inference.files.job import DEFAULT_CHUNK_SIZE, KINDS, RunFileConfig, run_file, run_file_job
from bertkit.inference.files.records import (
    DEFAULT_MAX_CHARS,
    FORMAT_SUFFIXES,
    FORMATS,
    Record,
    RecordReport,
    read_records,
    record_format,
)
from bertkit.inference.files.state import OutputFiles, input_fingerprint

__all__ = ["DEFAULT_CHUNK_SIZE", "DEFAULT_MAX_CHARS", "FORMAT_SUFFIXES", "FORMATS", "KINDS", "OutputFiles", "Record",
           "RecordReport", "input_fingerprint", "read_records", "record_format", "run_file",
           "RunFileConfig", "run_file_job"]
