"""Exact inner-product top-k over a (memory-mapped) matrix, in bounded memory.

`top_k_inner_product(vectors, queries, k)` scores every row (no approximation) while holding at
most `budget` scores in memory at a time: queries go in groups and rows in chunks (a memory-mapped
(N, H) array is read chunk by chunk), and a running top-k per query is merged after each chunk.
With the default budget (2**22 scores, 16 MiB) a million rows × 32 queries stays under ~60 MiB
whatever N is.
"""

from __future__ import annotations

import numpy as np

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
