"""`bertkit embed --input FILE --out OUT --passage-tokens N`: every document of a file embedded in
passages, one output row per passage, none of it truncated.

Two passes, each streamed and safe to kill:

1. the documents are cut by the model's own tokenizer (`passages.split_passages`: sentence-aware,
   optional overlap) into `OUT`'s passage file, `OUT.passages.jsonl` beside it: one row per
   passage, {"text", "line" (the document's line in the input), "id" (the document's, if it has
   one), "doc" (the document's number among the usable rows, from 0), "passage" (its number in the
   document, from 0), "start", "end" (its characters in the document: text[start:end])}. It is
   written aside and moved into place at the end; a resumed run makes it again and must get the
   same bytes (else: refused, naming the change).
2. that file goes through the same file job as every use (`inference.files.run_file`: chunked,
   resumable, one ordered output): `.npy` → (passages, H), row i = the passage file's row i;
   `.jsonl` → one object per passage: its document's `line` and `id`, `doc`, `passage`, `start`,
   `end`, and the vector as `result` (as `bertkit embed` writes whole texts).

A passage holds at most N pieces, N ≤ the model's length − 2 − the prompt's pieces, so every piece
of every document is read; the file job's summary counts any input the engine still had to cut
(`truncated`), which the passage budget keeps at 0.

Late chunking (`bertkit index --late-chunking`) is not offered here: it pools each passage from a
window of its document's token states, and the file job streams passages, not documents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bertkit.retrieval.passages import split_passages, tokenize_documents
from bertkit.retrieval.store import keep_if_same
from bertkit.util.fileio import check_writable_output

__all__ = ["embed_passages_file", "passages_path"]

BLOCK = 256  # documents tokenized together


def passages_path(out: str | os.PathLike) -> Path:
    """The passage file beside OUT: vectors.npy → vectors.npy.passages.jsonl."""
    out = Path(out)
    return out.with_name(out.name + ".passages.jsonl")


def write_passage_file(input_path: Path, path: Path, tokenizer: Any, passage_tokens: int, overlap: int,
                       *, fmt: str, text_field: str, resume: bool) -> dict[str, int]:
    """Pass 1 (see the module docstring); returns {"documents", "passages", "skipped", "empty"}."""
    from bertkit.inference.files import RecordReport, read_records

    report = RecordReport(str(input_path))
    new = path.with_name(path.name + ".new")
    counts = {"documents": 0, "passages": 0, "empty": 0}
    try:
        with open(new, "w", encoding="utf-8") as f:
            block: list[Any] = []

            def flush() -> None:
                for record, (_, offsets, starts) in zip(block, tokenize_documents(tokenizer, [r.text for r in block])):
                    parts = split_passages(record.text, offsets, starts, passage_tokens, overlap)
                    counts["empty"] += not parts  # no pieces at all (control characters only)
                    for n, p in enumerate(parts):
                        row = {"text": record.text[p.start:p.end], "line": record.line}
                        if "id" in record.extra:
                            row["id"] = record.extra["id"]
                        row.update(doc=counts["documents"], passage=n, start=p.start, end=p.end)
                        f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    counts["documents"] += 1
                    counts["passages"] += len(parts)
                block.clear()

            for record in read_records(input_path, fmt=fmt, text_field=text_field, report=report):
                block.append(record)
                if len(block) == BLOCK:
                    flush()
            flush()
    except BaseException:
        new.unlink(missing_ok=True)
        raise
    if counts["passages"] == 0:
        new.unlink()
        raise ValueError(f"{input_path}: no document has any text to embed ({report.summary()})")
    if not keep_if_same(new, path, must_match=resume):
        raise ValueError(f"cannot resume: {path} differs from the passages this input, tokenizer and "
                         "passage settings give; resume with the original ones, or pass --overwrite")
    return {**counts, "skipped": report.n_skipped}


def embed_passages_file(engine: Any, input_path: str | os.PathLike, out_path: str | os.PathLike, *,
                        passage_tokens: int, passage_overlap: int = 0, text_field: str = "text",
                        fmt: str = "auto", resume: bool = False, overwrite: bool = False,
                        progress: bool = True, chunk_size: int = 1024, pooling: str | None = None,
                        normalize: bool | None = None, prompt: str = "",
                        truncate_dim: int | None = None) -> dict[str, Any]:
    """Embed every document of `input_path` in passages of at most `passage_tokens` pieces into
    `out_path` (.npy or .jsonl) and its passage file (`passages_path`); see the module docstring.

    pooling, normalize, prompt, truncate_dim: as `bertkit.inference.embed`.
    Returns the file job's summary (rows: passages) with documents, passages_file, truncated.
    Raises ValueError for a passage budget the model cannot read, under torchrun (one process
    writes the passage file), or for a resume whose passages changed; FileExistsError for an
    existing output or passage file without resume / overwrite.
    """
    from bertkit.inference import embed
    from bertkit.inference.files import record_format, run_file
    from bertkit.inference.jobs import output_kind

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("--passage-tokens runs in one process (it writes the passage file first); "
                         "run it without torchrun")
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other; pass one")
    out, input_path = Path(out_path), Path(input_path)
    kind = output_kind("embed", out)
    side = passages_path(out)
    check_writable_output(out, overwrite=None if resume else overwrite)
    check_writable_output(side, overwrite=None if resume else overwrite, flag="--out (its passage file)")
    if not input_path.is_file():
        raise FileNotFoundError(f"no such input file: {input_path}")
    prompt_pieces = len(engine.tokenizer.encode_raw([prompt])[0].ids) - 2 if prompt else 0
    room = engine.max_length - 2 - prompt_pieces
    if not 1 <= passage_tokens <= room:
        besides = f"[CLS], [SEP] and the prompt's {prompt_pieces}" if prompt_pieces else "[CLS] and [SEP]"
        raise ValueError(f"--passage-tokens {passage_tokens} must be in 1..{room} (the model reads "
                         f"{engine.max_length} pieces with {besides})")
    if not 0 <= passage_overlap < passage_tokens:
        raise ValueError(f"--passage-overlap {passage_overlap} must be in 0..{passage_tokens - 1}")
    fmt = record_format(input_path, fmt)
    counts = write_passage_file(input_path, side, engine.tokenizer, passage_tokens, passage_overlap, fmt=fmt,
                                text_field=text_field, resume=resume)
    options = dict(pooling=pooling, normalize=normalize, prompt=prompt, truncate_dim=truncate_dim)

    def process(records):
        vectors = embed(engine, [r.text for r in records], **options).numpy()
        if kind == "npy":
            return vectors
        return [{"doc": r.extra["doc"], "passage": r.extra["passage"], "start": r.extra["start"],
                 "end": r.extra["end"], "result": v} for r, v in zip(records, vectors)]

    from bertkit.inference.files import input_fingerprint

    settings = {"use": "embed", "model": str(Path(engine.model_dir).resolve()) if engine.model_dir else None,
                "precision": engine.precision, "max_length": engine.max_length, "documents": input_fingerprint(
                    input_path), "passage_tokens": passage_tokens, "passage_overlap": passage_overlap,
                **options}
    truncated = engine.stats.truncated
    summary = run_file(side, out, process, kind=kind, dim=(truncate_dim or engine.config.hidden_size)
                       if kind == "npy" else None, chunk_size=chunk_size, resume=resume, overwrite=overwrite,
                       progress=progress, settings=settings, fmt="jsonl", text_field="text",
                       distributed=False, desc="passages", line_field="line")
    return {**summary, "input": str(input_path), "skipped": counts["skipped"], "documents": counts["documents"],
            "documents_without_text": counts["empty"], "passages_file": str(side),
            "truncated": engine.stats.truncated - truncated}
