"""Retrieval the way RAG systems use BERT: index a corpus with a bi-encoder, search it exactly,
rerank the candidates with a cross-encoder, and score the result.

    from bertkit.retrieval import build_index, search
    build_index("corpus.jsonl", "my-biencoder", "index/")
    hits = search("index/", "who won the election?", rerank="my-reranker", top_k=10)

Modules: `index` (build, resume, open), `search` (chunked exact top-k, reranking), `metrics`
(MRR@10, Recall@k, nDCG@10), `bm25` (a small BM25 for mining negatives and baselines),
`datasets` (built-in retrieval sets from offline text).
"""

from bertkit.retrieval.index import Index, build_index, model_fingerprint, open_index
from bertkit.retrieval.metrics import evaluate_run, ndcg, recall, reciprocal_rank
from bertkit.retrieval.search import Hit, Searcher, fuse_scores, load_reranker, search, top_k_inner_product

__all__ = ["Index", "build_index", "model_fingerprint", "open_index", "evaluate_run", "ndcg",
           "recall", "reciprocal_rank", "Hit", "Searcher", "fuse_scores", "load_reranker", "search",
           "top_k_inner_product"]
