"""Sparse (SPLADE) retrieval from a masked-LM checkpoint against BM25, a dense bi-encoder, and
their hybrids, on a built-in retrieval set.

From one MLM checkpoint (`--mlm`: the demo's, made by `bertkit quickstart --lang zh|en`):

  bm25          bertkit.retrieval.bm25 over the whole documents (the index's own)
  splade_0      the checkpoint's MLM head as it is, SPLADE-pooled (no retrieval training)
  splade        the checkpoint trained with `finetune --task sparse` (in-batch + BM25-mined
                negatives, FLOPS regulariser) on the set's train queries
  dense         the checkpoint trained with `finetune --task embed` on the same queries, same
                steps (mean pooling, in-batch negatives)
  hybrids       reciprocal-rank fusion (rrf) and equal-weight z-scores (zscore) of sparse +
                dense, and of all three (bertkit.retrieval.search, `systems`)

Every system searches one index (`bertkit index`: whole documents cut at --max-length pieces,
BM25 and the sparse side beside the dense vectors) for the --eval-queries first test queries
(one relevant document each): MRR@10 and nDCG@10, the average non-zero terms of queries and
documents, and queries/s (encode + search, one query batch, the process's threads). Last line:
one JSON object with every figure.

    nice python bench/sparse.py --lang zh --mlm runs/quickstart/model
    nice python bench/sparse.py --lang en --mlm runs/quickstart-en/model --epochs 1 --eval-queries 200  # short
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from bertkit.inference.sparse import embed_sparse
from bertkit.retrieval.datasets import load_retrieval
from bertkit.retrieval.index import build_index
from bertkit.retrieval.metrics import evaluate_run
from bertkit.retrieval.search import Searcher
from bertkit.retrieval.sparse import build_sparse
from bertkit.train.retrieval import finetune_retrieval
from bertkit.train.sparse import finetune_sparse

SETS = {"en": "en-news-retrieval", "zh": "zh-news-retrieval"}
SYSTEMS = {  # name → (systems, fusion)
    "bm25": (("bm25",), None),
    "splade": (("sparse",), None),
    "dense": (("dense",), None),
    "splade+dense rrf": (("dense", "sparse"), "rrf"),
    "splade+dense zscore": (("dense", "sparse"), "zscore"),
    "dense+bm25 rrf": (("dense", "bm25"), "rrf"),
    "splade+bm25 rrf": (("sparse", "bm25"), "rrf"),
    "all three rrf": (("dense", "bm25", "sparse"), "rrf"),
    "all three zscore": (("dense", "bm25", "sparse"), "zscore"),
}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def write_corpus(path: Path, corpus: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in corpus.items()),
                    encoding="utf-8")
    return path


def scored(searcher: Searcher, queries, qrels, systems, fusion, candidates: int) -> dict:
    """MRR@10 / nDCG@10 and queries/s of one system (or fusion) over the queries."""
    tick = time.perf_counter()
    found = searcher.search([q.text for q in queries], top_k=10, candidates=candidates, hybrid=fusion,
                            systems=systems)
    seconds = time.perf_counter() - tick
    run = {q.id: [h.id for h in hits] for q, hits in zip(queries, found)}
    metrics = evaluate_run(run, {q.id: qrels[q.id] for q in queries})
    return {"mrr@10": round(metrics["mrr@10"], 4), "ndcg@10": round(metrics["ndcg@10"], 4),
            "queries_per_s": round(len(queries) / seconds, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lang", choices=sorted(SETS), default="zh")
    p.add_argument("--mlm", required=True, help="masked-LM checkpoint dir (e.g. runs/quickstart/model)")
    p.add_argument("--out", default="runs/bench-sparse", help="work directory (models, index)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="both trainings (default: each one's own)")
    p.add_argument("--max-length", type=int, default=128, help="pieces per text, training and index")
    p.add_argument("--train-queries", type=int, default=None, help="first N train queries (default all)")
    p.add_argument("--eval-queries", type=int, default=500, help="first N test queries")
    p.add_argument("--candidates", type=int, default=100, help="documents per system fused by a hybrid")
    p.add_argument("--flops-query-weight", type=float, default=3e-4)
    p.add_argument("--flops-doc-weight", type=float, default=1e-4)
    p.add_argument("--reuse", action="store_true", help="keep trained models and index found in --out")
    args = p.parse_args()

    name = SETS[args.lang]
    out = Path(args.out) / args.lang
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {loadavg()} on {os.cpu_count()} cores", flush=True)
    data = load_retrieval(name)
    queries = data.queries["test"][:args.eval_queries]
    qrels = data.qrels("test")
    common = dict(model=args.mlm, train=f"builtin:{name}", epochs=args.epochs, batch_size=args.batch_size,
                  max_length=args.max_length, max_train_examples=args.train_queries, eval="", progress=False,
                  overwrite=True, **({"lr": args.lr} if args.lr else {}))
    timings = {}
    for kind, trainer, extra in (("splade", finetune_sparse, dict(flops_query_weight=args.flops_query_weight,
                                                                   flops_doc_weight=args.flops_doc_weight)),
                                 ("dense", finetune_retrieval, dict(task="embed"))):
        model_dir = out / kind
        if args.reuse and (model_dir / "eval.json").is_file():
            continue
        tick = time.perf_counter()
        summary = trainer(out_dir=model_dir, **common, **extra)
        timings[f"train_{kind}_s"] = round(time.perf_counter() - tick, 1)
        print(f"{kind}: {summary['steps']} steps, loss {summary['first_loss']:.3f} → {summary['last_loss']:.3f} "
              f"in {timings[f'train_{kind}_s']} s", flush=True)

    index = out / "index"
    if not (args.reuse and (index / "sparse" / "sparse.json").is_file()):
        shutil.rmtree(index, ignore_errors=True)
        corpus = write_corpus(out / "corpus.jsonl", data.corpus)
        tick = time.perf_counter()
        build_index(corpus, out / "dense", index, progress=False, passage_tokens=0, max_length=args.max_length)
        build_sparse(index, out / "splade", progress=False)
        timings["index_s"] = round(time.perf_counter() - tick, 1)

    searcher = Searcher.open(index, sparse=True)
    side = searcher.sparse.index.meta
    results: dict[str, dict] = {}
    for label, (systems, fusion) in SYSTEMS.items():
        results[label] = scored(searcher, queries, qrels, systems, fusion, args.candidates)
        print(f"{label:22s} {results[label]}", flush=True)
    query_terms = float(np.mean([len(ix) for ix, _ in searcher.sparse.encode([q.text for q in queries])]))
    sparse_stats = {"query_terms": round(query_terms, 1), "document_terms": round(side["nnz"] / side["rows"], 1)}

    # The checkpoint's MLM head untrained, for what training adds (its own sparse side).
    zero = out / "index0"
    shutil.rmtree(zero, ignore_errors=True)
    shutil.copytree(index, zero, ignore=shutil.ignore_patterns("sparse"))
    build_sparse(zero, args.mlm, progress=False, max_length=args.max_length)
    untrained = Searcher.open(zero, sparse=True)
    results["splade_0 (untrained head)"] = scored(untrained, queries, qrels, ("sparse",), None, args.candidates)
    zero_side = untrained.sparse.index.meta
    zero_q = np.mean([len(ix) for ix, _ in embed_sparse(untrained.sparse.engine, [q.text for q in queries])])
    print(f"{'splade_0 (untrained)':22s} {results['splade_0 (untrained head)']}", flush=True)

    singles = {k: results[k]["mrr@10"] for k in ("bm25", "splade", "dense")}
    best_single = max(singles, key=singles.get)
    hybrid = max(("splade+dense rrf", "splade+dense zscore"), key=lambda k: results[k]["mrr@10"])
    goals = {"splade_vs_bm25_mrr@10": round(results["splade"]["mrr@10"] - results["bm25"]["mrr@10"], 4),
             "best_single": best_single,
             "hybrid": hybrid, "hybrid_gain_mrr@10": round(results[hybrid]["mrr@10"] - singles[best_single], 4)}
    print(f"\n{name}, {len(queries)} test queries against {len(data.corpus)} documents; splade: "
          f"{sparse_stats['query_terms']} terms a query, {sparse_stats['document_terms']} a document "
          f"(untrained head: {zero_q:.1f} / {zero_side['nnz'] / zero_side['rows']:.1f})")
    print("| system | MRR@10 | nDCG@10 | queries/s |\n|---|---:|---:|---:|")
    for label, r in results.items():
        print(f"| {label} | {r['mrr@10']:.3f} | {r['ndcg@10']:.3f} | {r['queries_per_s']} |")
    print(f"goals: splade − BM25 = {goals['splade_vs_bm25_mrr@10']:+.4f} MRR@10; best hybrid ({hybrid}) − best "
          f"single ({best_single}) = {goals['hybrid_gain_mrr@10']:+.4f}")
    print(f"load average at end: {loadavg()}")
    print(json.dumps({"set": name, "mlm": str(args.mlm), "queries": len(queries), "results": results,
                      "sparse": sparse_stats, "untrained_terms": [round(float(zero_q), 1),
                                                                  round(zero_side["nnz"] / zero_side["rows"], 1)],
                      "goals": goals, "timings": timings, "loadavg_end": loadavg(),
                      "settings": {k: v for k, v in vars(args).items()}}, ensure_ascii=False))


if __name__ == "__main__":
    main()
