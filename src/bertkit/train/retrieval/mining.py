"""Hard negatives for (query, positive) pairs: `bertkit mine-negatives`, in the definition of
sentence-transformers' `util.mine_hard_negatives`.

For each distinct query, a bi-encoder (or BM25, `bm25=True`) scores the corpus (the distinct
positives of the file); the candidates are its top range_max + (most positives of a query) + 1.
A cross-encoder, when given, rescores them and the positives (the sigmoid of its logit, as
sentence-transformers' CrossEncoder.predict and `bertkit rerank`), and its scores then order and
filter them. Removed: the query's own text, every positive of the query, and, with the filters
set, candidates scoring within `margin` of the query's lowest positive score (score + margin >
positive), above positive − |positive| × `relative_margin`, above `max_score` or below
`min_score`. The rest, best first, after skipping the first `range_min`, up to `range_max`:
`sampling="top"` keeps the first `num_negatives`, `sampling="random"` draws `num_negatives` of them
(`random.Random(seed).sample`, as sentence-transformers draws from Python's `random`), best first.
range_max defaults as there: range_min + num_negatives + most positives, times 10 for the
negatives when a filter is set.

Rows come out grouped by query (queries in order of first appearance), each (query, positive)
with the negatives of its query, as sentence-transformers' output rows are. Where it differs: a
row with fewer negatives than asked keeps those it has (sentence-transformers' "n-tuple" format
drops the row; its "triplet" format, one row per negative, gives the same negatives); BM25 is
ours (its scores are BM25's, so a margin is in BM25 units); the corpus is the file's positives
(sentence-transformers also takes extra documents).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from bertkit.util.fileio import atomic_write_text

log = logging.getLogger(__name__)

SAMPLING = ("top", "random")


@dataclass
class MiningReport:
    """What mining found: rows written, negatives per row, candidates each filter removed."""

    rows: int = 0
    negatives: int = 0
    short_rows: int = 0  # rows with fewer than num_negatives negatives
    range_max: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "negatives": self.negatives, "short_rows": self.short_rows,
                "range_max": self.range_max, "skipped": self.skipped}


def mine_negatives(pairs: Sequence[tuple[str, str]], *, model: str | None = None, bm25: bool = False,
                   cross_encoder: str | None = None, range_min: int = 0, range_max: int | None = None,
                   num_negatives: int = 3, sampling: str = "top", margin: float | None = None,
                   relative_margin: float | None = None, max_score: float | None = None,
                   min_score: float | None = None, seed: int = 42,
                   device: str = "cpu") -> tuple[list[dict[str, Any]], MiningReport]:
    """(query, positive) pairs → rows {"query", "positive", "negatives"} as the module docstring says."""
    _check(model, bm25, range_min, num_negatives, sampling)
    queries = list(dict.fromkeys(q for q, _ in pairs))
    corpus = list(dict.fromkeys(p for _, p in pairs))
    q_index, c_index = {q: i for i, q in enumerate(queries)}, {d: i for i, d in enumerate(corpus)}
    positives: list[list[int]] = [[] for _ in queries]  # each query's positives, corpus rows
    for q, p in pairs:
        if c_index[p] not in positives[q_index[q]]:
            positives[q_index[q]].append(c_index[p])
    most = max(len(p) for p in positives)
    filtered = margin is not None or relative_margin is not None or max_score is not None or (
        cross_encoder is not None and min_score is not None)
    if range_max is None:
        range_max = range_min + num_negatives * (10 if filtered else 1) + most
    if range_min >= range_max or num_negatives > range_max - range_min:
        raise ValueError(f"--range-min {range_min} and --range-max {range_max} leave {max(0, range_max - range_min)} "
                         f"ranks for --num-negatives {num_negatives}; widen the range or ask for fewer")
    width = range_max + most + 1
    scores, rows, positive_scores = _candidates(queries, corpus, positives, model, bm25, min(width, len(corpus)),
                                                device)  # (Q, k) each; (Q,) lists
    if cross_encoder is not None:
        scores, positive_scores = _rescore(cross_encoder, queries, corpus, rows, positives, device)
    pad = width - scores.shape[1]
    scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)  # (Q, width)
    rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)  # (Q, width)
    report = MiningReport(range_max=range_max)
    for i, q in enumerate(queries):  # never the query itself, nor one of its positives
        banned = set(positives[i]) | {c_index.get(q, -1), -1}
        scores[i, [j for j, r in enumerate(rows[i]) if r in banned]] = -np.inf
    lowest = np.array([min(s) for s in positive_scores], dtype=scores.dtype)[:, None]  # (Q, 1)
    rules = {"margin": None if margin is None else scores + margin > lowest,
             "relative_margin": None if relative_margin is None else scores > lowest - np.abs(lowest) * relative_margin,
             "max_score": None if max_score is None else scores > max_score,
             "min_score": None if min_score is None else (scores < min_score) & np.isfinite(scores)}
    for name, drop in rules.items():
        if drop is not None:
            report.skipped[name] = int((drop & np.isfinite(scores)).sum())
            scores[drop] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :range_max][:, range_min:]  # (Q, range_max − range_min)
    rng = random.Random(seed)
    chosen: list[list[int]] = []
    for i in range(len(queries)):
        ranked = order[i]
        if sampling == "random":
            options = max(num_negatives, int(np.isfinite(scores[i, ranked]).sum()))
            picks = rng.sample(range(options), k=num_negatives)
            ranked = ranked[sorted(picks, key=lambda j: (-scores[i, ranked[j]], j))]
        chosen.append([int(rows[i, j]) for j in ranked[:num_negatives] if np.isfinite(scores[i, j])])
    out = []
    for i, q in enumerate(queries):
        for p in positives[i]:
            out.append({"query": q, "positive": corpus[p], "negatives": [corpus[j] for j in chosen[i]]})
            report.negatives += len(chosen[i])
            report.short_rows += len(chosen[i]) < num_negatives
    report.rows = len(out)
    return out, report


def _check(model: str | None, bm25: bool, range_min: int, num_negatives: int, sampling: str) -> None:
    if (model is None) == (not bm25):
        raise ValueError("mine with a bi-encoder (--model DIR) or with --bm25, one of the two")
    if num_negatives < 1:
        raise ValueError(f"--num-negatives must be at least 1, got {num_negatives}")
    if range_min < 0:
        raise ValueError(f"--range-min must be ≥ 0, got {range_min}")
    if sampling not in SAMPLING:
        raise ValueError(f"--sampling must be one of {', '.join(SAMPLING)}, got {sampling!r}")


def _candidates(queries, corpus, positives, model, bm25, k, device):
    """The top k of the corpus for each query: scores (Q, k) float32, rows (Q, k) int64, and each
    query's positives' scores, by the bi-encoder's cosine or by BM25."""
    if bm25:
        from bertkit.retrieval.bm25 import BM25

        index = BM25.fit(corpus)
        all_scores = [index.scores(q) for q in queries]  # (N,) each
        rows = np.array([np.argsort(-s, kind="stable")[:k] for s in all_scores], dtype=np.int64)
        scores = np.array([s[r] for s, r in zip(all_scores, rows)], dtype=np.float32)
        return scores, rows, [[float(s[j]) for j in p] for s, p in zip(all_scores, positives)]
    from bertkit.inference import embed
    from bertkit.retrieval.exact import top_k_inner_product

    vectors = embed(model, corpus, normalize=True, device=device).numpy()  # (N, H) unit vectors
    query_vectors = embed(model, queries, normalize=True, device=device).numpy()  # (Q, H)
    scores, rows = top_k_inner_product(vectors, query_vectors, k)
    positive_scores = [[float(query_vectors[i] @ vectors[j]) for j in p] for i, p in enumerate(positives)]
    return scores.astype(np.float32), rows.astype(np.int64), positive_scores


def _rescore(cross_encoder, queries, corpus, rows, positives, device):
    """The cross-encoder's scores (sigmoid of its logit) of each query's candidates (Q, k) and positives."""
    from bertkit.inference.classify import logits
    from bertkit.retrieval.search import load_reranker

    engine = load_reranker(cross_encoder, device=device)
    pairs_q = [q for q, r in zip(queries, rows) for _ in r] + [q for q, p in zip(queries, positives) for _ in p]
    pairs_d = [corpus[j] for r in rows for j in r] + [corpus[j] for p in positives for j in p]
    flat = logits(engine, pairs_q, pairs_d)[:, 0].sigmoid().numpy()  # (P,)
    scores = flat[:rows.size].reshape(rows.shape).astype(np.float32)  # (Q, k)
    rest, positive_scores = flat[rows.size:].tolist(), []
    for p in positives:
        positive_scores.append(rest[:len(p)])
        rest = rest[len(p):]
    return scores, positive_scores


def mine_file(input_path: str, out_path: str, *, overwrite: bool = False, **options: Any) -> dict[str, Any]:
    """`mine_negatives` over a JSONL / TSV file of (query, positive) pairs (as `finetune --task
    embed` reads them; a row's own negatives are not kept), written as JSONL rows {"query",
    "positive", "negatives"} that `finetune --task embed` reads; returns the report's dict."""
    from bertkit.train.retrieval.common import read_pairs
    from bertkit.util.fileio import check_writable_output

    out = check_writable_output(out_path, overwrite=overwrite, kind="file")
    if out.suffix.lower() != ".jsonl":
        raise ValueError(f"--out {out_path}: mined rows are JSON Lines; name the file with a .jsonl suffix")
    if options.get("model") is not None:
        from bertkit.util.fileio import model_directory

        model_directory(options["model"], "--model")
    if options.get("cross_encoder") is not None:
        from bertkit.train.retrieval.teacher import check_teacher

        check_teacher(options["cross_encoder"], "--cross-encoder")
    pairs, data = read_pairs(input_path)
    rows, report = mine_negatives([(p.query, p.positive) for p in pairs], **options)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    if report.short_rows:
        log.warning("%d of %d rows have fewer than %d negatives (the filters and the range left fewer "
                    "candidates); widen --range-max or loosen the filters for more", report.short_rows,
                    report.rows, options.get("num_negatives", 3))
    return {"out": str(out), "input": data.to_dict(), **report.to_dict()}
