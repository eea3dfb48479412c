"""Ranking metrics of a retrieval run: MRR@10, Recall@1/10/100, nDCG@10, MAP.

A run is one ranked list of document ids per query (best first); the judgements are, per query,
the relevant ids (a set: relevance 1) or {id: graded relevance}. Conventions are those of
MS MARCO and TREC's trec_eval, so the numbers compare with published ones:

- MRR@k: 1 / rank of the first relevant document within the top k, else 0; averaged.
- Recall@k: relevant documents in the top k / all relevant documents of the query.
- nDCG@k: DCG = sum over the top k of rel / log2(rank + 1) (rank 1-based; linear gains, as
  trec_eval), divided by the DCG of the ideal order of the query's judgements.
- MAP (trec_eval's `map`; `map_cut.k` with a k): the mean over the relevant documents of the
  precision at the rank each is found (0 for one not found), divided by all relevant documents.
A run given as scores is ranked as trec_eval ranks it (`trec_order`): score descending, equal
scores by document id descending, so figures equal `pytrec_eval`'s on the same run.
A query without any relevant document is an error: it would count as 0 or be dropped silently,
depending on the tool, and either changes the average.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

Judgements = Mapping[str, float] | Iterable[str]
DEFAULT_KS = {"mrr": (10,), "recall": (1, 10, 100), "ndcg": (10,)}


def _graded(relevant: Judgements) -> dict[str, float]:
    if isinstance(relevant, Mapping):
        return {str(k): float(v) for k, v in relevant.items() if float(v) > 0}
    return {str(k): 1.0 for k in relevant}


def reciprocal_rank(ranked: Sequence[str], relevant: Judgements, k: int = 10) -> float:
    """1 / (1-based rank of the first relevant id within ranked[:k]), 0 when there is none."""
    rel = _graded(relevant)
    for rank, doc in enumerate(ranked[:k], start=1):
        if str(doc) in rel:
            return 1.0 / rank
    return 0.0


def recall(ranked: Sequence[str], relevant: Judgements, k: int) -> float:
    """Share of the query's relevant ids found in ranked[:k]."""
    rel = _graded(relevant)
    if not rel:
        raise ValueError("recall of a query with no relevant document is undefined")
    return len(rel.keys() & {str(d) for d in ranked[:k]}) / len(rel)


def ndcg(ranked: Sequence[str], relevant: Judgements, k: int = 10) -> float:
    """Normalised discounted cumulative gain of ranked[:k] (linear gain rel / log2(rank + 1))."""
    rel = _graded(relevant)
    if not rel:
        raise ValueError("nDCG of a query with no relevant document is undefined")
    seen: set[str] = set()
    dcg = 0.0
    for rank, doc in enumerate(ranked[:k], start=1):
        doc = str(doc)
        if doc in rel and doc not in seen:  # a duplicate in the run earns nothing twice
            dcg += rel[doc] / math.log2(rank + 1)
            seen.add(doc)
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal, start=1))
    return dcg / idcg


def average_precision(ranked: Sequence[str], relevant: Judgements, k: int | None = None) -> float:
    """Sum of the precision at the rank of each relevant id in ranked[:k] (the whole run when k is
    None), over all relevant ids of the query: trec_eval's `map` (`map_cut.k`) for one query."""
    rel = _graded(relevant)
    if not rel:
        raise ValueError("average precision of a query with no relevant document is undefined")
    seen: set[str] = set()
    total = 0.0
    for rank, doc in enumerate(ranked if k is None else ranked[:k], start=1):
        doc = str(doc)
        if doc in rel and doc not in seen:
            seen.add(doc)
            total += len(seen) / rank
    return total / len(rel)


def trec_order(scores: Mapping[str, float]) -> list[str]:
    """Document ids by score descending, equal scores by id descending: the order trec_eval (and
    so pytrec_eval, BEIR and MTEB) ranks a scored run in."""
    return [doc for doc, _ in sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def evaluate_run(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Judgements],
                 ks: Mapping[str, Sequence[int | None]] = DEFAULT_KS) -> dict[str, float]:
    """Mean metrics over every judged query: {"mrr@10", "recall@1", ..., "ndcg@10", "queries"}.

    ks: metric → cut-offs; "map": (None,) adds "map" over the whole run, (k,) adds "map@k".

    run: query id → ranked doc ids (best first); a judged query missing from the run scores 0.
    qrels: query id → relevant ids (or {id: grade}). Queries of the run that have no judgements
    are ignored (they cannot be scored), as trec_eval does.
    """
    if not qrels:
        raise ValueError("no judged queries to evaluate")
    empty = [q for q, rel in qrels.items() if not _graded(rel)]
    if empty:
        raise ValueError(f"{len(empty)} queries have no relevant document (e.g. {empty[0]!r}); "
                         "drop them from the judgements")
    totals: dict[str, float] = {}
    for query, rel in qrels.items():
        ranked = list(run.get(query, ()))
        for k in ks.get("mrr", ()):
            totals[f"mrr@{k}"] = totals.get(f"mrr@{k}", 0.0) + reciprocal_rank(ranked, rel, k)
        for k in ks.get("recall", ()):
            totals[f"recall@{k}"] = totals.get(f"recall@{k}", 0.0) + recall(ranked, rel, k)
        for k in ks.get("ndcg", ()):
            totals[f"ndcg@{k}"] = totals.get(f"ndcg@{k}", 0.0) + ndcg(ranked, rel, k)
        for k in ks.get("map", ()):
            name = "map" if k is None else f"map@{k}"
            totals[name] = totals.get(name, 0.0) + average_precision(ranked, rel, k)
    n = len(qrels)
    out = {name: value / n for name, value in totals.items()}
    out["queries"] = n
    return out
