"""Each use over a file of any size, and `predict`: a fine-tuned directory over a file, by its head.

`run_use_on_file("embed", engine, "texts.jsonl", "vectors.npy")` streams the input, runs the
engine chunk by chunk and writes one ordered output (`.npy` for embeddings, else JSON Lines,
one object per usable input row with its source `line`); bad rows are named and skipped,
`resume=True` continues a killed run, and under torchrun the ranks split the input.

`predict_file(model_dir, input, out)` is the same path with the use and its settings taken from
the model: the use from its head (`tasks`), the lengths and columns from the finetune_config.json
that `bertkit finetune` wrote. It is `bertkit classify|ner|qa --input FILE --out FILE` with those
defaults, and reads the fine-tuning formats too: CoNLL and JSON Lines words for a tagger, SQuAD
JSON for a QA model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from bertkit.constants import FINETUNE_CONFIG
from bertkit.encoder import tasks
from bertkit.encoder.config import BertConfig
from bertkit.inference.engine import Engine
from bertkit.inference.files import FORMAT_SUFFIXES, FORMATS, RunFileConfig, run_file_job
from bertkit.inference.uses import USES, use_row
from bertkit.util.fileio import check_writable_output, model_directory

# An adapter's engine use → the predict task that reads its files (a cross-encoder is a classifier).
ADAPTER_TASKS = {"classify": "classify", "rerank": "classify", "ner": "ner", "qa": "qa"}


def output_kind(use: str, out_path: str | os.PathLike) -> str:
    """"npy" or "jsonl", what `use` writes to `out_path`, by its suffix: JSON Lines (.jsonl), or a
    NumPy array (.npy) for embed. Any other suffix is refused rather than filled with JSON Lines
    under a name that promises another format (a .csv, a .txt)."""
    suffix = Path(out_path).suffix.lower()
    npy = use_row(use).npy
    if suffix == ".npy":
        if not npy:
            writers = " / ".join(name for name, row in USES.items() if row.npy)
            raise ValueError(f"--out {out_path}: only {writers} writes .npy; give {use} a .jsonl output")
        return "npy"
    if suffix == ".jsonl":
        return "jsonl"
    kinds = "JSON Lines (.jsonl) or a NumPy array (.npy)" if npy else "JSON Lines (.jsonl)"
    raise ValueError(f"--out {out_path}: {use} writes {kinds}, not {suffix or 'a file without a suffix'}; "
                     f"name the output {Path(out_path).with_suffix('.jsonl').name}")


def run_use_on_file(use: str, engine: Engine, input_path: str | os.PathLike, out_path: str | os.PathLike,
                    *, text_field: str = "text", pair_field: str | None = None,
                    words_field: str | None = None, resume: bool = False, overwrite: bool = False,
                    progress: bool = True, chunk_size: int = 1024, fmt: str = "auto",
                    **options: Any) -> dict[str, Any]:
    """Run `use` over every usable row of `input_path` into `out_path`; returns run_file's summary.

    options: the use's own keyword arguments (pooling, top_k, targets, query, ...). They, the
    model and the precision are recorded, so `resume` refuses to continue with other settings.
    """
    row = use_row(use)
    if row.check_file is not None:
        row.check_file(pair_field, fmt)
    out = Path(out_path)
    kind = output_kind(use, out)
    settings = {"use": use, "model": str(Path(engine.model_dir).resolve()) if engine.model_dir else None,
                "precision": engine.precision, "max_length": engine.max_length,
                "truncate": engine.truncate, **options}
    config = RunFileConfig(input_path=input_path, out_path=out, kind=kind,
                           dim=(options.get("truncate_dim") or engine.config.hidden_size) if kind == "npy" else None,
                           chunk_size=chunk_size, resume=resume, overwrite=overwrite, progress=progress,
                           settings=settings, fmt=fmt, text_field=text_field, pair_field=pair_field,
                           words_field=words_field, desc=use)
    return run_file_job(config, row.chunk(engine, dict(options)))


# ---------------------------------------------------------------------------------------------
# predict: a fine-tuned directory over a file
# ---------------------------------------------------------------------------------------------
def predict_file(model_dir: str | os.PathLike, input_path: str | os.PathLike, out_path: str | os.PathLike,
                 *, task: str | None = None, max_length: int | None = None, doc_stride: int | None = None,
                 text_column: str | None = None, pair_column: str | None = None,
                 tokens_key: str | None = None, null_score_diff_threshold: float | None = None,
                 batch_size: int | None = None, device: str = "auto",
                 precision: str = "fp32", overwrite: bool = False, resume: bool = False,
                 progress: bool = True, fmt: str = "auto", adapter_dir: str | os.PathLike | None = None,
                 open_engine: Callable[..., Engine] | None = None) -> dict[str, Any]:
    """Run a fine-tuned directory over `input_path` into `out_path` (JSON Lines), by its head.

    adapter_dir, open_engine: a LoRA adapter run over `model_dir`, its base (`predict --model
      ADAPTER_DIR`, or `--adapter DIR`): the settings are the adapter's finetune_config.json's, the
      task its own use's (classify, ner or qa) unless one is given, and `open_engine(**options)`
      opens it (`bertkit.adapters.open_engine`, a room above this one).

    task: classify, pair, ner or qa; default: the task finetune_config.json records, else the one
      config.json's `architectures` names. Each setting left None comes from finetune_config.json
      (then the use's default): max_length (pieces per window), doc_stride (pieces between window
      starts), text_column / pair_column (classify: the columns; qa rows: question / context),
      tokens_key (ner JSON Lines: the list of words), null_score_diff_threshold (qa, SQuAD 2.0
      models: how far the [CLS] score must beat the best span's to answer "").
    fmt: the input's format (txt, jsonl, csv, tsv, conll, squad); "auto" tells it by the suffix.
    batch_size: windows per batch, as fine-tuning's evaluation counts them: the engine's token
      budget becomes batch_size × max_length (default: the engine's own, 8,192 tokens).
    Inputs and outputs (one JSON object per usable input row, with its source `line`):
      classify / pair: txt (a text a line), JSON Lines, CSV / TSV → {"label", "score", "scores"}
        or {"value"}; every window of a long text is read, probabilities averaged (as fine-tuning
        evaluates);
      ner: txt raw text → {"entities"} with character offsets; CoNLL (any suffix but .txt and
        .jsonl/.json) or JSON Lines words → {"tokens", "tags", "entities"};
      qa: SQuAD JSON (.json) → {"id", "answers"}; JSON Lines / CSV / TSV with question and context
        columns → {"answers"}.
    Returns the file job's summary (`files.run_file`), with the task, the engine's precision and
    length, and how many inputs it truncated.
    """
    out = check_writable_output(out_path, overwrite=None if resume else overwrite, kind="file")
    directory = model_directory(model_dir, "--model")
    saved = _finetune_settings(Path(adapter_dir) if adapter_dir is not None else directory)
    config = BertConfig.from_json(directory)
    value = lambda given, key, default=None: given if given is not None else saved.get(key, default)  # noqa: E731
    max_length = value(max_length, "max_length")
    options: dict[str, Any] = {"max_length": max_length} if max_length else {}
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        options["max_batch_tokens"] = batch_size * (max_length or config.max_sequence_length)
    engine = None
    if adapter_dir is not None:
        engine = open_engine(device=device, precision=precision, **options)
        task = task or saved.get("task") or ADAPTER_TASKS.get(engine.use)
    task = task or saved.get("task") or tasks.finetune_task_of(config)
    if task is None:
        raise ValueError(f"{adapter_dir or directory} has no {FINETUNE_CONFIG} and "
                         f"{'its use' if adapter_dir else 'its config.json'} names no task head; pass --task "
                         f"({', '.join(tasks.PREDICT_TASKS)})")
    if task not in tasks.PREDICT_TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(tasks.PREDICT_TASKS)}")
    use = tasks.FINETUNE_TASKS[task].use
    if engine is None:
        tasks.check_head(directory, config, task)
    elif ADAPTER_TASKS.get(engine.use, engine.use) != ADAPTER_TASKS.get(use, use):
        raise ValueError(f"{adapter_dir} is a {engine.use} adapter; predict --task {task} needs a {use} one "
                         f"(run it with `bertkit {engine.use}`)")
    output_kind(use, out)  # a .csv --out is refused before the model loads
    columns = {"text_column": text_column, "pair_column": pair_column, "tokens_key": tokens_key}
    if null_score_diff_threshold is not None:
        saved = {**saved, "null_score_diff_threshold": null_score_diff_threshold}
    fmt, reading, use_options = _predict_reading(task, Path(input_path), fmt, columns,
                                                 value(doc_stride, "doc_stride"), saved)
    if engine is None:
        engine = Engine.load(directory, use=use, device=device, precision=precision, **options)
    summary = run_use_on_file(use, engine, input_path, out, fmt=fmt, resume=resume, overwrite=overwrite,
                              progress=progress, **reading, **use_options)
    return {"task": task, "precision": engine.precision, "max_length": engine.max_length,
            "truncated": engine.stats.truncated, **summary}


def _predict_reading(task: str, path: Path, fmt: str, columns: dict[str, str | None], stride: int | None,
                     saved: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(format, reading fields, the use's options) of `predict_file` for a task and an input.
    fmt: the caller's format, or "auto" (by the suffix); columns: the caller's text_column /
    pair_column / tokens_key (None: as saved, or the default)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    suffix = FORMAT_SUFFIXES[fmt] if fmt != "auto" else path.suffix.lower()
    reading = use_row(tasks.FINETUNE_TASKS[task].use).predict_reading
    return reading(task, path, suffix, fmt, columns, stride, saved)


def _finetune_settings(directory: Path) -> dict[str, Any]:
    """The settings `bertkit finetune` recorded in the directory ({} for another model)."""
    path = directory / FINETUNE_CONFIG
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err}; fix or remove it") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path} is not a JSON object of settings; fix or remove it")
    return settings
