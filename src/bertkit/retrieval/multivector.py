"""The multi-vector side of an index: every passage as one vector per token, compressed, searched
by late interaction (MaxSim, `bertkit.inference.multivector`).

    INDEX/multivector/codes.npy       (T,) int32 each token's centroid (`residual`)
    INDEX/multivector/residuals.npy   (T, D · nbits / 8) uint8 its packed residual buckets
    INDEX/multivector/doclens.npy     (P,) int32 tokens of passage i (its tokens follow passage i − 1's)
    INDEX/multivector/centroids.npy, cutoffs.npy, bucket_weights.npy   the codec
    INDEX/multivector/ivf_ptr.npy, ivf_rows.npy   for centroid c, the passages rows[ptr[c]:ptr[c+1]]
                                      holding a token of it (CSR, passages ascending)
    INDEX/multivector/multivector.json   written last: kind (`token_vectors`), model and
                                      fingerprint, dim, nbits, centroids, tokens, rows

Search (PLAID's stages, Santhanam et al. 2022): each query token's `nprobe` nearest centroids
name the candidate passages (the inverted lists); the candidates are ranked by MaxSim over their
tokens' centroids alone (centroid interaction: one (Q, C) product, then a gather), and the best
`candidates` of them are scored exactly by MaxSim over their decompressed token vectors. The
scores are MaxSim's plain sum, as ColBERT ranks; `normalize` divides by the query's tokens (BGE-M3's
`colbert_score`), which the weighted fusion reads.

First stage, centroids against MUVERA's fixed dimensional encodings (Dhulipala et al. 2024): the
centroids are kept. `python bench/retrieval_multi.py --first-stage --docs 80 --queries 30`
(en-news-deep, MiniLM token states, 2026-12-07) measured the share of the exact MaxSim top 10
found among 64 candidates: centroids 0.993 at nprobe 2, 4 or 8 (767 centroids), MUVERA 0.917
(2,560 dimensions) and 0.947 (10,240); MUVERA was faster (1-2 ms a query against 15-28 ms, on a
loaded machine). At 256 candidates both found all, on a corpus of 295 passages: a
small set, so the choice rests on the recall at 64.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertkit.retrieval.index import MV_DIR, PASSAGES_FILE, model_fingerprint, passage_texts, recorded_model_dir
from bertkit.retrieval.residual import ResidualCodec
from bertkit.retrieval.store import save_npy
from bertkit.retrieval.token_vectors import token_vector_kind
from bertkit.util.fileio import atomic_write_json

MV_FILE = "multivector.json"
_TOKENS = ("codes", "residuals")
_CODEC = ("centroids", "cutoffs", "bucket_weights")
_BLOCK = 512  # passages encoded per engine call


def _encode_passages(kind: Any, engine: Any, texts: Sequence[str]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for lo in range(0, len(texts), _BLOCK):
        out.extend(kind.encode(engine, texts[lo:lo + _BLOCK], False))
    return out


def build_multivector(index_dir: str | os.PathLike, model: Any, *, kind: str = "token-states", nbits: int = 2,
                      centroids: int | None = None, seed: int = 0, codec: ResidualCodec | None = None,
                      **engine_options: Any) -> dict[str, Any]:
    """Encode every passage of the index at `index_dir` into INDEX/multivector/ (replacing one
    that is there). model: a dir or an Engine of the kind's use; codec: keep these centroids and
    buckets (an update) instead of training them. Returns {"rows", "tokens", "centroids", "seconds"}."""
    from bertkit.inference import Engine

    started = time.monotonic()
    root = Path(index_dir)
    if not (root / PASSAGES_FILE).is_file():
        raise ValueError(f"{root} is not an index (no {PASSAGES_FILE}); build it with `bertkit index` first")
    spec = token_vector_kind(kind)
    engine = model if isinstance(model, Engine) else spec.load(model, **engine_options)
    texts = [p["text"] for p in passage_texts(root / PASSAGES_FILE)]
    per_passage = _encode_passages(spec, engine, texts)  # [(T_i, D)]
    vectors = np.concatenate(per_passage).astype(np.float32)  # (T, D)
    if codec is None:
        codec = ResidualCodec.train(vectors, nbits=nbits, centroids=centroids, seed=seed)
    codes, residuals = codec.encode(vectors)
    doclens = np.array([len(v) for v in per_passage], dtype=np.int32)
    out = root / MV_DIR
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    arrays = {"codes": codes, "residuals": residuals, "doclens": doclens, **codec.arrays(),
              **inverted_lists(codes, doclens, len(codec.centroids))}
    for name, array in arrays.items():
        save_npy(out / f"{name}.npy", array)
    meta = {"kind": kind, "model": str(Path(engine.model_dir).resolve()),
            "fingerprint": model_fingerprint(engine.model_dir, engine.tokenizer), "max_length": engine.max_length,
            "dim": int(vectors.shape[1]), "nbits": codec.nbits, "centroids": int(len(codec.centroids)),
            "tokens": int(len(codes)), "rows": int(len(doclens)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(out / MV_FILE, meta)
    return {"rows": meta["rows"], "tokens": meta["tokens"], "centroids": meta["centroids"],
            "seconds": round(time.monotonic() - started, 3)}


def inverted_lists(codes: np.ndarray, doclens: np.ndarray, n_centroids: int) -> dict[str, np.ndarray]:
    """Centroid → the passages with a token assigned to it: ivf_ptr (C + 1,) int64, ivf_rows int32."""
    passage = np.repeat(np.arange(len(doclens), dtype=np.int64), doclens)  # (T,) passage of each token
    pairs = np.unique(codes.astype(np.int64) * len(doclens) + passage)  # distinct (centroid, passage), sorted
    cent, rows = pairs // max(len(doclens), 1), pairs % max(len(doclens), 1)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(cent, minlength=n_centroids))]).astype(np.int64)
    return {"ivf_ptr": ptr, "ivf_rows": rows.astype(np.int32)}


@dataclass
class MultiVectorIndex:
    """An index's multi-vector side, opened (arrays memory-mapped)."""

    path: Path
    meta: dict[str, Any]
    codec: ResidualCodec
    codes: np.ndarray  # (T,) int32
    residuals: np.ndarray  # (T, D · nbits / 8) uint8
    starts: np.ndarray  # (P + 1,) int64 first token of each passage
    ivf_ptr: np.ndarray
    ivf_rows: np.ndarray

    @classmethod
    def open(cls, index_dir: str | os.PathLike, rows: int | None = None) -> "MultiVectorIndex":
        path = Path(index_dir) / MV_DIR
        if not (path / MV_FILE).is_file():
            raise ValueError(f"index {index_dir} has no multi-vector side (no {MV_DIR}/{MV_FILE}); build the "
                             "index with `bertkit index ... --multi-vector`")
        meta = json.loads((path / MV_FILE).read_text(encoding="utf-8"))
        a = {n: np.load(path / f"{n}.npy", mmap_mode="r") for n in (*_TOKENS, "doclens", "ivf_ptr", "ivf_rows")}
        codec = ResidualCodec(*(np.load(path / f"{n}.npy") for n in _CODEC), nbits=meta["nbits"])
        if rows is not None and meta["rows"] != rows:
            raise ValueError(f"{path}: {meta['rows']} multi-vector passages for the index's {rows}; rebuild it "
                             "with `bertkit index ... --multi-vector --overwrite`")
        starts = np.concatenate([[0], np.cumsum(a["doclens"], dtype=np.int64)])
        if starts[-1] != meta["tokens"] or len(a["codes"]) != meta["tokens"]:
            raise ValueError(f"{path}: the token arrays do not match {MV_FILE}; rebuild the multi-vector side")
        return cls(path, meta, codec, a["codes"], a["residuals"], starts, a["ivf_ptr"], a["ivf_rows"])

    def memory_bytes(self) -> int:
        """Bytes of the compressed tokens, the codec and the inverted lists."""
        return int(self.codes.nbytes + self.residuals.nbytes + self.starts.nbytes + self.ivf_ptr.nbytes
                   + self.ivf_rows.nbytes + sum(a.nbytes for a in self.codec.arrays().values()))

    def token_rows(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(token positions (ΣT,) of passages `rows`, in order; their lengths (R,))."""
        rows = np.asarray(rows, dtype=np.int64)
        lo, lengths = self.starts[rows], self.starts[rows + 1] - self.starts[rows]
        return np.repeat(lo - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum()), lengths

    def passage_vectors(self, rows: Sequence[int]) -> list[np.ndarray]:
        """Decompressed (T_i, D) float32 unit token vectors of passages `rows` (one decode call)."""
        if not len(rows):
            return []
        tok, lengths = self.token_rows(rows)
        decoded = self.codec.decode(np.asarray(self.codes[tok]), np.asarray(self.residuals[tok]))  # (ΣT, D)
        return np.split(decoded, np.cumsum(lengths)[:-1])

    def exact_scores(self, query: np.ndarray, rows: Sequence[int], normalize: bool = False) -> np.ndarray:
        """(len(rows),) float32 MaxSim of `query` (Q, D) with each passage's decompressed tokens."""
        import torch

        from bertkit.inference.multivector import maxsim_packed

        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        tok, lengths = self.token_rows(rows)
        decoded = self.codec.decode(np.asarray(self.codes[tok]), np.asarray(self.residuals[tok]))  # (ΣT, D)
        return maxsim_packed(torch.from_numpy(np.asarray(query, np.float32)), torch.from_numpy(decoded),
                             torch.from_numpy(lengths), normalize=normalize).numpy()

    def candidates(self, query: np.ndarray, nprobe: int, n: int) -> np.ndarray:
        """The n best passage rows by centroid interaction among those a query token's nprobe
        nearest centroids reach (ascending rows)."""
        sims = query @ self.codec.centroids.T  # (Q, C)
        probe = np.argsort(-sims, axis=1)[:, :min(nprobe, sims.shape[1])]  # (Q, nprobe)
        lists = [np.asarray(self.ivf_rows[self.ivf_ptr[c]:self.ivf_ptr[c + 1]]) for c in np.unique(probe)]
        rows = np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int32)
        if len(rows) <= n:
            return rows.astype(np.int64)
        # MaxSim with every token replaced by its centroid: gather each candidate's token columns.
        tok, lengths = self.token_rows(rows)  # (ΣT,), (R,)
        cols = sims[:, np.asarray(self.codes[tok])]  # (Q, ΣT)
        # Each passage's tokens are contiguous and never empty ([CLS], [SEP]): a segment maximum.
        best = np.maximum.reduceat(cols, np.cumsum(lengths) - lengths, axis=1)  # (Q, R)
        approx = best.sum(0)  # (R,)
        keep = np.argpartition(-approx, n - 1)[:n]
        return np.sort(rows[keep]).astype(np.int64)

    def search(self, query: np.ndarray, k: int, *, nprobe: int = 4, candidates: int = 256,
               normalize: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """query (Q, D) → (scores (k',), rows (k',)) best first by exact MaxSim over the
        decompressed tokens of the best `candidates` by centroid interaction."""
        rows = self.candidates(np.asarray(query, np.float32), nprobe, max(k, candidates))
        s = self.exact_scores(np.asarray(query, np.float32), rows, normalize)
        order = np.lexsort((rows, -s))[:k]
        return s[order], rows[order]


@dataclass
class MultiVectorSearcher:
    """The multi-vector side with its query model loaded."""

    index: MultiVectorIndex
    engine: Any

    @classmethod
    def open(cls, index_dir: str | os.PathLike, rows: int | None = None, model: Any = None,
             dense_engine: Any = None, **engine_options: Any) -> "MultiVectorSearcher":
        """model: the side's query model (None: the one it was built with); dense_engine: the
        dense side's Engine, used as it is when the kind reads that engine and it is the same model."""
        from bertkit.inference import Engine

        side = MultiVectorIndex.open(index_dir, rows)
        spec = token_vector_kind(side.meta["kind"])
        if isinstance(model, Engine):
            engine = model
        elif (model is None and dense_engine is not None and spec.shares_dense_engine
              and str(Path(dense_engine.model_dir).resolve()) == side.meta["model"]
              and dense_engine.max_length == side.meta["max_length"]):
            engine = dense_engine
        else:
            model_dir = recorded_model_dir(model, side.meta["model"], "the multi-vector side", "--model")
            engine = spec.load(model_dir, max_length=side.meta["max_length"], **engine_options)
        found = model_fingerprint(engine.model_dir, engine.tokenizer)
        if found != side.meta["fingerprint"]:
            raise ValueError(f"index {index_dir}'s multi-vector side was built with {side.meta['model']}; the "
                             f"query model {engine.model_dir} differs (fingerprint {found['model']}): query with "
                             "the side's model, or rebuild it")
        return cls(side, engine)

    def encode(self, queries: Sequence[str]) -> list[np.ndarray]:
        """Each query's (Q_i, D) float32 token vectors."""
        return token_vector_kind(self.index.meta["kind"]).encode(self.engine, list(queries), True)


def update_multivector(old_dir: Path, new_dir: Path, old_rows: np.ndarray, engine_options: dict) -> None:
    """The multi-vector side of an updated index at `new_dir`: the kept passages' (`old_rows` of
    the index at `old_dir`, in their new order) compressed tokens copied, the new passages (the
    rows after them) encoded with the old side's model and codec (its centroids stay, as PLAID
    appends to an index)."""
    old = MultiVectorIndex.open(old_dir)
    spec = token_vector_kind(old.meta["kind"])
    engine = spec.load(old.meta["model"], max_length=old.meta["max_length"], **engine_options)
    texts = [p["text"] for p in passage_texts(new_dir / PASSAGES_FILE)]
    fresh = _encode_passages(spec, engine, texts[len(old_rows):])
    spans = [np.arange(old.starts[r], old.starts[r + 1]) for r in old_rows]
    kept = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    new_codes, new_res = old.codec.encode(np.concatenate(fresh)) if fresh else (
        np.zeros(0, np.int32), np.zeros((0, old.residuals.shape[1]), np.uint8))
    codes = np.concatenate([np.asarray(old.codes[kept]), new_codes]).astype(np.int32)
    residuals = np.concatenate([np.asarray(old.residuals[kept]), new_res])
    doclens = np.concatenate([np.diff(old.starts)[old_rows], [len(v) for v in fresh]]).astype(np.int32)
    out = new_dir / MV_DIR
    out.mkdir(exist_ok=True)
    arrays = {"codes": codes, "residuals": residuals, "doclens": doclens, **old.codec.arrays(),
              **inverted_lists(codes, doclens, len(old.codec.centroids))}
    for name, array in arrays.items():
        save_npy(out / f"{name}.npy", array)
    atomic_write_json(out / MV_FILE, {**old.meta, "tokens": int(len(codes)), "rows": int(len(doclens)),
                                      "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
