"""Retrieval the way RAG systems use BERT: index a corpus with a bi-encoder, search it exactly,
rerank the candidates with a cross-encoder, and score the result.

    from bertkit.retrieval import build_index, search
    build_index("corpus.jsonl", "my-biencoder", "index/")
    hits = search("index/", "who won the election?", rerank="my-reranker", top_k=10)

Modules: `index` (build, resume, open), `passages` (long documents cut by the tokenizer; late
chunking), `store` (documents, passages), `backends` (exact, FAISS HNSW / IVF-PQ, Qdrant),
`exact` (chunked exact top-k), `search` (documents by best passage, hybrid, reranking), `fusion`
(z-score, reciprocal-rank fusion, BGE-M3's weighted sum), `metrics` (MRR@10, Recall@k, nDCG@10),
`bm25` (BM25 by bm25s, for hybrid search, mining negatives and baselines), `datasets` (built-in
retrieval sets), `quantize` (int8 / binary codes of the vectors), `multivector` (the multi-vector
side: token vectors compressed by `residual`, from a kind of `token_vectors`, searched by MaxSim).
"""

from bertkit.retrieval.exact import top_k_inner_product
from bertkit.retrieval.fusion import fuse_scores, rrf
from bertkit.retrieval.index import Index, IndexConfig, build_index, model_fingerprint, open_index, run_build_index
from bertkit.retrieval.metrics import evaluate_run, ndcg, recall, reciprocal_rank
from bertkit.retrieval.search import Hit, Searcher, load_reranker, search

__all__ = ["Index", "IndexConfig", "build_index", "run_build_index", "model_fingerprint", "open_index",
           "evaluate_run", "ndcg", "recall", "reciprocal_rank", "Hit", "Searcher", "fuse_scores", "load_reranker",
           "rrf", "search", "top_k_inner_product"]
