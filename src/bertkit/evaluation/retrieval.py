"""Retrieval and reranking scored as BEIR and MTEB score them.

Retrieval: every query against the whole corpus by the cosine of their embeddings (queries with
the query prompt, documents with the document prompt), the best `RUN_DEPTH` documents a query
kept as the run. Reranking: each query's candidates (a first stage's best `top_k`: BM25, a
bi-encoder, or a TREC run file) ordered by the model: a cross-encoder's relevance, or a
bi-encoder's cosine (MTEB's reranking tasks).

Figures (`METRICS`): nDCG@10, MRR@10, Recall@100 and MAP over the run, each the mean over the
judged queries, equal to `pytrec_eval`'s `ndcg_cut.10`, `recip_rank` of the run cut at 10,
`recall.100` and `map` (tested), and so to MTEB's ndcg_at_10, mrr_at_10, recall_at_100 and
map_at_1000. A run is ranked as trec_eval ranks it (score descending, equal scores by document id
descending), which is what `retrieval.metrics` scores.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bertkit.evaluation.data import RetrievalData
from bertkit.evaluation.encoder import TextEncoder, cosine_matrix
from bertkit.retrieval.metrics import evaluate_run, trec_order

# Documents kept per query: MTEB's largest cut-off (k_values up to 1000) and BEIR's default.
RUN_DEPTH = 1000
METRICS = {"ndcg": (10,), "mrr": (10,), "recall": (100,), "map": (None,)}
ORDER = ("ndcg@10", "mrr@10", "recall@100", "map")
SCORE_BUDGET = 1 << 24  # query-document scores (float32) held at once: 64 MiB

Run = dict[str, dict[str, float]]  # query id → {document id: score}


def score_run(run: Run, data: RetrievalData) -> dict[str, float]:
    """{"ndcg@10", "mrr@10", "recall@100", "map"} of a scored run, means over the judged queries
    (one without a relevant document scores 0, as in trec_eval)."""
    answerable = {q: grades for q, grades in data.qrels.items() if any(g > 0 for g in grades.values())}
    ranked = {query: trec_order(run.get(query, {})) for query in answerable}
    scores = evaluate_run(ranked, answerable, METRICS)
    share = len(answerable) / len(data.qrels)
    return {name: scores[name] * share for name in ORDER}


def dense_run(encoder: TextEncoder, data: RetrievalData, task_type: str = "Retrieval",
              depth: int = RUN_DEPTH, budget: int = SCORE_BUDGET) -> Run:
    """Each judged query's `depth` best documents of the whole corpus by cosine.

    Queries are scored in blocks of at most `budget` scores against the whole corpus, with
    `cosine_matrix`, the arithmetic of the MTEB encoder's `similarity`: where MTEB scores every
    query in one block too, the two runs hold the same numbers.
    """
    query_ids, doc_ids = list(data.queries), list(data.corpus)
    q = encoder.encode([data.queries[i] for i in query_ids], encoder.prompt(data.name, task_type, "query"))
    d = encoder.encode([data.corpus[i] for i in doc_ids], encoder.prompt(data.name, task_type, "document"))
    depth = min(depth, len(doc_ids))
    block = max(1, budget // len(doc_ids))
    run = {}
    for lo in range(0, len(query_ids), block):
        scores = cosine_matrix(q[lo:lo + block], d)  # (B, N)
        best = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]  # (B, depth), unordered
        for row, found in enumerate(best):
            run[query_ids[lo + row]] = {doc_ids[j]: float(scores[row, j]) for j in found.tolist()}
    return run


def bm25_candidates(data: RetrievalData, depth: int) -> dict[str, list[str]]:
    """Each judged query's `depth` best documents by BM25 (`retrieval.bm25`)."""
    from bertkit.retrieval.bm25 import BM25

    doc_ids = list(data.corpus)
    index = BM25.fit([data.corpus[i] for i in doc_ids])
    found = {}
    for query, text in data.queries.items():
        rows, scores = index.top_k_scored(text, depth)
        found[query] = trec_order({doc_ids[j]: score for j, score in zip(rows, scores)})
    return found


def rerank_run(candidates: dict[str, list[str]], score: Callable[[str, list[str]], list[float]]) -> Run:
    """Each query's candidates scored by `score(query id, candidate ids)`."""
    return {query: dict(zip(found, score(query, found))) if found else {} for query, found in candidates.items()}


def bi_encoder_scorer(encoder: TextEncoder, data: RetrievalData,
                      candidates: dict[str, list[str]]) -> Callable[[str, list[str]], list[float]]:
    """Cosine of query and candidate embeddings, every candidate document embedded once."""
    pool = sorted({doc for found in candidates.values() for doc in found})
    vectors = encoder.encode([data.corpus[d] for d in pool], encoder.prompt(data.name, "Reranking", "document"))
    row = {doc: i for i, doc in enumerate(pool)}
    query_ids = list(candidates)
    queries = encoder.encode([data.queries[q] for q in query_ids], encoder.prompt(data.name, "Reranking", "query"))
    position = {q: i for i, q in enumerate(query_ids)}

    def score(query: str, found: list[str]) -> list[float]:
        qi = position[query]
        return cosine_matrix(queries[qi:qi + 1], vectors[[row[d] for d in found]])[0].tolist()

    return score


def pair_relevance(engine: Any, queries: list[str], documents: list[str]) -> np.ndarray:
    """(N,) float32 relevance logits of a cross-encoder for the pairs (queries[i], documents[i]):
    the sigmoid would not change the order, and raw logits tie less often. The MTEB cross-encoder
    scores its pairs here too."""
    from bertkit.inference.classify import logits

    if engine.config.num_labels != 1:
        raise ValueError(f"reranking needs a cross-encoder with one output (relevance); {engine.model_dir} has "
                         f"{engine.config.num_labels}")
    if not queries:
        return np.zeros(0, dtype=np.float32)
    return logits(engine, queries, documents)[:, 0].numpy()  # (N,)


def cross_encoder_scorer(engine: Any, data: RetrievalData) -> Callable[[str, list[str]], list[float]]:
    """A cross-encoder's relevance logit of each (query, candidate) pair (`pair_relevance`)."""

    def score(query: str, found: list[str]) -> list[float]:
        return pair_relevance(engine, [data.queries[query]] * len(found), [data.corpus[d] for d in found]).tolist()

    return score


def candidates_of(run: Run, depth: int) -> dict[str, list[str]]:
    """Each query's `depth` best documents of a scored run, in trec_eval's order."""
    return {query: trec_order(scores)[:depth] for query, scores in run.items()}


def as_run(candidates: dict[str, list[str]]) -> Run:
    """Ranked lists as a scored run that keeps their order (score −rank)."""
    return {query: {doc: -float(rank) for rank, doc in enumerate(found)} for query, found in candidates.items()}

