"""Fusing two rankings of one query's candidates: the z-score mix (the reranker's `--rerank-weight`
and hybrid search's `zscore`) and reciprocal-rank fusion (Cormack et al. 2009, hybrid's `rrf`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

RRF_K = 60  # Cormack et al.'s constant: a rank-1 hit adds 1/61; the value the paper and most engines use
HYBRID = ("rrf", "zscore")


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
