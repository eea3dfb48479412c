"""Evaluation of a model the way the embedding benchmarks score it: retrieval and reranking on
BEIR-format directories (nDCG@10, MRR@10, Recall@100, MAP, equal to `pytrec_eval`'s), STS (Spearman
of the cosine), pair classification (cosine thresholds) and text classification on embeddings
(MTEB's logistic-regression protocol), on files or the built-in sets.

    import bertkit
    bertkit.evaluate("my-model", beir="scifact/")["scores"]   # {"ndcg@10": ..., "mrr@10": ..., ...}

Modules: `data` (BEIR directories, TREC runs, pair and classification files, built-in sets),
`encoder` (the embedding model with its prompts, and the cosine every score uses; `bertkit.mteb`
embeds through it too), `retrieval`, `pairs` (STS, pair classification), `classification`, `run`
(`evaluate`).
"""

from bertkit.evaluation.encoder import TextEncoder
from bertkit.evaluation.run import evaluate

__all__ = ["TextEncoder", "evaluate"]
