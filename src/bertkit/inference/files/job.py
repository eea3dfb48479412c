"""A file of any size through any per-chunk function: bounded memory, one ordered output, exact resume.

`run_file` maps the usable records of an input file (`records.read_records`: bad rows named with
file:line, counted per problem and skipped), chunk by chunk, through the caller's `process`
function (a model, typically; nothing here knows about models) into one output:

  npy    a (N, dim) array in a `.npy` file, row i = the i-th usable record, written in place
         through `numpy.lib.format.open_memmap`;
  jsonl  one JSON object per usable input row, holding its source `line` (and its `id`, if the
         row has one), appended and flushed chunk by chunk.

Memory is one chunk of records and its results, whatever the file size. The npy header holds the
shape and comes first in the file, so a first streaming pass counts the usable rows (parsing only,
no `process` calls: its cost is one read of the file, small next to a model's). That pass also
gives the progress bar its exact total, reports every bad row once, and fails on a file with
nothing usable before any output is created. (Writing rows first and the header last would need a
guessed, padded header and leave a file that no reader opens until the end.)

Resume: the output is built under `OUT.partial` and renamed to OUT when complete, so a finished
output never sits beside a half one; a small state file beside it (`state.py`) records the rows
done and what must not change. A row's result is on disk before the state that counts it.
`resume=True` verifies all of it (an error names what changed), truncates a jsonl to its committed
length and continues after the rows done, so a run killed at any moment (SIGKILL included) and
resumed writes the same bytes as an uninterrupted one.

Several processes (`torchrun --nproc_per_node N [--nnodes M]`, WORLD_SIZE = W > 1): rank r
processes chunks r, r + W, r + 2W, ... of the usable rows (chunk k = rows [k·chunk_size,
(k+1)·chunk_size)), so the output is the same for any W. npy: rank 0 creates the memory-mapped file,
the others open it after rank 0 says it is there, and each writes its own rows. jsonl: each rank
appends to its own part file, and rank 0 merges the parts in input order at the end. Each rank
keeps its own state file (`OUT.progress-rank{r}-of-{W}.json`), so resume works per rank, with the
same W. Across nodes, OUT and the input must be on a file system every node sees (for npy one
whose writes from several hosts to one file do not clobber each other; otherwise use jsonl).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bertkit.inference.files.group import Group, join_group, on_rank0
from bertkit.inference.files.records import DEFAULT_MAX_CHARS, Record, RecordReport, read_records, record_format
from bertkit.inference.files.state import STATE_VERSION, OutputFiles, decide, input_fingerprint, load_state, plain
from bertkit.util.fileio import atomic_write_json

log = logging.getLogger(__name__)

KINDS = ("npy", "jsonl")
# Records per `process` call: big enough that a token-budget batcher inside `process` finds
# similar lengths to group, small enough that a chunk's texts and results stay a few MB.
DEFAULT_CHUNK_SIZE = 1024


@dataclass
class RunFileConfig:
    """Every setting of `run_file` but its `process` function; what must not change for a resume
    is written to the state file beside the output (`state.py`)."""

    input_path: str | os.PathLike  # any format `read_records` reads
    out_path: str | os.PathLike  # OUT: a .npy or .jsonl file (built as OUT.partial, renamed when complete)
    kind: str | None = None  # "npy" or "jsonl"; None = from the suffix of out_path (resolved on construction)
    dim: int | None = None  # npy row width; None = measured by calling `process` on the first record once
    dtype: str = "float32"  # npy: what embeddings are everywhere downstream (FAISS, numpy search)
    chunk_size: int = DEFAULT_CHUNK_SIZE  # records per `process` call (see DEFAULT_CHUNK_SIZE)
    # Continue a killed run of the same input and settings; with no partial run it starts from
    # row 0, with a complete OUT it does nothing.
    resume: bool = False
    overwrite: bool = False  # start over, removing an existing OUT and any partial run of it
    progress: bool = True  # a tqdm bar of rows on rank 0
    # Whatever must be equal for a resumed run to continue one output (model directory, its
    # fingerprint, precision, pooling, ...): JSON-able values, compared key by key.
    settings: dict[str, Any] = field(default_factory=dict)
    fmt: str = "auto"  # reading, as `read_records`: by the input's suffix
    text_field: str = "text"
    pair_field: str | None = None
    words_field: str | None = None
    max_chars: int = DEFAULT_MAX_CHARS  # longer rows are skipped as bad rather than read whole
    # "auto" (several ranks when WORLD_SIZE > 1, e.g. under torchrun), False, True, or a
    # `bertkit.util.distributed.DistInfo` whose process group the caller already joined.
    distributed: Any = "auto"
    desc: str = "rows"  # the progress bar's unit
    # jsonl: the output's `line` is this field of each input row (an input that is itself derived
    # from another file, e.g. passages naming their document's line), not the row's own.
    line_field: str | None = None

    def __post_init__(self) -> None:
        self.input_path, self.out_path = Path(self.input_path), Path(self.out_path)
        self.settings = dict(self.settings or {})
        self.validate()

    def validate(self) -> None:
        """Resolve kind and dtype; raise ValueError naming a bad value and the fix."""
        out = self.out_path
        self.kind = self.kind or {".npy": "npy", ".jsonl": "jsonl"}.get(out.suffix.lower())
        if self.kind not in KINDS:
            raise ValueError(f"cannot tell the output kind of {out} (suffix {out.suffix!r}); name it "
                             ".npy or .jsonl, or pass kind='npy' / 'jsonl'")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")
        if self.dim is not None and self.dim <= 0:
            raise ValueError(f"dim must be positive, got {self.dim}")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other; pass one")
        self.dtype = np.dtype(self.dtype).name

    def reading(self) -> dict[str, Any]:
        """`read_records`' keyword arguments."""
        return dict(fmt=self.fmt, text_field=self.text_field, pair_field=self.pair_field,
                    words_field=self.words_field, max_chars=self.max_chars)


def run_file(input_path: str | os.PathLike, out_path: str | os.PathLike,
             process: Callable[[list[Record]], Sequence[Any] | np.ndarray], **options: Any) -> dict[str, Any]:
    """`run_file_job` of a `RunFileConfig` made of these arguments; options: any other of its
    fields (kind, dim, chunk_size, resume, overwrite, settings, text_field, ...)."""
    return run_file_job(RunFileConfig(input_path=input_path, out_path=out_path, **options), process)


def run_file_job(config: RunFileConfig, process: Callable[[list[Record]], Sequence[Any] | np.ndarray]
                 ) -> dict[str, Any]:
    """Map every usable row of `config.input_path` through `process` into `config.out_path`, in order.

    process: list of up to `chunk_size` Records → one result per record, in order: for kind
      "npy" an array-like (len(records), dim) (cast to `dtype`); for "jsonl" a sequence of dicts
      (written as {"line": source line, "id": the row's id if it has one, **result}) or of other
      JSON values (written as {"line": ..., "result": value}).
    Returns a summary: out, input, kind, rows (written), dim, skipped (count), problems
      {problem: count}, examples (first "file:line: what is wrong"), resumed_from (rows this rank
      had done before), processed (rows this rank computed now), seconds, rows_per_second,
      world_size, rank, already_complete.
    Raises FileExistsError for an existing OUT or partial run without resume / overwrite,
    ValueError for a partial run that does not match (naming what changed) or a `process` result
    of the wrong length or shape.
    """
    started = time.monotonic()
    input_path, out, kind = config.input_path, config.out_path, config.kind
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; pass the path of the {kind} file to write")
    fmt = record_format(input_path, config.fmt)
    if not input_path.is_file():
        raise FileNotFoundError(f"no such input file: {input_path}")
    reading = {**config.reading(), "fmt": fmt}
    files = OutputFiles(out)

    group = join_group(config.distributed)
    decision = on_rank0(group, lambda: decide(files, config.resume, config.overwrite, group.world_size))
    if decision == "complete":
        return _complete_summary(input_path, out, kind, group, started)
    fingerprint = input_fingerprint(input_path)
    report = RecordReport(str(input_path), quiet=group.rank != 0)
    n_rows = _count_rows(input_path, report, reading, show=config.progress and group.rank == 0)
    current = {"version": STATE_VERSION, "input": fingerprint, "kind": kind, "format": fmt,
               "text_field": config.text_field, "pair_field": config.pair_field,
               "words_field": config.words_field, "max_chars": config.max_chars,
               "dtype": config.dtype if kind == "npy" else None, "dim": config.dim if kind == "npy" else None,
               "world_size": group.world_size, "rank": group.rank, "chunk_size": config.chunk_size,
               "rows": n_rows, "settings": plain(config.settings)}
    saved = load_state(files.state(group.rank, group.world_size), current, out) \
        if decision == "resume" else None
    job = Job(files, group, current, process, reading, input_path, saved, line_field=config.line_field)
    if kind == "npy":
        job.open_npy(resume=decision == "resume")
    else:
        job.open_jsonl()
    processed = job.run(config.progress, config.desc)
    job.finish()
    seconds = time.monotonic() - started
    if group.rank == 0:
        log.info("%s; wrote %s in %.1f s", report.summary(), out, seconds)
    return {"out": str(out), "input": str(input_path), "kind": kind, "rows": n_rows,
            "dim": job.current.get("dim"), "skipped": report.n_skipped,
            "problems": dict(sorted(report.problems.items())), "examples": report.messages[:5],
            "resumed_from": job.rows_done_before, "processed": processed,
            "seconds": round(seconds, 3),
            "rows_per_second": round(processed / seconds, 1) if seconds > 0 else None,
            "world_size": group.world_size, "rank": group.rank, "already_complete": False}


def _count_rows(path: Path, report: RecordReport, reading: dict[str, Any], show: bool) -> int:
    """The first pass: usable rows counted (bad ones reported), nothing kept. A bar shows that a
    big file is being read (no ETA: its row count is what this pass finds out)."""
    from tqdm.auto import tqdm

    n, step = 0, 1 << 16
    with tqdm(desc="counting rows", unit="rows", unit_scale=True, disable=not show, leave=False) as bar:
        for _ in read_records(path, report=report, **reading):
            n += 1
            if n % step == 0:
                bar.update(step)
    return n


@dataclass
class Job:
    """One rank's share of a file: its chunks, its output handle and its state."""

    files: OutputFiles
    group: Group
    current: dict[str, Any]  # what the state file holds, without the progress counters
    process: Callable[[list[Record]], Any]
    reading: dict[str, Any]
    input_path: Path
    saved: dict[str, Any] | None
    rows_done: int = 0  # rows of this rank's chunks already in the output
    chunks_done: int = 0
    offset: int = 0  # jsonl: bytes of this rank's file that hold committed rows
    rows_done_before: int = 0
    array: Any = None  # npy: the memory-mapped output
    handle: Any = None  # jsonl: this rank's open output file
    line_field: str | None = None  # jsonl: the row field that is the output's `line` (see run_file)

    def __post_init__(self) -> None:
        if self.saved:
            self.rows_done = self.saved["rows_done"]
            self.chunks_done = self.saved["chunks_done"]
            self.offset = self.saved.get("offset", 0)
        self.rows_done_before = self.rows_done

    # -- the rows this rank computes -------------------------------------------------------------
    def chunks(self) -> list[tuple[int, int]]:
        """[lo, hi) row ranges still to do, in order. One process goes on from its last row (any
        chunk size); rank r of W does chunks r, r + W, ... after the ones it finished."""
        n, size, w, r = self.current["rows"], self.current["chunk_size"], \
            self.current["world_size"], self.current["rank"]
        if w == 1:
            return [(lo, min(lo + size, n)) for lo in range(self.rows_done, n, size)]
        n_chunks = math.ceil(n / size)
        return [(k * size, min((k + 1) * size, n)) for k in range(r + self.chunks_done * w, n_chunks, w)]

    def assigned_rows(self) -> int:
        """Rows of every chunk of this rank, done or not (the progress bar's total)."""
        n, size, w, r = self.current["rows"], self.current["chunk_size"], \
            self.current["world_size"], self.current["rank"]
        if w == 1:
            return n
        return sum(min((k + 1) * size, n) - k * size for k in range(r, math.ceil(n / size), w))

    # -- outputs ---------------------------------------------------------------------------------
    def open_npy(self, resume: bool) -> None:
        partial, n = self.files.partial, self.current["rows"]

        def create_or_check() -> int:
            any_state = bool(self.files.states())
            if resume and partial.exists():
                array = np.lib.format.open_memmap(partial, mode="r")
                shape, dtype = array.shape, array.dtype.name
                del array
                wanted = self.current["dim"] or (shape[1] if len(shape) == 2 else None)
                if shape == (n, wanted) and dtype == self.current["dtype"]:
                    return wanted
                if any_state:
                    raise ValueError(f"cannot resume {self.files.out}: {partial} holds {dtype} rows of "
                                     f"shape {shape}, this run writes ({n}, {wanted}) "
                                     f"{self.current['dtype']}; pass --overwrite to start over")
            elif resume and any_state:
                raise ValueError(f"cannot resume {self.files.out}: {partial} is missing, so the rows "
                                 "its state files count are lost; pass --overwrite to start over")
            dim = self.current["dim"] or self._probe_dim()
            # The header with the final shape goes first; rows are filled in place (zeros until then).
            np.lib.format.open_memmap(partial, mode="w+", dtype=self.current["dtype"],
                                      shape=(n, dim)).flush()
            for path in self.files.states():  # a state without rows behind it would lie
                path.unlink()
            return dim

        self.current["dim"] = on_rank0(self.group, create_or_check)
        own_state = self.files.state(self.group.rank, self.group.world_size)
        if self.saved is not None and not own_state.exists():  # rank 0 started the file afresh
            self.saved, self.rows_done, self.chunks_done = None, 0, 0
            self.rows_done_before = 0
        if not partial.exists():
            raise FileNotFoundError(f"rank {self.group.rank} cannot see {partial}, which rank 0 created; "
                                    "--out must be on a file system that every node sees")
        self.array = np.lib.format.open_memmap(partial, mode="r+")

    def _probe_dim(self) -> int:
        first = next(iter(read_records(self.input_path, report=RecordReport("probe", quiet=True),
                                       **self.reading)))
        result = np.asarray(self.process([first]))
        if result.ndim != 2 or result.shape[0] != 1:
            raise ValueError(f"process returned shape {result.shape} for 1 record; for an .npy output "
                             "it must return (records, dim)")
        return int(result.shape[1])

    def open_jsonl(self) -> None:
        w, r = self.group.world_size, self.group.rank
        path = self.files.partial if w == 1 else self.files.part(r, w)
        if self.saved is None:
            self.handle = open(path, "wb")  # from row 0: whatever a previous attempt left goes
            return
        size = path.stat().st_size if path.exists() else -1
        if size < self.offset:
            raise ValueError(f"cannot resume {self.files.out}: {path} holds {max(size, 0)} bytes but its "
                             f"state counts {self.offset}; pass --overwrite to start over")
        self.handle = open(path, "r+b")
        self.handle.truncate(self.offset)  # drop rows written after the last committed state
        self.handle.seek(self.offset)

    # -- the loop --------------------------------------------------------------------------------
    def run(self, progress: bool, desc: str) -> int:
        """Compute this rank's remaining chunks; returns the number of rows computed."""
        from tqdm.auto import tqdm

        todo = self.chunks()
        w = self.group.world_size
        label = desc if w == 1 else f"{desc} (rank 0 of {w})"
        # Rate and ETA over this rank's rows (ranks share the work evenly, so rank 0's is the job's).
        bar = tqdm(total=self.assigned_rows(), initial=self.rows_done, unit="rows", unit_scale=True,
                   desc=label, disable=not progress or self.group.rank != 0, dynamic_ncols=True,
                   smoothing=0.05)
        processed, records = 0, None
        try:
            if todo and self.rows_done:
                log.info("resuming %s: %d of this process's %d rows already done", self.files.out,
                         self.rows_done, self.assigned_rows())
            if todo:
                # Bad rows were reported by the counting pass; this pass only skips them again.
                records = read_records(self.input_path, report=RecordReport("again", quiet=True),
                                       **self.reading)
            next_row, chunk = 0, []  # the row `records` yields next
            for lo, hi in todo:
                # range first: once it ends, zip stops without taking a record past row hi - 1
                for row, record in zip(range(next_row, hi), records):
                    if row >= lo:  # rows before lo are other ranks' or already done
                        chunk.append(record)
                next_row = hi
                if len(chunk) != hi - lo:
                    raise ValueError(f"{self.input_path} changed while it was read: fewer usable "
                                     f"rows than the {self.current['rows']} counted first")
                self._write(lo, chunk, self.process(chunk))
                processed += len(chunk)
                bar.update(len(chunk))
                chunk = []
        finally:
            if records is not None:
                records.close()
            bar.close()
            self._close()
        return processed

    def _write(self, lo: int, chunk: list[Record], results: Any) -> None:
        """Put one chunk's results on disk, then commit the state that counts them."""
        if self.array is not None:
            values = np.asarray(results)
            wanted = (len(chunk), self.array.shape[1])
            if values.shape != wanted:
                raise ValueError(f"process returned an array of shape {values.shape} for "
                                 f"{len(chunk)} records; expected {wanted}")
            self.array[lo:lo + len(chunk)] = values
            self._flush_rows(lo, lo + len(chunk))
        else:
            if not hasattr(results, "__len__"):  # a generator
                results = list(results)
            if len(results) != len(chunk):
                raise ValueError(f"process returned {len(results)} results for {len(chunk)} records; "
                                 "it must return one per record, in order")
            lines = []
            for record, result in zip(chunk, results):
                obj: dict[str, Any] = {"line": record.extra[self.line_field] if self.line_field else record.line}
                if "id" in record.extra:
                    obj["id"] = record.extra["id"]
                if isinstance(result, dict):
                    if "line" in result:
                        raise ValueError("process returned a result with a 'line' key, which the "
                                         "output reserves for the source line; rename it")
                    obj.update(result)
                else:
                    obj["result"] = result
                lines.append(json.dumps(obj, ensure_ascii=False, default=_json_default) + "\n")
            self.handle.write("".join(lines).encode("utf-8"))
            self.handle.flush()
            os.fsync(self.handle.fileno())  # the rows are on disk before the state that counts them
            self.offset = self.handle.tell()
        self.rows_done += len(chunk)
        self.chunks_done += 1
        atomic_write_json(self.files.state(self.group.rank, self.group.world_size),
                          {**self.current, "rows_done": self.rows_done,
                           "chunks_done": self.chunks_done, "offset": self.offset})

    def _flush_rows(self, lo: int, hi: int) -> None:
        """Write rows [lo, hi) of the memory map to disk. Only their pages: `memmap.flush()` syncs
        the whole mapping, whose cost grows with the file (millions of rows), not with the chunk."""
        base = getattr(self.array, "_mmap", None)  # numpy's mmap.mmap under the array
        if base is None:
            self.array.flush()
            return
        row_bytes = self.array.strides[0]
        # np.memmap maps the file from `start` (its offset rounded down to the allocation
        # granularity); flush offsets are within the mapping and must be page-aligned.
        start = self.array.offset - self.array.offset % mmap.ALLOCATIONGRANULARITY
        first = self.array.offset - start + lo * row_bytes
        aligned = first - first % mmap.PAGESIZE
        base.flush(aligned, first - aligned + (hi - lo) * row_bytes)

    def _close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        if self.array is not None:
            self.array.flush()
            self.array = None  # unmaps

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> None:
        """When every rank is done: (merge the parts,) rename the output into place, clean up."""
        self.group.barrier()

        def finalize() -> None:
            files, w = self.files, self.group.world_size
            if self.current["kind"] == "jsonl" and w > 1:
                self._merge_parts()
            os.replace(files.partial, files.out)
            # After the rename: a kill in between leaves a complete OUT whose leftovers the next
            # --resume removes, never a lost output.
            for path in files.leftovers():
                path.unlink()

        on_rank0(self.group, finalize)

    def _merge_parts(self) -> None:
        """Rank 0: the ranks' part files → OUT.partial in input order (chunk k is in part k mod W)."""
        n, size, w = self.current["rows"], self.current["chunk_size"], self.group.world_size
        parts = [open(self.files.part(r, w), "rb") for r in range(w)]
        try:
            with open(self.files.partial, "wb") as merged:
                for k in range(math.ceil(n / size)):
                    source = parts[k % w]
                    for _ in range(min(size, n - k * size)):
                        line = source.readline()
                        if not line.endswith(b"\n"):
                            raise ValueError(f"{self.files.part(k % w, w)} ends early at chunk {k}; "
                                             "pass --overwrite to start over")
                        merged.write(line)
                merged.flush()
                os.fsync(merged.fileno())
        finally:
            for part in parts:
                part.close()


def _complete_summary(input_path: Path, out: Path, kind: str, group: Group,
                      started: float) -> dict[str, Any]:
    """The summary of a run that `resume` found already finished."""
    if kind == "npy":
        shape = np.load(out, mmap_mode="r").shape
        rows, dim = shape[0], (shape[1] if len(shape) == 2 else None)
    else:
        with open(out, "rb") as f:
            rows, dim = sum(1 for _ in f), None
    return {"out": str(out), "input": str(input_path), "kind": kind, "rows": rows, "dim": dim,
            "skipped": None, "problems": {}, "examples": [], "resumed_from": rows, "processed": 0,
            "seconds": round(time.monotonic() - started, 3), "rows_per_second": None,
            "world_size": group.world_size, "rank": group.rank, "already_complete": True}


def _json_default(value: Any) -> Any:
    """JSON for what `process` typically returns: numpy scalars and arrays, tensors, dataclasses."""
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):  # np.ndarray, torch.Tensor
        return value.tolist()
    raise TypeError(f"process returned a {type(value).__name__}, which has no JSON form; return "
                    "dicts, lists, strings and numbers")
