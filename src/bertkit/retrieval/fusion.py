"""Fusing rankings of one query's candidates: the z-score mix (the reranker's `--rerank-weight`
and hybrid search's `zscore`), reciprocal-rank fusion (Cormack et al. 2009, hybrid's `rrf`) and
BGE-M3's weighted sum of scores (Chen et al. 2024, hybrid's `weighted`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

RRF_K = 60  # Cormack et al.'s constant: a rank-1 hit adds 1/61; the value the paper and most engines use
HYBRID = ("rrf", "zscore", "weighted")
# BGE-M3's weights (FlagEmbedding's compute_score: dense 0.4, its lexical side 0.2, multi-vector
# 0.4); BM25 and SPLADE take the lexical side's weight.
M3_WEIGHTS = {"dense": 0.4, "bm25": 0.2, "sparse": 0.2, "multivector": 0.4}
LEXICAL = ("bm25", "sparse")


def check_rerank_weight(weight: float) -> None:
    """A second stage's share of the fused score must lie in [0, 1]."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"rerank weight must be in [0, 1] (1: the reranker alone), got {weight}")


def zscore(x: np.ndarray) -> np.ndarray:
    """x standardised over its own entries (mean 0, sd 1; a constant column becomes 0)."""
    x = np.asarray(x, dtype=np.float64)
    spread = x.std()
    return (x - x.mean()) / spread if spread > 0 else np.zeros_like(x)


def fuse_scores(first: np.ndarray, second: np.ndarray, weight: float) -> np.ndarray:
    """One query's candidates scored by both stages → weight · z(second) + (1 − weight) · z(first).

    first: (C,) first-stage scores (inner products); second: (C,) the reranker's logits (raw: a
    sigmoid squeezes the scores that matter, near 1, together) or BM25 scores. z standardises each
    over this query's candidates (mean 0, standard deviation 1; a constant column becomes 0), so
    the weight means the same whatever the two scales are. weight 1 is the second alone, 0 the
    first alone. Returns (C,) float64.
    """
    check_rerank_weight(weight)
    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"first {first.shape} and second {second.shape} must be (C,) of one query")
    return weight * zscore(second) + (1.0 - weight) * zscore(first)


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> dict[int, float]:
    """Reciprocal-rank fusion: item → Σ over the rankings it appears in of 1 / (k + rank), rank
    1-based. Items missing from a ranking get nothing from it."""
    out: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            out[item] = out.get(item, 0.0) + 1.0 / (k + rank)
    return out


def weighted_sum(columns: dict[str, np.ndarray], weights: dict[str, float] | None = None) -> np.ndarray:
    """BGE-M3's hybrid score of one query's candidates: Σ w_s · score_s / Σ w_s over the systems
    given. columns: system → (C,) scores; dense a cosine, multivector MaxSim divided by the
    query's tokens (M3's colbert_score), both in [-1, 1]. Where we differ from M3: its lexical
    scores are its own term weights' products, already near that range; BM25's and SPLADE's are
    unbounded, so each is divided by its best among these candidates (into [0, 1]) first."""
    weights = {**M3_WEIGHTS, **(weights or {})}
    total = np.zeros(len(next(iter(columns.values()))), dtype=np.float64)
    for system, scores in columns.items():
        x = np.asarray(scores, dtype=np.float64)
        if system in LEXICAL:
            top = x.max(initial=0.0)
            x = x / top if top > 0 else np.zeros_like(x)
        total += weights[system] * x
    return total / sum(weights[s] for s in columns)
