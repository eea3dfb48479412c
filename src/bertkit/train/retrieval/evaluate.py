"""Scoring a trained bi-encoder or cross-encoder on held-out queries: MRR@10, Recall@k, nDCG@10,
and for a reranker its first stage's score on the same candidates."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bertkit.train.retrieval.common import evaluation_set


def evaluate(model_dir: Any, task: str, spec: str, *, candidates: int = 20,
             first_stage: str | None = None, dims: Sequence[int] | None = None,
             scored: bool = False) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 of a trained model on `spec`'s queries.

    embed: exact search over the corpus (a builtin set's whole corpus, else every passage of the
    file). rerank: the top `candidates` of BM25 (or the `first_stage` bi-encoder) reranked; the
    first stage's own scores on the same candidates come under "first_stage", the baseline a
    reranker has to beat.

    dims (embed, a Matryoshka model): the same search on each prefix of the embeddings, re-normalised,
    under "dims": {"256": {...}, ...}. scored (embed, a cosent / angle model on scored pairs): the
    Spearman and Pearson correlations of the pairs' cosines with their scores (STS), instead.
    """
    from bertkit.inference import embed, rerank
    from bertkit.retrieval.bm25 import BM25
    from bertkit.retrieval.metrics import evaluate_run
    from bertkit.retrieval.search import load_reranker, top_k_inner_product

    if scored:
        return _sts(model_dir, spec, dims)
    pairs, corpus, qrels = evaluation_set(spec)
    run: dict[str, list[str]] = {}
    reranker = None
    if task == "rerank":  # a model dir, or an adapter's engine (LoRA saved as adapters)
        reranker = load_reranker(model_dir) if isinstance(model_dir, (str, Path)) else model_dir
    if task == "embed" or first_stage:
        encoder = model_dir if task == "embed" else first_stage
        corpus_vectors = embed(encoder, corpus).numpy()  # (N, H)
        query_vectors = embed(encoder, [p.query for p in pairs]).numpy()  # (Q, H)
        rows = top_k_inner_product(corpus_vectors, query_vectors, 100 if task == "embed" else candidates)[1].tolist()
    else:
        bm25 = BM25.fit(corpus)
        rows = [bm25.top_k(p.query, candidates) for p in pairs]
    first_run = {str(i): [str(j) for j in found] for i, found in enumerate(rows)}
    for i, (pair, found) in enumerate(zip(pairs, rows)):
        if task == "rerank":
            order = rerank(reranker, pair.query, [corpus[j] for j in found]) if found else []
            found = [found[o["index"]] for o in order]
        run[str(i)] = [str(j) for j in found]
    def rounded(scores: dict[str, Any]) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}

    result = rounded(evaluate_run(run, qrels))
    if task == "embed" and dims:
        result["dims"] = {}
        for d in dims:
            found = top_k_inner_product(_prefix(corpus_vectors, d), _prefix(query_vectors, d), 100)[1].tolist()
            result["dims"][str(d)] = rounded(evaluate_run(
                {str(i): [str(j) for j in row] for i, row in enumerate(found)}, qrels))
    if task == "rerank":
        result["first_stage"] = {"name": f"{'bi-encoder' if first_stage else 'BM25'} top {candidates}",
                                 **rounded(evaluate_run(first_run, qrels))}
    return result


def _prefix(vectors: np.ndarray, d: int) -> np.ndarray:
    """(N, H) unit vectors → (N, d): their first d dimensions, re-normalised (a Matryoshka prefix)."""
    cut = np.ascontiguousarray(vectors[:, :d])
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)


def _sts(model_dir: Any, spec: str, dims: Sequence[int] | None) -> dict[str, Any]:
    """Spearman / Pearson of the cosines of `spec`'s scored pairs against their scores (at each
    Matryoshka prefix too, under "dims")."""
    from bertkit.evaluation.pairs import sts_scores
    from bertkit.inference import embed
    from bertkit.train.retrieval.common import read_pairs

    pairs, _ = read_pairs(spec, default_split="dev")
    pairs = [p for p in pairs if p.score is not None]
    if len(pairs) < 2:
        raise ValueError(f"--eval {spec}: a scored-pairs loss is evaluated on pairs with a 'score', and it "
                         f"has {len(pairs)}; give JSONL rows {{\"sentence1\", \"sentence2\", \"score\"}}")
    first = embed(model_dir, [p.query for p in pairs]).numpy()  # (P, H)
    second = embed(model_dir, [p.positive for p in pairs]).numpy()  # (P, H)
    gold = [p.score for p in pairs]

    def scores(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
        return {k: round(v, 4) for k, v in sts_scores((a * b).sum(axis=1).tolist(), gold).items()}

    result: dict[str, Any] = scores(first, second)
    if dims:
        result["dims"] = {str(d): scores(_prefix(first, d), _prefix(second, d)) for d in dims}
    return result
