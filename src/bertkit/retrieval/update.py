"""Documents added, replaced or deleted by id in a finished index, whatever its backend.

`update_index(index_dir, upsert=CORPUS, delete=IDS)`: documents of CORPUS whose id the index
holds replace those documents, new ids are added at the end, and the ids in `delete` go. Only the
new documents' passages are embedded (with the index's model and passage settings); the other
vectors are copied. The updated index is made beside the old one (INDEX.update) and swapped in
with two renames, so a killed update leaves the old index as it was; the backend is rebuilt
from the new vectors (FAISS: a new file; a Qdrant server: its collection refilled, since rows are
renumbered; embedded Qdrant: nothing to do). Costs a pass over the vectors, not a re-embedding;
a sparse side (`sparse`), though, is encoded again whole with its own model, while a multi-vector
side (`multivector`) copies the kept passages' compressed tokens and encodes only the new ones
(with its centroids as they were).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from bertkit.retrieval import backends
from bertkit.retrieval.index import (
    BM25_DIR,
    INDEX_FILE,
    VECTORS_FILE,
    open_index,
    passage_splitter,
    passage_texts,
    passage_vectors,
)
from bertkit.retrieval.multivector import MV_DIR, MV_FILE, update_multivector
from bertkit.retrieval.sparse import SPARSE_DIR, SPARSE_FILE, SparseIndex, build_sparse
from bertkit.retrieval.store import DOCS_FILE, OFFSETS_FILE, PASSAGES_FILE, read_lines, save_npy, write_store
from bertkit.util.fileio import atomic_write_json


class _Doc:
    """The shape of a `read_records` Record that `write_store` reads."""

    def __init__(self, line: int, doc_id: str, text: str):
        self.line, self.text, self.extra = line, text, {"id": doc_id}


def update_index(index_dir: str | os.PathLike, *, upsert: str | os.PathLike | None = None,
                 delete: Iterable[str] = (), text_field: str = "text", id_field: str = "id",
                 **engine_options: Any) -> dict[str, Any]:
    """Upsert the documents of `upsert` (a corpus file, as `build_index` reads) and delete the ids
    in `delete`. Returns {"out", "documents", "rows", "added", "replaced", "deleted", "seconds"}.
    Raises ValueError for an id to delete that the index does not hold (nothing is changed)."""
    from bertkit.inference import Engine
    from bertkit.inference.files import RecordReport, read_records

    started = time.monotonic()
    index = open_index(index_dir)
    meta = dict(index.meta)
    if meta.get("format") != 2:
        raise ValueError(f"{index.path} is a format-{meta.get('format')} index; rebuild it with `bertkit index` "
                         "to update it")
    delete = [str(i) for i in delete]
    ids = index.ids()
    missing = sorted(set(delete) - set(ids))
    if missing:
        raise ValueError(f"cannot delete {', '.join(map(repr, missing[:5]))}: not in index {index.path}")
    if not os.path.isdir(meta["model"]):
        raise FileNotFoundError(f"the index's model {meta['model']} is not there any more; rebuild the index")
    engine = Engine.load(meta["model"], use="embed", max_length=meta["max_length"], **engine_options)
    index.check_model(engine.model_dir, engine.tokenizer)
    new: dict[str, str] = {}
    if upsert is not None:
        report = RecordReport(str(upsert))
        for record in read_records(upsert, text_field=text_field, report=report):
            raw = record.extra.get(id_field)
            doc_id = str(raw) if raw is not None else str(record.line)
            if doc_id in new:
                raise ValueError(f"{upsert}:{record.line}: document id {doc_id!r} appears twice")
            new[doc_id] = record.text
    gone = set(delete) | set(new)
    keep = [r for r, i in enumerate(ids) if i not in gone]
    kept_docs = index.documents(keep)

    def records():
        for row, d in zip(keep, kept_docs):
            yield _Doc(row + 1, d["id"], d["text"])
        for n, (doc_id, text) in enumerate(new.items()):
            yield _Doc(len(ids) + n + 1, doc_id, text)

    settings = meta["passages"]
    tmp = index.path.with_name(index.path.name + ".update")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed update's leftovers: ours to remove
    tmp.mkdir()
    try:
        split = passage_splitter(engine.tokenizer, settings["tokens"], settings["overlap"],
                                 settings["late_chunking"], meta["max_length"] - 2)
        documents, rows = write_store(records(), tmp, "id", split)
        new_map = np.load(tmp / "passages.npy")
        first = np.searchsorted(index.passages[:, 0], np.arange(len(ids) + 1))  # passages are in doc order
        old_rows = np.concatenate([np.arange(first[r], first[r + 1]) for r in keep] or [np.empty(0, np.int64)])
        n_old = len(old_rows)
        if n_old and not np.array_equal(new_map[:n_old, 1:], index.passages[old_rows, 1:]):
            raise ValueError(f"{index.path}: the kept documents no longer split as they did (tokenizer "
                             "changed?); rebuild the index")
        fresh = [r for i, r in enumerate(_passage_records(tmp / PASSAGES_FILE)) if i >= n_old]
        offsets = np.load(tmp / OFFSETS_FILE)
        added = (passage_vectors(engine, fresh, meta["pooling"], meta["normalize"], settings["late_chunking"],
                                 lambda rs: [d["text"] for d in read_lines(tmp / DOCS_FILE, offsets, rs)])
                 if fresh else np.empty((0, meta["dim"]), np.float32))
        vectors = np.concatenate([np.asarray(index.vectors[old_rows], np.float32), added]).astype(np.float32)
        save_npy(tmp / VECTORS_FILE, vectors)
        info = dict(meta["backend"])
        name = info.pop("name")
        info.pop("build_seconds", None)
        built = backends.build(name, tmp, np.load(tmp / VECTORS_FILE, mmap_mode="r"), info, recreate=True)
        if meta.get("bm25"):
            from bertkit.retrieval.bm25 import BM25

            BM25.fit((p["text"] for p in passage_texts(tmp / PASSAGES_FILE)),
                     cjk=meta.get("bm25_cjk", "bigram")).save(tmp / BM25_DIR)
        if (index.path / SPARSE_DIR / SPARSE_FILE).is_file():  # the sparse side, re-encoded with its own model
            side = SparseIndex.open(index.path).meta
            build_sparse(tmp, side["model"], top_k=side["top_k"], progress=False, **engine_options)
        if (index.path / MV_DIR / MV_FILE).is_file():  # kept passages' tokens copied, new ones encoded
            update_multivector(index.path, tmp, old_rows, engine_options)
        meta.update(rows=rows, documents=documents, backend=built,
                    updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        atomic_write_json(tmp / INDEX_FILE, meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = index.path.with_name(index.path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(index.path, old)
    os.rename(tmp, index.path)
    shutil.rmtree(old, ignore_errors=True)
    return {"out": str(index.path), "documents": documents, "rows": rows,
            "added": len(set(new) - set(ids)), "replaced": len(set(new) & set(ids)), "deleted": len(delete),
            "seconds": round(time.monotonic() - started, 3)}


def _passage_records(path: Path):
    from bertkit.inference.files import Record

    for n, row in enumerate(passage_texts(path), start=1):
        yield Record(n, row.pop("text"), extra=row)
