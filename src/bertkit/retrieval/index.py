"""A search index: a corpus' vectors, its documents, and the model that made the vectors.

`build_index(corpus, model, out_dir)` streams a corpus file (jsonl rows with `id` and `text`, or
txt: one document a line, its id the line number) through the inference engine into

  INDEX/vectors.npy    (N, H) float32, row i = document i (streamed, resumable: files.run_file)
  INDEX/docs.jsonl     {"id", "text"} of document i on line i
  INDEX/offsets.npy    (N + 1,) int64 byte offsets of docs.jsonl's lines: one document is read
                       without reading the others
  INDEX/index.json     written last: the model directory, its fingerprint (weights, config,
                       pooling files, tokenizer), pooling, rows, dim; a directory without it is
                       an unfinished index

Resume: a killed build resumed with `resume=True` continues the vectors after the rows done
(run_file verifies input, model fingerprint and settings first). The document store is rebuilt
on every start: one read of the corpus, small next to the model's work.

Queries must be embedded by the very model that made the vectors, or inner products mean
nothing: `model_fingerprint` ties the two, and `open_index(..., model=...)` refuses another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.fileio import atomic_path, atomic_write_json, check_writable_output, model_directory

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
VECTORS_FILE = "vectors.npy"
DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "offsets.npy"
INDEX_OUTPUTS = (INDEX_FILE, VECTORS_FILE, DOCS_FILE, OFFSETS_FILE)
FORMAT = 1
# Files of a model directory that decide its vectors, besides the tokenizer (hashed on its own).
MODEL_FILES = ("config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_EDGE_BYTES = 1 << 20  # weights: size + first and last MiB; hashing gigabytes on every query costs seconds


def model_fingerprint(model_dir: str | os.PathLike, tokenizer: Any = None) -> dict[str, str]:
    """{"model": hex digest of the config, pooling files and weights, "tokenizer": its
    fingerprint}. Two directories with equal fingerprints give the same vectors."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    for name in MODEL_FILES:
        path = root / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    weights = [root / name for name in WEIGHT_FILES if (root / name).is_file()]
    if not weights:
        raise FileNotFoundError(f"{root} has no weights ({' or '.join(WEIGHT_FILES)})")
    size = weights[0].stat().st_size
    with open(weights[0], "rb") as f:
        digest.update(f"{weights[0].name}:{size}".encode())
        digest.update(f.read(_EDGE_BYTES))
        f.seek(max(0, size - _EDGE_BYTES))
        digest.update(f.read(_EDGE_BYTES))
    if tokenizer is None:
        from bertkit.tokenizer import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(root)
    return {"model": digest.hexdigest()[:32], "tokenizer": tokenizer.fingerprint()}


def _engine(model: Any, **options: Any):
    from bertkit.inference import Engine

    if isinstance(model, Engine):
        return model
    return Engine.load(model_directory(model, "--model"), use="embed", **options)


def build_index(corpus: str | os.PathLike, model: Any, out_dir: str | os.PathLike, *,
                resume: bool = False, overwrite: bool = False, progress: bool = True,
                text_field: str = "text", id_field: str = "id", chunk_size: int = 1024,
                pooling: str | None = None, normalize: bool | None = None,
                **engine_options: Any) -> dict[str, Any]:
    """Embed every usable row of `corpus` with `model` (an Engine or a model dir) into `out_dir`.

    pooling / normalize: as `bertkit.inference.embed` (None: the model's own settings).
    engine_options: Engine.load options (precision, max_batch_tokens, max_length, device).
    Returns {"out", "rows", "dim", "skipped", "resumed_from", "seconds", "model"}.
    Raises FileExistsError for an existing index without resume / overwrite, ValueError for bad
    settings, a corpus without usable rows, duplicate ids, or a resume of another model.
    """
    from bertkit.inference import embed
    from bertkit.inference.embed import resolve_pooling
    from bertkit.inference.files import RecordReport, read_records, run_file

    started = time.monotonic()
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other; pass one")
    out = check_writable_output(out_dir, overwrite=None if resume else overwrite, kind="dir",
                                outputs=INDEX_OUTPUTS)
    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"no such corpus file: {corpus}" if not corpus.is_dir() else
                                f"corpus {corpus} is a directory; pass a .jsonl or .txt file")
    engine = _engine(model, **engine_options)
    if engine.model_dir is None:
        raise ValueError("an index records the model directory that made it; load the Engine "
                         "with Engine.load(model_dir)")
    mode, unit = resolve_pooling(engine, pooling, normalize)
    fingerprint = model_fingerprint(engine.model_dir, engine.tokenizer)

    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            from bertkit.inference.files import OutputFiles

            for leftover in OutputFiles(out / VECTORS_FILE).leftovers():
                leftover.unlink()
            for name in INDEX_OUTPUTS:
                (out / name).unlink(missing_ok=True)
        (out / INDEX_FILE).unlink(missing_ok=True)  # the index is unfinished until it is rewritten
        report = RecordReport(str(corpus))
        rows = _write_store(read_records(corpus, text_field=text_field, report=report), out, id_field)
        if report.n_skipped:
            log.warning("%s", report.summary())
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    settings = {"model": str(Path(engine.model_dir).resolve()), "fingerprint": fingerprint,
                "pooling": mode, "normalize": unit, "max_length": engine.max_length,
                "precision": engine.precision}
    summary = run_file(corpus, out / VECTORS_FILE,
                       lambda records: embed(engine, [r.text for r in records], pooling=mode,
                                             normalize=unit).numpy(),
                       kind="npy", dim=engine.config.hidden_size, chunk_size=chunk_size,
                       resume=resume, overwrite=False, progress=progress, settings=settings,
                       text_field=text_field, distributed=False, desc="documents")
    if summary["rows"] != rows:  # both passes read the same file; a change in between shows here
        raise ValueError(f"{corpus} changed while it was indexed ({rows} documents stored, "
                         f"{summary['rows']} vectors); index it again")
    meta = {"format": FORMAT, **settings, "rows": rows, "dim": engine.config.hidden_size,
            "corpus": str(corpus.resolve()), "text_field": text_field, "id_field": id_field,
            "skipped": summary["skipped"], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(out / INDEX_FILE, meta)
    return {"out": str(out), "rows": rows, "dim": meta["dim"], "skipped": summary["skipped"],
            "resumed_from": summary["resumed_from"], "model": settings["model"],
            "seconds": round(time.monotonic() - started, 3)}


def _write_store(records, out: Path, id_field: str) -> int:
    """docs.jsonl and offsets.npy from the records, atomically; returns the number of documents."""
    offsets = [0]
    seen: dict[str, int] = {}
    with atomic_path(out / DOCS_FILE) as tmp:
        with open(tmp, "wb") as f:
            for record in records:
                raw_id = record.extra.get(id_field)
                doc_id = str(raw_id) if raw_id is not None else str(record.line)
                if doc_id in seen:
                    raise ValueError(f"{out}: document id {doc_id!r} appears twice (lines "
                                     f"{seen[doc_id]} and {record.line}); ids must be unique")
                seen[doc_id] = record.line
                line = (json.dumps({"id": doc_id, "text": record.text}, ensure_ascii=False) + "\n").encode()
                f.write(line)
                offsets.append(offsets[-1] + len(line))
    with atomic_path(out / OFFSETS_FILE) as tmp:
        with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to the temp name
            np.save(f, np.asarray(offsets, dtype=np.int64), allow_pickle=False)
    return len(offsets) - 1


@dataclass
class Index:
    """An opened index: memory-mapped vectors and a lazily read document store."""

    path: Path
    meta: dict[str, Any]
    vectors: np.ndarray  # (N, H) float32, memory-mapped read-only
    offsets: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def document(self, i: int) -> dict[str, str]:
        """{"id", "text"} of document i (one seek and one read)."""
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} is outside the index's 0..{len(self) - 1}")
        with open(self.path / DOCS_FILE, "rb") as f:
            f.seek(int(self.offsets[i]))
            return json.loads(f.read(int(self.offsets[i + 1] - self.offsets[i])))

    def documents(self, rows: list[int]) -> list[dict[str, str]]:
        with open(self.path / DOCS_FILE, "rb") as f:
            out = []
            for i in rows:
                f.seek(int(self.offsets[i]))
                out.append(json.loads(f.read(int(self.offsets[i + 1] - self.offsets[i]))))
            return out

    def ids(self) -> list[str]:
        """Every document id in row order (reads the whole store once)."""
        with open(self.path / DOCS_FILE, encoding="utf-8") as f:
            return [json.loads(line)["id"] for line in f]

    def check_model(self, model_dir: str | os.PathLike, tokenizer: Any = None) -> None:
        """Refuse a query model whose vectors would not be comparable with the index's."""
        found = model_fingerprint(model_dir, tokenizer)
        saved = self.meta["fingerprint"]
        if found != saved:
            what = [k for k in ("model", "tokenizer") if found[k] != saved.get(k)]
            raise ValueError(f"index {self.path} was built with {self.meta['model']} "
                             f"({' and '.join(what)} fingerprint {saved[what[0]]}); the query model "
                             f"{model_dir} has {found[what[0]]}: its vectors live in another space. "
                             "Query with the index's model, or rebuild the index with `bertkit index`")


def open_index(path: str | os.PathLike) -> Index:
    """Open a finished index directory (read-only)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no index at {root} (not a directory); build one with `bertkit index`")
    meta_file = root / INDEX_FILE
    if not meta_file.is_file():
        raise ValueError(f"{root} is not a finished index (no {INDEX_FILE}); build it with "
                         "`bertkit index`, or continue a killed build with --resume")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_file}: index format {meta.get('format')!r}, this bertkit reads {FORMAT}")
    vectors = np.load(root / VECTORS_FILE, mmap_mode="r")
    offsets = np.load(root / OFFSETS_FILE)
    if vectors.shape != (meta["rows"], meta["dim"]) or len(offsets) != meta["rows"] + 1:
        raise ValueError(f"{root}: vectors {vectors.shape} / {len(offsets) - 1} documents do not "
                         f"match index.json ({meta['rows']} × {meta['dim']}); rebuild the index")
    return Index(root, meta, vectors, offsets)
