"""Scoring a trained bi-encoder or cross-encoder on held-out queries: MRR@10, Recall@k, nDCG@10,
and for a reranker its first stage's score on the same candidates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertkit.train.retrieval.common import evaluation_set


def evaluate(model_dir: Any, task: str, spec: str, *, candidates: int = 20,
             first_stage: str | None = None) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 of a trained model on `spec`'s queries.

    embed: exact search over the corpus (a builtin set's whole corpus, else every passage of the
    file). rerank: the top `candidates` of BM25 (or the `first_stage` bi-encoder) reranked; the
    first stage's own scores on the same candidates come under "first_stage", the baseline a
    reranker has to beat.
    """
    from bertkit.inference import embed, rerank
    from bertkit.retrieval.bm25 import BM25
    from bertkit.retrieval.metrics import evaluate_run
    from bertkit.retrieval.search import load_reranker, top_k_inner_product

    pairs, corpus, qrels = evaluation_set(spec)
    run: dict[str, list[str]] = {}
    reranker = None
    if task == "rerank":  # a model dir, or an adapter's engine (LoRA saved as adapters)
        reranker = load_reranker(model_dir) if isinstance(model_dir, (str, Path)) else model_dir
    if task == "embed" or first_stage:
        encoder = model_dir if task == "embed" else first_stage
        rows = top_k_inner_product(embed(encoder, corpus).numpy(),
                                   embed(encoder, [p.query for p in pairs]).numpy(),
                                   100 if task == "embed" else candidates)[1].tolist()
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
    if task == "rerank":
        result["first_stage"] = {"name": f"{'bi-encoder' if first_stage else 'BM25'} top {candidates}",
                                 **rounded(evaluate_run(first_run, qrels))}
    return result
