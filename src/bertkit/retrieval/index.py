"""A search index: a corpus' passages, their vectors, and the model that made the vectors.

`build_index(corpus, model, out_dir)` reads a corpus file (jsonl rows with `id` and `text`, or
txt: one document a line, its id the line number), cuts each document into passages by the
model's own tokenizer (`passages`), and streams the passages through the inference engine into

  INDEX/docs.jsonl, offsets.npy, passages.jsonl, passages.npy   the text side (`store`)
  INDEX/vectors.npy    (P, H) float32, row i = passage i (streamed, resumable: files.run_file)
  INDEX/faiss.index    the FAISS structure, for the faiss backends (`backends`)
  INDEX/codes.npy      int8 or binary codes of the vectors, ranges.npy their int8 ranges (`quantize`)
  INDEX/bm25/          the BM25 index of the same passages (`bm25`), for hybrid search
  INDEX/index.json     written last: the model directory, its fingerprint (weights, config,
                       pooling files, tokenizer), pooling, the passage settings, the backend and
                       its parameters, rows; a directory without it is an unfinished index

Resume: a killed build resumed with `resume=True` continues the vectors after the rows done
(run_file verifies input, model fingerprint and settings first), then builds the backend.

Queries must be embedded by the very model that made the vectors, or inner products mean
nothing: `model_fingerprint` ties the two, and `Index.check_model` refuses another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.retrieval import backends
from bertkit.retrieval.passages import embed_late, late_chunk_windows, split_passages, tokenize_documents
from bertkit.retrieval.quantize import CODES_FILE, RANGES_FILE
from bertkit.retrieval.store import DOCS_FILE, OFFSETS_FILE, PASSAGE_MAP_FILE, PASSAGES_FILE, read_lines, write_store
from bertkit.util.fileio import atomic_write_json, check_writable_output, model_directory

log = logging.getLogger(__name__)

INDEX_FILE = "index.json"
VECTORS_FILE = "vectors.npy"
BM25_DIR = "bm25"
MV_DIR = "multivector"  # the multi-vector side (`multivector`), built beside the index
INDEX_OUTPUTS = (INDEX_FILE, VECTORS_FILE, DOCS_FILE, OFFSETS_FILE, PASSAGES_FILE, PASSAGE_MAP_FILE,
                 backends.FAISS_FILE, BM25_DIR, CODES_FILE, RANGES_FILE, MV_DIR)
FORMAT = 2  # 1: one vector per document, no passages (still read)
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
        from bertkit.data.tokenizer import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(root)
    return {"model": digest.hexdigest()[:32], "tokenizer": tokenizer.fingerprint()}


def recorded_model_dir(model: str | os.PathLike | None, recorded: str, owner: str, flag: str) -> str | os.PathLike:
    """The model directory a query loads: `model` when given, else the one `owner` ("the index",
    "the sparse side") recorded; FileNotFoundError naming it and the fix when it is gone."""
    model_dir = model if model is not None else recorded
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{owner}'s model {model_dir} is not there any more; pass {flag} with "
                                f"the same model, or rebuild {owner}")
    return model_dir


def _engine(model: Any, **options: Any):
    from bertkit.inference import Engine

    if isinstance(model, Engine):
        return model
    return Engine.load(model_directory(model, "--model"), use="embed", **options)


@dataclass
class IndexConfig:
    """Every setting of `build_index`; what decides the vectors is written to INDEX/index.json."""

    corpus: str | os.PathLike  # jsonl rows with an id and a text, or txt: one document a line
    model: Any  # an Engine, or a model directory loaded for the "embed" use
    out_dir: str | os.PathLike  # INDEX: the files listed in the module docstring
    resume: bool = False  # continue a killed build after the vectors already written
    overwrite: bool = False  # start over in an existing INDEX (removes only the index's own files)
    progress: bool = True  # a tqdm bar of passages
    text_field: str = "text"  # jsonl: the column holding a document's text
    id_field: str = "id"  # jsonl: the column holding a document's id (txt: the line number)
    # Passages per engine call (run_file's chunk): room for the engine's length sorting, a few MB.
    chunk_size: int = 1024
    pooling: str | None = None  # as `bertkit.inference.embed`; None = the model's own pooling
    normalize: bool | None = None  # unit vectors; None = as the model's pooling says
    # Pieces per passage. None = the model's length − 2, so that a document longer than the model
    # reads becomes several passages instead of losing its end; 0 = whole documents, truncated at
    # the model's length (counted and logged).
    passage_tokens: int | None = None
    passage_overlap: int = 0  # pieces shared by neighbouring passages; 0 = cut exactly
    # Pool each passage from the token states of a window of its neighbours (`passages`), so a
    # passage's vector sees its context; mean pooling only.
    late_chunking: bool = False
    # "exact" | "faiss-hnsw" (or "faiss") | "faiss-ivfpq" | "qdrant" (`backends`): exact search
    # needs no extra library and is fast enough up to about a million passages.
    backend: str = "exact"
    # over `backends.default_params`, e.g. {"M": 16}; the exact backend's {"vector_dtype": "int8"
    # or "binary", "rescore_multiplier": m} searches codes (`quantize`)
    backend_params: dict[str, Any] = field(default_factory=dict)
    bm25: bool = True  # also index the same passages for BM25, so hybrid search works on any index
    bm25_cjk: str = "bigram"  # BM25's Chinese / Japanese tokens: character bigrams, or "jieba"'s words
    # Engine.load options when model is a directory (precision, max_batch_tokens, max_length, device).
    engine_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.backend_params = dict(self.backend_params or {})
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming a bad value and the fix (the model's limits are checked on load)."""
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other; pass one")
        if not isinstance(self.chunk_size, int) or self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")
        from bertkit.retrieval.bm25 import check_cjk

        check_cjk(self.bm25_cjk)
        if self.passage_overlap < 0:
            raise ValueError(f"--passage-overlap {self.passage_overlap} must be 0 or more pieces")


def build_index(corpus: str | os.PathLike, model: Any, out_dir: str | os.PathLike, **settings: Any) -> dict[str, Any]:
    """`run_build_index` of an `IndexConfig` made of these arguments. settings: any other of its
    fields (passage_tokens, late_chunking, backend, bm25, ...); the rest are Engine.load options
    (precision, max_batch_tokens, max_length, device)."""
    names = {f.name for f in fields(IndexConfig)}
    engine_options = {k: v for k, v in settings.items() if k not in names}
    known = {k: v for k, v in settings.items() if k in names}
    return run_build_index(IndexConfig(corpus=corpus, model=model, out_dir=out_dir,
                                       engine_options={**known.pop("engine_options", {}), **engine_options},
                                       **known))


def run_build_index(config: IndexConfig) -> dict[str, Any]:
    """Embed every usable row of `config.corpus` with `config.model` into `config.out_dir`.

    Returns {"out", "documents", "rows" (passages), "dim", "skipped", "resumed_from", "seconds",
    "model", "backend"}.
    Raises FileExistsError for an existing index without resume / overwrite, ValueError for bad
    settings, a corpus without usable rows, duplicate ids, or a resume of another model;
    ValueError naming the extra for a backend whose library is missing; ConnectionError for a
    server that does not answer (before anything is written).
    """
    from bertkit.inference.embed import resolve_pooling
    from bertkit.inference.files import RecordReport, RunFileConfig, read_records, run_file_job

    started = time.monotonic()
    backend = backends.resolve_backend(config.backend)
    params_override = dict(config.backend_params)
    backends.check_vector_dtype(backend, params_override)
    if backend.startswith("faiss"):
        backends.import_faiss()
    elif backend == "qdrant":
        backends.import_qdrant()
        if params_override.get("url"):
            backends.qdrant_client_for(params_override)  # a server that does not answer: fail now
    out = check_writable_output(config.out_dir, overwrite=None if config.resume else config.overwrite,
                                kind="dir", outputs=INDEX_OUTPUTS)
    corpus = Path(config.corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"no such corpus file: {corpus}" if not corpus.is_dir() else
                                f"corpus {corpus} is a directory; pass a .jsonl or .txt file")
    engine = _engine(config.model, **config.engine_options)
    if engine.model_dir is None:
        raise ValueError("an index records the model directory that made it; load the Engine "
                         "with Engine.load(model_dir)")
    mode, unit = resolve_pooling(engine, config.pooling, config.normalize)
    room = engine.max_length - 2  # pieces a sequence holds besides [CLS] and [SEP]
    passage_tokens = room if config.passage_tokens is None else config.passage_tokens
    if passage_tokens < 0 or passage_tokens > room:
        raise ValueError(f"--passage-tokens {passage_tokens} must be in 1..{room} (the model reads "
                         f"{engine.max_length} pieces with [CLS] and [SEP]), or 0 for whole documents")
    if passage_tokens == 0 and config.late_chunking:
        raise ValueError("--late-chunking pools passages; pass --passage-tokens N (not 0)")
    if config.late_chunking and mode != "mean":
        raise ValueError(f"--late-chunking pools each passage's token states by their mean; this "
                         f"model pools by {mode} (pass --pooling mean to use it anyway)")
    fingerprint = model_fingerprint(engine.model_dir, engine.tokenizer)

    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if config.overwrite:
            from bertkit.inference.files import OutputFiles

            for leftover in OutputFiles(out / VECTORS_FILE).leftovers():
                leftover.unlink()
            for name in INDEX_OUTPUTS:
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        (out / INDEX_FILE).unlink(missing_ok=True)  # the index is unfinished until it is rewritten
        report = RecordReport(str(corpus))
        records = read_records(corpus, text_field=config.text_field, report=report)
        docs, rows = write_store(records, out, config.id_field,
                                 passage_splitter(engine.tokenizer, passage_tokens, config.passage_overlap,
                                                  config.late_chunking, room), resume=config.resume)
        if report.n_skipped:
            log.warning("%s", report.summary())
        if rows == 0:
            raise ValueError(f"{corpus}: no document has any text to index")
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    settings = {"model": str(Path(engine.model_dir).resolve()), "fingerprint": fingerprint,
                "pooling": mode, "normalize": unit, "max_length": engine.max_length,
                "precision": engine.precision,
                "passages": {"tokens": passage_tokens, "overlap": config.passage_overlap if passage_tokens else 0,
                             "late_chunking": config.late_chunking}}
    doc_offsets = np.load(out / OFFSETS_FILE)

    def vectors_of(records):
        return passage_vectors(engine, records, mode, unit, config.late_chunking,
                               lambda rows: [d["text"] for d in read_lines(out / DOCS_FILE, doc_offsets, rows)])

    truncated_before = engine.stats.truncated
    vectors_job = RunFileConfig(input_path=out / PASSAGES_FILE, out_path=out / VECTORS_FILE, kind="npy",
                                dim=engine.config.hidden_size, chunk_size=config.chunk_size,
                                resume=config.resume, overwrite=False, progress=config.progress,
                                settings=settings, distributed=False, desc="passages")
    summary = run_file_job(vectors_job, vectors_of)
    if summary["rows"] != rows:  # both read the same file; a change in between shows here
        raise ValueError(f"{out / PASSAGES_FILE} changed while it was indexed ({rows} passages stored, "
                         f"{summary['rows']} vectors); index it again")
    vectors = np.load(out / VECTORS_FILE, mmap_mode="r")
    params = {**backends.default_params(backend, rows, engine.config.hidden_size), **params_override}
    built = backends.build(backend, out, vectors, params)
    if config.bm25:
        from bertkit.retrieval.bm25 import BM25

        texts = (p["text"] for p in passage_texts(out / PASSAGES_FILE))
        BM25.fit(texts, cjk=config.bm25_cjk).save(out / BM25_DIR)
    meta = {"format": FORMAT, **settings, "rows": rows, "documents": docs, "dim": engine.config.hidden_size,
            "backend": built, "bm25": config.bm25, "bm25_cjk": config.bm25_cjk,
            "truncated": engine.stats.truncated - truncated_before,
            "corpus": str(corpus.resolve()), "text_field": config.text_field, "id_field": config.id_field,
            "skipped": report.n_skipped, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(out / INDEX_FILE, meta)
    return {"out": str(out), "documents": docs, "rows": rows, "dim": meta["dim"],
            "skipped": report.n_skipped, "resumed_from": summary["resumed_from"],
            "model": settings["model"], "backend": backend, "truncated": meta["truncated"],
            "seconds": round(time.monotonic() - started, 3)}


def passage_vectors(engine: Any, records: list, mode: str, unit: bool, late_chunking: bool,
                    doc_texts: Any) -> np.ndarray:
    """(len(records), H) float32 vectors of passage records (rows of passages.jsonl as Records).
    doc_texts: document rows → their texts (late chunking re-reads each window's pieces)."""
    from bertkit.inference import embed

    if not late_chunking:
        return embed(engine, [r.text for r in records], pooling=mode, normalize=unit).numpy()
    doc_rows = sorted({r.extra["doc"] for r in records})
    pieces = dict(zip(doc_rows, (ids for ids, _, _ in tokenize_documents(engine.tokenizer, doc_texts(doc_rows)))))
    items = [(pieces[r.extra["doc"]][r.extra["w0"]:r.extra["w1"]], r.extra["t0"] - r.extra["w0"],
              r.extra["t1"] - r.extra["w0"]) for r in records]
    return embed_late(engine, items, unit).numpy()


def passage_texts(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def passage_splitter(tokenizer: Any, passage_tokens: int, overlap: int, late: bool, room: int):
    """texts → each text's passages as dicts (see `store.write_store`)."""
    def whole(texts):
        return [[{"start": 0, "end": len(t)}] for t in texts]

    def split(texts):
        out = []
        for text, (_, offsets, word_starts) in zip(texts, tokenize_documents(tokenizer, texts)):
            parts = split_passages(text, offsets, word_starts, passage_tokens, overlap)
            if not late:
                out.append([{"start": p.start, "end": p.end} for p in parts])
                continue
            windows = late_chunk_windows(parts, room)
            out.append([{"start": p.start, "end": p.end, "t0": p.t0, "t1": p.t1, "w0": w0, "w1": w1}
                        for p, (w0, w1) in zip(parts, windows)])
        return out

    return whole if passage_tokens == 0 else split


@dataclass
class Index:
    """An opened index: memory-mapped vectors, the passage → document map, a lazily read store."""

    path: Path
    meta: dict[str, Any]
    vectors: np.ndarray  # (P, H) float32, memory-mapped read-only; row i = passage i
    offsets: np.ndarray  # (D + 1,) int64 byte offsets of docs.jsonl's lines
    passages: np.ndarray  # (P, 3) int64: document row, character start, end (-1: the document's end)

    def __len__(self) -> int:
        """Documents in the index."""
        return len(self.offsets) - 1

    def document(self, i: int) -> dict[str, str]:
        """{"id", "text"} of document i (one seek and one read)."""
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} is outside the index's 0..{len(self) - 1}")
        return self.documents([i])[0]

    def documents(self, rows: list[int]) -> list[dict[str, str]]:
        return read_lines(self.path / DOCS_FILE, self.offsets, rows)

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

    def open_backend(self, **overrides: Any) -> "backends.Backend":
        """The search structure this index was built with (overrides: e.g. a Qdrant url)."""
        info = dict(self.meta.get("backend") or {"name": "exact"})
        name = info.pop("name")
        info.pop("build_seconds", None)
        return backends.Backend(name, self.path, self.vectors, {**info, **overrides})


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
    if meta.get("format") not in (1, FORMAT):
        raise ValueError(f"{meta_file}: index format {meta.get('format')!r}, this bertkit reads 1 and {FORMAT}")
    vectors = np.load(root / VECTORS_FILE, mmap_mode="r")
    offsets = np.load(root / OFFSETS_FILE)
    if meta["format"] == 1:  # one passage per document: the whole of it
        n = len(offsets) - 1
        passages = np.stack([np.arange(n), np.zeros(n, np.int64), np.full(n, -1)], axis=1)
    else:
        passages = np.load(root / PASSAGE_MAP_FILE)
    if vectors.shape != (meta["rows"], meta["dim"]) or len(passages) != meta["rows"]:
        raise ValueError(f"{root}: vectors {vectors.shape} / {len(passages)} passages do not "
                         f"match index.json ({meta['rows']} × {meta['dim']}); rebuild the index")
    return Index(root, meta, vectors, offsets, passages)
