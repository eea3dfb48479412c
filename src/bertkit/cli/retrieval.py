"""bertkit index and bertkit search: a corpus embedded into an index, queried, optionally reranked."""

from __future__ import annotations

import argparse

from bertkit.cli.common import BATCH_TOKENS_HELP, add_engine_arguments, print_json


def add(sub: argparse._SubParsersAction) -> None:
    _add_index(sub)
    _add_search(sub)


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="embed a corpus into a search index (vectors + documents + model)",
                       description="Stream CORPUS (jsonl rows with id and text, or txt: a document a "
                       "line, its id the line number) through a bi-encoder into OUT: vectors.npy, "
                       "docs.jsonl, index.json (the model and its fingerprint). Bad rows are named "
                       "and skipped; --resume continues a killed build.")
    p.add_argument("corpus", help="corpus file (.jsonl or .txt)")
    p.add_argument("--model", required=True, help="bi-encoder model dir (any BERT; its own pooling)")
    p.add_argument("--out", required=True, help="index directory")
    p.add_argument("--text-field", default="text", help="jsonl key of the text (text)")
    p.add_argument("--id-field", default="id", help="jsonl key of the id (id; else the line number)")
    p.add_argument("--pooling", choices=["mean", "cls", "max"], default=None,
                   help="default: the model's sentence-transformers pooling, else mean")
    p.add_argument("--resume", action="store_true", help="continue a killed build")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")
    add_engine_arguments(p, max_batch_tokens_help=BATCH_TOKENS_HELP,
                         max_length_help="tokens per document (the model's limit)")
    p.set_defaults(func=_run_index)


def _run_index(args: argparse.Namespace) -> None:
    from bertkit.retrieval import build_index

    summary = build_index(args.corpus, args.model, args.out, resume=args.resume,
                          overwrite=args.overwrite, progress=args.progress,
                          text_field=args.text_field, id_field=args.id_field, pooling=args.pooling,
                          precision=args.precision, max_batch_tokens=args.max_batch_tokens,
                          device=args.device,
                          **({"max_length": args.max_length} if args.max_length else {}))
    print(f"indexed {summary['rows']} documents ({summary['dim']} dims, {summary['skipped']} rows "
          f"skipped) into {summary['out']} in {summary['seconds']:.1f} s")


def _add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search an index (exact inner product), optionally reranked",
                       description="Embed each query with the index's own model (another --model is "
                       "refused unless it is the same model), take the best --candidates documents "
                       "by inner product and, with --rerank, order them by a cross-encoder.")
    p.add_argument("index", help="index directory made by `bertkit index`")
    p.add_argument("queries", nargs="+", help="query texts")
    p.add_argument("--rerank", default=None, help="cross-encoder dir to rerank the candidates")
    p.add_argument("--rerank-max-length", type=int, default=None,
                   help="pieces per query + document pair (default: the length it was trained at)")
    p.add_argument("--top-k", type=int, default=10, help="results per query (10)")
    p.add_argument("--candidates", type=int, default=100, help="first-stage results to rerank (100)")
    p.add_argument("--rerank-weight", type=float, default=1.0,
                   help="order by W · reranker + (1 − W) · first stage, each standardised over a "
                   "query's candidates (1: the reranker alone; pick W on dev queries)")
    p.add_argument("--model", default=None, help="query model (default: the index's; must be the same)")
    add_engine_arguments(p)
    p.add_argument("--json", action="store_true", help="one JSON object per query")
    p.set_defaults(func=_run_search)


def _run_search(args: argparse.Namespace) -> None:
    from bertkit.retrieval import Searcher

    searcher = Searcher.open(args.index, model=args.model, rerank=args.rerank,
                             rerank_max_length=args.rerank_max_length,
                             precision=args.precision, device=args.device)
    results = searcher.search(args.queries, top_k=args.top_k, candidates=args.candidates,
                              rerank_weight=args.rerank_weight)
    if args.json:
        return print_json({"query": q, "hits": [h.to_dict() for h in hits]}
                          for q, hits in zip(args.queries, results))
    stage = ("inner product" if not args.rerank else "reranked" if args.rerank_weight == 1.0
             else f"reranked, fused at weight {args.rerank_weight:g}")
    for query, hits in zip(args.queries, results):
        print(f"{query}  ({stage}; retrieve {searcher.timings['retrieve_ms']:.0f} ms, "
              f"rerank {searcher.timings['rerank_ms']:.0f} ms)")
        for h in hits:
            text = h.text if len(h.text) <= 100 else h.text[:97] + "..."
            print(f"  {h.rank:3d}  {h.score:8.4f}  [{h.id}] {text}")
