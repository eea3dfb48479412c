"""Exact inner-product search over an index, in chunks, and optional cross-encoder reranking.

`top_k_inner_product(vectors, queries, k)` scores every document (no approximation) while
holding at most `budget` scores in memory at a time: queries go in groups and documents in
chunks of rows (a memory-mapped (N, H) array is read chunk by chunk), and a running top-k per
query is merged after each chunk. With the default budget (2**22 scores, 16 MiB) a million
documents × 32 queries stays under ~60 MiB whatever N is.

`search(index_dir, queries, ...)` embeds the queries with the index's own model (another model
is refused: its vectors live in another space), retrieves `candidates` documents per query and,
with `rerank=CROSS_ENCODER`, orders those by the cross-encoder's scores and keeps `top_k`.
`rerank_weight` below 1 orders them by a mix of both stages instead (`fuse_scores`): on the BBC
set a bi-encoder and a reranker trained from the same small model are wrong on different
queries, and the mix beat either alone (bench/retrieval.py picks the weight on dev queries).

A cross-encoder scores each pair at the length it was trained at (`load_reranker`: its
tokenizer's model_max_length, which `finetune --task rerank` sets), not the model's 512
positions: a news body runs to ~430 pieces, and MiniLM spent 4.5x the time of 128 pieces on 100
BBC pairs at 512 (issue 15) for a reranker that had never read past its training length.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from bertkit.retrieval.index import Index, open_index

DEFAULT_BUDGET = 1 << 22  # scores (float32) held at once: 16 MiB


def top_k_inner_product(vectors: np.ndarray, queries: np.ndarray, k: int, *,
                        budget: int = DEFAULT_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of `vectors` with the largest inner product with each query, exactly.

    vectors: (N, H) float (a memory map is fine: it is read in chunks); queries: (Q, H).
    Returns (scores (Q, k') float32, rows (Q, k') int64), best first, k' = min(k, N); equal
    scores are ordered by row.
    """
    queries = np.asarray(queries, dtype=np.float32)
    if queries.ndim != 2 or vectors.ndim != 2 or queries.shape[1] != vectors.shape[1]:
        raise ValueError(f"queries {queries.shape} and vectors {vectors.shape} must be (Q, H) "
                         "and (N, H) with the same H")
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    n = int(vectors.shape[0])
    k = min(k, n)
    if budget < 1:
        raise ValueError(f"budget must be positive, got {budget}")
    group = max(1, min(len(queries), budget // max(k, 1024)))  # queries scored together
    chunk = max(k, budget // group)  # document rows per step
    all_scores = np.empty((len(queries), k), dtype=np.float32)
    all_rows = np.empty((len(queries), k), dtype=np.int64)
    for q0 in range(0, len(queries), group):
        block = queries[q0:q0 + group]  # (G, H)
        best_s = np.full((len(block), 0), -np.inf, dtype=np.float32)  # (G, ≤k) running top-k
        best_r = np.zeros((len(block), 0), dtype=np.int64)
        for lo in range(0, n, chunk):
            rows = np.asarray(vectors[lo:lo + chunk], dtype=np.float32)  # (C, H) one chunk read
            scores = block @ rows.T  # (G, C)
            take = min(k, scores.shape[1])
            part = np.argpartition(-scores, take - 1, axis=1)[:, :take]  # (G, take)
            cand_s = np.concatenate([best_s, np.take_along_axis(scores, part, 1)], axis=1)
            cand_r = np.concatenate([best_r, part + lo], axis=1)
            keep = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]  # (G, ≤k)
            best_s = np.take_along_axis(cand_s, keep, 1)
            best_r = np.take_along_axis(cand_r, keep, 1)
        # Final order: score descending, then row ascending, so ties do not depend on chunking.
        for g in range(len(block)):
            order = np.lexsort((best_r[g], -best_s[g]))
            all_scores[q0 + g] = best_s[g][order]
            all_rows[q0 + g] = best_r[g][order]
    return all_scores, all_rows


def check_rerank_weight(weight: float) -> None:
    """A reranker's share of the fused score must lie in [0, 1]."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"rerank weight must be in [0, 1] (1: the reranker alone), got {weight}")


def rerank_logits(reranker: Any, query: str, documents: Sequence[str]) -> np.ndarray:
    """(D,) float32 the cross-encoder's raw score of each document, in the documents' order."""
    from bertkit.inference import rerank

    logits = np.empty(len(documents), dtype=np.float32)
    for hit in rerank(reranker, query, documents, raw_scores=True):
        logits[hit["index"]] = hit["score"]
    return logits


def fuse_scores(first: np.ndarray, second: np.ndarray, weight: float) -> np.ndarray:
    """One query's candidates scored by both stages → weight · z(second) + (1 − weight) · z(first).

    first: (C,) first-stage scores (inner products); second: (C,) the reranker's logits (raw: a
    sigmoid squeezes the scores that matter, near 1, together). z standardises each over this
    query's candidates (mean 0, standard deviation 1; a constant column becomes 0), so the
    weight means the same whatever the two scales are. weight 1 is the reranker alone, 0 the
    first stage alone. Returns (C,) float64.
    """
    check_rerank_weight(weight)
    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"first {first.shape} and second {second.shape} must be (C,) of one query")

    def z(x: np.ndarray) -> np.ndarray:
        spread = x.std()
        return (x - x.mean()) / spread if spread > 0 else np.zeros_like(x)

    return weight * z(second) + (1.0 - weight) * z(first)


@dataclass
class Hit:
    """One retrieved document."""
    rank: int  # 1-based
    id: str
    score: float  # inner product (first stage), the cross-encoder's score, or the fused score
    row: int  # the document's row in the index
    text: str
    first_stage_score: float | None = None  # the bi-encoder's score when reranked
    rerank_score: float | None = None  # the cross-encoder's score (sigmoid) when reranked

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Searcher:
    """An index with its query model (and optional reranker) loaded once, for many queries."""

    index: Index
    engine: Any  # bertkit.inference.Engine of the index's model
    reranker: Any = None  # Engine of a cross-encoder, or None
    timings: dict[str, float] | None = None

    @classmethod
    def open(cls, index_dir: str | os.PathLike, *, model: Any = None, rerank: Any = None,
             rerank_max_length: int | None = None, **engine_options: Any) -> "Searcher":
        """model: None (the index's own model dir), a model dir or an Engine, checked against the
        index's fingerprint. rerank: a cross-encoder dir or Engine (task rerank);
        rerank_max_length: pieces per (query, document) pair (default: `load_reranker`'s)."""
        from bertkit.inference import Engine

        index = open_index(index_dir)
        if isinstance(model, Engine):
            engine = model
        else:
            model_dir = model if model is not None else index.meta["model"]
            if not os.path.isdir(model_dir):
                raise FileNotFoundError(f"the index's model {model_dir} is not there any more; pass "
                                        "--model with the same model, or rebuild the index")
            index.check_model(model_dir)  # before loading weights: a wrong model fails fast
            engine = Engine.load(model_dir, use="embed", max_length=index.meta["max_length"],
                                 **engine_options)
        if engine.model_dir is None:
            raise ValueError("the query Engine has no model_dir to check against the index; load it "
                             "with Engine.load(model_dir)")
        index.check_model(engine.model_dir, engine.tokenizer)
        reranker = None
        if rerank is not None:
            options = dict(engine_options)
            options.pop("max_length", None)  # the index's; a reranker reads pairs at its own
            if rerank_max_length is not None:
                options["max_length"] = rerank_max_length
            reranker = rerank if isinstance(rerank, Engine) else load_reranker(rerank, **options)
        return cls(index, engine, reranker)

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        from bertkit.inference import embed

        meta = self.index.meta
        return embed(self.engine, list(queries), pooling=meta["pooling"],
                     normalize=meta["normalize"]).numpy()  # (Q, H)

    def search(self, queries: str | Sequence[str], *, top_k: int = 10, candidates: int = 100,
               rerank_weight: float = 1.0, budget: int = DEFAULT_BUDGET) -> list[list[Hit]]:
        """The best `top_k` documents per query (reranked from `candidates` with a reranker;
        rerank_weight < 1: ordered by `fuse_scores` of both stages, Hit.score the fused score)."""
        import torch

        from bertkit.inference.common import as_texts

        queries = as_texts(queries, "query")
        if top_k < 1 or candidates < 1:
            raise ValueError(f"top_k ({top_k}) and candidates ({candidates}) must be positive")
        check_rerank_weight(rerank_weight)
        if self.reranker is None and rerank_weight != 1.0:
            raise ValueError(f"rerank weight {rerank_weight} mixes a reranker's scores in, but this "
                             "search has no reranker; pass --rerank CROSS_ENCODER")
        if self.reranker is not None and candidates < top_k:
            raise ValueError(f"candidates {candidates} < top_k {top_k}: the reranker can only "
                             "order what the first stage found; raise --candidates")
        first = candidates if self.reranker is not None else top_k
        tick = time.perf_counter()
        vectors = self.embed_queries(queries)
        scores, rows = top_k_inner_product(self.index.vectors, vectors, first, budget=budget)
        timings = {"retrieve_ms": (time.perf_counter() - tick) * 1000, "rerank_ms": 0.0}
        out = []
        for qi, query in enumerate(queries):
            docs = self.index.documents(rows[qi].tolist())
            if self.reranker is None:
                out.append([Hit(r + 1, d["id"], float(s), int(row), d["text"])
                            for r, (s, row, d) in enumerate(zip(scores[qi], rows[qi], docs))])
                continue
            tick = time.perf_counter()
            logits = rerank_logits(self.reranker, query, [d["text"] for d in docs])  # (C,)
            timings["rerank_ms"] += (time.perf_counter() - tick) * 1000
            probs = torch.from_numpy(logits).sigmoid().numpy()  # (C,) rerank()'s own float32 scores
            final = probs if rerank_weight == 1.0 else fuse_scores(scores[qi], logits, rerank_weight)
            order = sorted(range(len(docs)), key=lambda i: (-final[i], i))[:top_k]
            out.append([Hit(r + 1, docs[i]["id"], float(final[i]), int(rows[qi][i]), docs[i]["text"],
                            float(scores[qi][i]), float(probs[i]))
                        for r, i in enumerate(order)])
        self.timings = timings
        return out


def load_reranker(model_dir: str | os.PathLike, **engine_options: Any):
    """An Engine (task rerank) over a cross-encoder dir that cuts pairs at the length the model
    was trained at: its tokenizer's model_max_length (what sentence-transformers' CrossEncoder
    reads too), capped at the model's positions; `max_length=` overrides it."""
    from bertkit.fileio import model_directory
    from bertkit.inference import Engine

    model_directory(model_dir, "--rerank")
    own = engine_options.get("max_length") is None
    if own:
        engine_options.pop("max_length", None)
    engine = Engine.load(model_dir, use="rerank", **engine_options)
    if own:  # Engine.load took the model's limit; a trained length below it is the one to use
        engine.max_length = max(3, min(engine.tokenizer.model_max_length, engine.max_length))
    return engine


def search(index_dir: str | os.PathLike, queries: str | Sequence[str], *, top_k: int = 10,
           candidates: int = 100, model: Any = None, rerank: Any = None, rerank_weight: float = 1.0,
           **engine_options: Any) -> list[list[Hit]]:
    """One-shot search: open the index (and models), answer `queries`; see `Searcher`."""
    searcher = Searcher.open(index_dir, model=model, rerank=rerank, **engine_options)
    return searcher.search(queries, top_k=top_k, candidates=candidates, rerank_weight=rerank_weight)
