"""bertkit index and bertkit search: a corpus cut into passages and embedded into an index (any
backend), queried (dense, or hybrid with BM25), optionally reranked."""

from __future__ import annotations

import argparse
import sys

from bertkit.cli.common import (
    BATCH_TOKENS_HELP,
    add_engine_arguments,
    add_pooling_argument,
    add_run_arguments,
    engine_options,
    print_json,
)


def add(sub: argparse._SubParsersAction) -> None:
    _add_index(sub)
    _add_search(sub)


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="embed a corpus into a search index (passages + vectors + model)",
                       description="Read CORPUS (jsonl rows with id and text, or txt: a document a "
                       "line, its id the line number), cut each document into passages by the model's "
                       "tokenizer (at sentence ends where it can), embed them into OUT (vectors.npy, "
                       "docs.jsonl, passages, index.json: the model and its fingerprint) and build the "
                       "chosen backend and a BM25 index beside it. Bad rows are named and skipped; "
                       "--resume continues a killed build.")
    p.add_argument("corpus", nargs="?", help="corpus file (.jsonl or .txt); with --upsert, the documents to "
                   "add or replace")
    p.add_argument("--model", default=None, help="bi-encoder model dir (any BERT; its own pooling); "
                   "required for a new index")
    p.add_argument("--out", required=True, help="index directory")
    g = p.add_argument_group("updating a finished index (its own model and settings)")
    g.add_argument("--upsert", action="store_true",
                   help="add CORPUS's documents to the index at --out, replacing those with the same id")
    g.add_argument("--delete", nargs="+", default=[], metavar="ID", help="delete these document ids")
    p.add_argument("--text-field", default="text", help="jsonl key of the text (text)")
    p.add_argument("--id-field", default="id", help="jsonl key of the id (id; else the line number)")
    add_pooling_argument(p)
    g = p.add_argument_group("passages")
    g.add_argument("--passage-tokens", type=int, default=None,
                   help="pieces per passage (default: the model's length − 2; 0: whole documents, "
                   "truncated at --max-length and counted)")
    g.add_argument("--passage-overlap", type=int, default=0, help="pieces shared by neighbouring passages (0)")
    g.add_argument("--late-chunking", action="store_true",
                   help="encode windows of passages at once and pool each passage from its own token states")
    g = p.add_argument_group("backend")
    g.add_argument("--backend", default="exact", choices=["exact", "faiss", "faiss-hnsw", "faiss-ivfpq", "qdrant"],
                   help="exact (default), faiss-hnsw (= faiss), faiss-ivfpq (pip install 'bertkit[faiss]'), "
                   "qdrant (pip install 'bertkit[qdrant]': embedded, or a server with --qdrant-url)")
    g.add_argument("--hnsw-m", type=int, default=None, help="HNSW links per node (32)")
    g.add_argument("--ef-construction", type=int, default=None, help="HNSW build beam (128)")
    g.add_argument("--nlist", type=int, default=None, help="IVF lists (4·√N)")
    g.add_argument("--pq-m", type=int, default=None, help="PQ bytes per vector (dim / 4)")
    g.add_argument("--refine", type=int, default=None,
                   help="IVF-PQ: re-score the best refine·k exactly from the vectors (4; 0: PQ scores only)")
    g.add_argument("--qdrant-url", default=None, help="a Qdrant server or cluster, e.g. http://127.0.0.1:6333 "
                   "(default: embedded, in this process)")
    g.add_argument("--vector-dtype", default="float32", choices=["float32", "int8", "binary"],
                   help="exact backend: search int8 (1/4 the bytes) or binary (1/32) codes of the vectors, "
                   "re-scoring the best candidates with the float vectors kept on disk (float32)")
    g.add_argument("--rescore-multiplier", type=int, default=None,
                   help="int8 / binary: candidates re-scored in float, as a multiple of --top-k (4)")
    g.add_argument("--no-float-rescore", action="store_false", dest="float_rescore",
                   help="int8 / binary: re-score on the codes themselves (sentence-transformers' rescoring), "
                   "not on the float vectors kept on disk")
    g.add_argument("--no-bm25", action="store_false", dest="bm25", help="no BM25 index (no --hybrid search)")
    g.add_argument("--bm25-cjk", choices=["bigram", "jieba"], default="bigram",
                   help="BM25's tokens of Chinese text: character bigrams (default) or jieba's words")
    g = p.add_argument_group("multi-vector side (late interaction)")
    g.add_argument("--multi-vector", nargs="?", const="token-states", default=None, metavar="KIND",
                   help="also store every passage's token vectors, compressed (centroids + residual bits), "
                   "for search --multi-vector; KIND: where they come from (token-states: the model's own; colbert: a "
                   "ColBERT model's; m3: BGE-M3's)")
    g.add_argument("--mv-nbits", type=int, default=2, help="bits per dimension of a token's residual (2)")
    g.add_argument("--mv-centroids", type=int, default=None, help="k-means centroids (2^⌊log2(16·√tokens)⌋)")
    g = p.add_argument_group("sparse side (SPLADE)")
    g.add_argument("--sparse-model", default=None,
                   help="also encode the passages with this masked-LM model's SPLADE weights (an inverted "
                   "index for search --sparse); without CORPUS, add or replace the sparse side of the index at --out")
    g.add_argument("--sparse-top-k", type=int, default=None,
                   help="keep each passage's K largest sparse weights (default: all non-zero)")
    add_run_arguments(p, resume="continue a killed build", overwrite="replace an existing index")
    add_engine_arguments(p, max_batch_tokens_help=BATCH_TOKENS_HELP,
                         max_length_help="pieces per encoded sequence (the model's limit)")
    p.set_defaults(func=_run_index)


def _backend_params(args: argparse.Namespace) -> dict:
    named = {"M": args.hnsw_m, "ef_construction": args.ef_construction, "nlist": args.nlist, "m": args.pq_m,
             "refine": args.refine, "url": args.qdrant_url, "rescore_multiplier": args.rescore_multiplier}
    if args.vector_dtype != "float32":
        named["vector_dtype"] = args.vector_dtype
        named["rescore_float"] = args.float_rescore
    elif not args.float_rescore:
        raise ValueError("--no-float-rescore re-scores int8 or binary codes; pass --vector-dtype int8 or binary")
    elif args.rescore_multiplier is not None:
        raise ValueError(f"--rescore-multiplier {args.rescore_multiplier} re-scores int8 or binary codes; "
                         "pass --vector-dtype int8 or binary")
    return {k: v for k, v in named.items() if v is not None}


def _run_index(args: argparse.Namespace) -> None:
    from bertkit.retrieval.index import IndexConfig, run_build_index

    if (args.upsert or args.delete) and args.multi_vector:
        raise ValueError(f"--multi-vector {args.multi_vector} with --upsert / --delete: an update keeps the "
                         "index's own multi-vector side, if it has one; to add one, build the index again "
                         "with --multi-vector")
    if args.upsert or args.delete:
        return _run_update(args)
    if args.corpus is None and args.model is None and args.sparse_model:
        return _run_sparse_side(args)
    if args.multi_vector:
        from bertkit.retrieval.residual import check_nbits, import_kmeans
        from bertkit.retrieval.token_vectors import token_vector_kind

        if args.model is not None:  # a model of the wrong kind is refused before the index is written
            token_vector_kind(args.multi_vector).check(args.model)
        else:
            token_vector_kind(args.multi_vector)
        import_kmeans()
        check_nbits(args.mv_nbits)
        if args.mv_centroids is not None and args.mv_centroids < 1:
            raise ValueError(f"--mv-centroids {args.mv_centroids} must be positive")
    if args.corpus is None or args.model is None:
        raise ValueError("a new index needs CORPUS and --model (--upsert / --delete update an existing one)")
    config = IndexConfig(corpus=args.corpus, model=args.model, out_dir=args.out, resume=args.resume,
                         overwrite=args.overwrite, progress=args.progress, text_field=args.text_field,
                         id_field=args.id_field, pooling=args.pooling, passage_tokens=args.passage_tokens,
                         passage_overlap=args.passage_overlap, late_chunking=args.late_chunking,
                         backend=args.backend, backend_params=_backend_params(args), bm25=args.bm25,
                         bm25_cjk=args.bm25_cjk, engine_options=engine_options(args))
    summary = run_build_index(config)
    truncated = f", {summary['truncated']} truncated" if summary["truncated"] else ""
    print(f"indexed {summary['documents']} documents as {summary['rows']} passages ({summary['dim']} dims, "
          f"{summary['skipped']} rows skipped{truncated}; backend {summary['backend']}) into "
          f"{summary['out']} in {summary['seconds']:.1f} s")
    if args.multi_vector:
        _run_multivector_side(args)
    if args.sparse_model:
        _run_sparse_side(args)


def _run_multivector_side(args: argparse.Namespace) -> None:
    from bertkit.retrieval.multivector import build_multivector

    summary = build_multivector(args.out, args.model, kind=args.multi_vector, nbits=args.mv_nbits,
                                centroids=args.mv_centroids, **engine_options(args))
    print(f"multi-vector side: {summary['tokens']} token vectors of {summary['rows']} passages over "
          f"{summary['centroids']} centroids in {summary['seconds']:.1f} s")


def _run_sparse_side(args: argparse.Namespace) -> None:
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.sparse import build_sparse

    index = open_index(args.out)
    summary = build_sparse(index.path, args.sparse_model, top_k=args.sparse_top_k, resume=args.resume,
                           progress=args.progress, precision=args.precision,
                           max_batch_tokens=args.max_batch_tokens, device=args.device)
    print(f"sparse side: {summary['rows']} passages, {summary['nnz'] / max(summary['rows'], 1):.1f} terms a "
          f"passage on average ({summary['model']}) in {summary['seconds']:.1f} s")


def _run_update(args: argparse.Namespace) -> None:
    from bertkit.retrieval.update import update_index

    if args.upsert and args.corpus is None:
        raise ValueError("--upsert needs CORPUS, the file of documents to add or replace")
    if args.corpus is not None and not args.upsert:
        raise ValueError(f"CORPUS {args.corpus} with --delete alone: pass --upsert to add its documents too")
    summary = update_index(args.out, upsert=args.corpus if args.upsert else None, delete=args.delete,
                           text_field=args.text_field, id_field=args.id_field, device=args.device)
    print(f"updated {summary['out']}: {summary['added']} added, {summary['replaced']} replaced, "
          f"{summary['deleted']} deleted; {summary['documents']} documents as {summary['rows']} passages "
          f"in {summary['seconds']:.1f} s")


def _add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search an index (its backend, or hybrid with BM25), optionally reranked",
                       description="Embed each query with the index's own model (another --model is "
                       "refused unless it is the same model), find the best passages with the index's "
                       "backend, rank documents by their best passage (fused with BM25's ranking under "
                       "--hybrid) and, with --rerank, order the best --candidates by a cross-encoder.")
    p.add_argument("index", help="index directory made by `bertkit index`")
    p.add_argument("queries", nargs="*", help="query texts (or --input)")
    p.add_argument("--input", default=None,
                   help="a file of queries: .txt (one a line) or .jsonl (a query field); answers as JSON Lines")
    p.add_argument("--query-field", default="query", help="jsonl key of the query (query)")
    p.add_argument("--rerank", default=None, help="cross-encoder dir to rerank the candidates")
    p.add_argument("--rerank-max-length", type=int, default=None,
                   help="pieces per query + passage pair (default: the length it was trained at)")
    p.add_argument("--top-k", type=int, default=10, help="documents per query (10)")
    p.add_argument("--candidates", type=int, default=100, help="first-stage documents to rerank or fuse (100)")
    p.add_argument("--rerank-weight", type=float, default=1.0,
                   help="order by W · reranker + (1 − W) · first stage, each standardised over a "
                   "query's candidates (1: the reranker alone; pick W on dev queries)")
    p.add_argument("--hybrid", choices=["rrf", "zscore", "weighted"], default=None,
                   help="fuse the dense ranking with BM25's (and the sparse and multi-vector ones' with "
                   "--sparse / --multi-vector): reciprocal-rank fusion, equal-weight z-scores, or BGE-M3's "
                   "weighted sum of scores (dense 0.4, lexical 0.2, multi-vector 0.4)")
    p.add_argument("--sparse", action="store_true",
                   help="search the index's sparse (SPLADE) side: alone, or fused with dense and BM25 under --hybrid")
    p.add_argument("--multi-vector", action="store_true",
                   help="search the index's multi-vector side by MaxSim: alone, or fused under --hybrid")
    p.add_argument("--mv-nprobe", type=int, default=4, help="multi-vector: centroids probed per query token (4)")
    p.add_argument("--mv-candidates", type=int, default=256,
                   help="multi-vector: passages scored by exact MaxSim after the centroid stage (256)")
    p.add_argument("--systems", default=None,
                   help="with --hybrid: the rankings to fuse, comma-separated among dense, bm25, sparse, "
                   "multivector (default: dense,bm25, plus sparse / multivector with --sparse / --multi-vector)")
    p.add_argument("--sparse-model", default=None,
                   help="query model of the sparse side (default: the one it was built with; must be the same)")
    p.add_argument("--ef", type=int, default=None, help="faiss-hnsw search beam (the index's, 128)")
    p.add_argument("--nprobe", type=int, default=None, help="faiss-ivfpq lists searched (the index's)")
    p.add_argument("--rescore-multiplier", type=int, default=None,
                   help="int8 / binary index: candidates re-scored in float, × --top-k (the index's, 4)")
    p.add_argument("--qdrant-url", default=None, help="the Qdrant server to query (default: the index's)")
    p.add_argument("--model", default=None, help="query model (default: the index's; must be the same)")
    add_engine_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object per query")
    p.set_defaults(func=_run_search)


def _read_queries(path: str, field: str) -> list[str]:
    from bertkit.inference.files import RecordReport, read_records

    report = RecordReport(path)
    queries = [r.text for r in read_records(path, text_field=field, report=report)]
    if report.n_skipped:
        print(report.summary(), file=sys.stderr)
    return queries


def _systems(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The rankings --sparse, --hybrid and --systems ask for (None: the search's default)."""
    if args.systems is not None:
        if not args.hybrid:
            raise ValueError("--systems names the rankings --hybrid fuses; pass --hybrid rrf or zscore")
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
        for flag, name in ((args.sparse, "sparse"), (args.multi_vector, "multivector")):
            if flag and name not in systems:
                raise ValueError(f"--{name.replace('multivector', 'multi-vector')} with --systems {args.systems}: "
                                 f"add {name} to --systems, or drop the flag")
        return systems
    extra = tuple(name for flag, name in ((args.sparse, "sparse"), (args.multi_vector, "multivector")) if flag)
    if extra:
        if args.hybrid:
            return ("dense", "bm25", *extra)
        if len(extra) > 1:
            raise ValueError("--sparse with --multi-vector are two rankings: pass --hybrid rrf, zscore or weighted")
        return extra
    return None


def _run_search(args: argparse.Namespace) -> None:
    from bertkit.retrieval import Searcher

    if bool(args.queries) == bool(args.input):
        raise ValueError("give queries on the command line or --input FILE (one of the two)")
    queries = _read_queries(args.input, args.query_field) if args.input else args.queries
    systems = _systems(args)
    if args.mv_nprobe < 1 or args.mv_candidates < 1:
        raise ValueError(f"--mv-nprobe {args.mv_nprobe} and --mv-candidates {args.mv_candidates} must be positive")
    searcher = Searcher.open(args.index, model=args.model, rerank=args.rerank,
                             rerank_max_length=args.rerank_max_length,
                             backend_options={"url": args.qdrant_url} if args.qdrant_url else None,
                             sparse="sparse" in (systems or ()), sparse_model=args.sparse_model,
                             multi_vector="multivector" in (systems or ()), precision=args.precision,
                             device=args.device)
    searcher.mv_nprobe, searcher.mv_candidates = args.mv_nprobe, args.mv_candidates
    results = searcher.search(queries, top_k=args.top_k, candidates=args.candidates,
                              rerank_weight=args.rerank_weight, hybrid=args.hybrid, ef=args.ef,
                              nprobe=args.nprobe, systems=systems, rescore_multiplier=args.rescore_multiplier)
    if args.json or args.input:
        return print_json({"query": q, "hits": [h.to_dict() for h in hits]}
                          for q, hits in zip(queries, results))
    stage = "inner product" if not args.rerank else "reranked" if args.rerank_weight == 1.0 \
        else f"reranked, fused at weight {args.rerank_weight:g}"
    if systems in (("sparse",), ("multivector",)):
        stage = {"sparse": "sparse", "multivector": "MaxSim"}[systems[0]] + stage[len("inner product"):]
    elif args.hybrid and systems:
        stage = f"{' + '.join(systems)} ({args.hybrid})" + ("" if not args.rerank else f", {stage}")
    elif args.hybrid:
        stage = f"+ BM25 ({args.hybrid})" + ("" if not args.rerank else f", {stage}")
    if (searcher.backend.name != "exact" or args.hybrid) and systems not in (("sparse",), ("multivector",)):
        stage = f"{searcher.backend.name} {stage}"
    for query, hits in zip(queries, results):
        print(f"{query}  ({stage}; retrieve {searcher.timings['retrieve_ms']:.0f} ms, "
              f"rerank {searcher.timings['rerank_ms']:.0f} ms)")
        for h in hits:
            text = h.passage if len(h.passage) <= 100 else h.passage[:97] + "..."
            where = "" if (h.start, h.end) == (0, len(h.text)) else f" {h.start}:{h.end}"  # a whole document
            print(f"  {h.rank:3d}  {h.score:8.4f}  [{h.id}{where}] {text}")
