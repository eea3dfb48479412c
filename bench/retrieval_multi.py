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

"multi-vector, exact": the same late interaction over every passage's uncompressed token vectors
(float32, as the model gives them), the figure the compressed side (centroids + 2-bit residual
codes) is held to: at most a quarter of those bytes at 0.95 of that MRR@10 or more.

--trained (en-news-deep): MiniLM fine-tuned two ways on the same rows, epochs, batch, length and
learning rate, then searched on one index of --docs documents: a dense bi-encoder (`finetune
--task embed`, in-batch negatives; the plain mnrl model of bench/embed_training.py, shared through
--work) and a ColBERT model (`finetune --task colbert --mine none`, in-batch negatives too), whose
vectors make the index's multi-vector side (`build_multivector(kind="colbert")`), searched
compressed and exactly. Its last line states both goals: the compressed side's bytes and MRR@10
against the exact one's, and ColBERT's MRR@10 against the dense model's + 3 points.

    python bench/retrieval_multi.py --docs 1000 --queries 100
    python bench/retrieval_multi.py --set zh-news-retrieval --docs 1000 --queries 100
    python bench/retrieval_multi.py --first-stage --docs 500 --queries 50
    python bench/retrieval_multi.py --trained --train-rows 256 --docs 300 --queries 100 --work runs/embed_training
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bertkit.inference import Engine
from bertkit.retrieval.bm25 import BM25
from bertkit.retrieval.datasets import load_retrieval
from bertkit.retrieval.index import build_index
from bertkit.retrieval.metrics import recall, reciprocal_rank
from bertkit.retrieval.multivector import build_multivector
from bertkit.retrieval.search import Searcher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_training import DEEP, Sizes, minilm, plain_model, train, train_rows  # noqa: E402

# The goals of the multi-vector side: bytes of the compressed index over the uncompressed token
# vectors', its MRR@10 over exact MaxSim's; ColBERT over the dense bi-encoder, in MRR@10 points.
MV_BYTES_SHARE, MV_MRR_SHARE, COLBERT_GAIN = 0.25, 0.95, 3.0


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
    return score_ids([[h.id for h in hs] for hs in hits], queries)


def score_ids(ranked: list[list[str]], queries) -> dict[str, float]:
    """MRR@10 and Recall@100 of each query's ranked document ids."""
    mrr = np.mean([reciprocal_rank(ids, q.relevant) for ids, q in zip(ranked, queries)])
    r100 = np.mean([recall(ids, q.relevant, 100) for ids, q in zip(ranked, queries)])
    return {"mrr@10": round(float(mrr), 4), "recall@100": round(float(r100), 4)}


def exact_row(searcher: Searcher, texts: list[str], queries) -> dict:
    """The index's multi-vector side searched exactly: every passage's uncompressed token vectors
    (its kind's encoder run again), MaxSim against each query's, a document scored by its best
    passage; bytes: those vectors as float32."""
    import torch

    from bertkit.inference.multivector import maxsim_scores
    from bertkit.retrieval.token_vectors import token_vector_kind

    side = searcher.multivector
    kind = token_vector_kind(side.index.meta["kind"])
    tick = time.perf_counter()
    texts_of_passages = list(corpus_passages(searcher.index.path))
    passages = [torch.from_numpy(v) for v in kind.encode(side.engine, texts_of_passages, False)]  # [(T_i, D)]
    encoded = time.perf_counter() - tick
    tick = time.perf_counter()
    ids, pdoc = searcher.index.ids(), searcher.index.passages[:, 0]
    ranked = []
    for q in side.encode(texts):  # (Q_i, D) each
        s = maxsim_scores(torch.from_numpy(q), passages).numpy()  # (P,) every passage
        best = np.full(len(ids), -np.inf, dtype=np.float32)
        np.maximum.at(best, pdoc, s)  # (documents,) each one's best passage
        ranked.append([ids[d] for d in np.argsort(-best, kind="stable")[:100]])
    qps = len(texts) / (time.perf_counter() - tick)
    held = sum(p.numel() for p in passages) * 4
    print(f"exact MaxSim: {len(passages)} passages re-encoded in {encoded:.1f} s", flush=True)
    return {"system": "multi-vector, exact", **score_ids(ranked, queries), "bytes": held, "queries/s": round(qps, 1)}


def compression_goal(compressed: dict, exact: dict) -> dict:
    """The compressed multi-vector side against the exact: bytes share and MRR@10 share."""
    size, quality = compressed["bytes"] / exact["bytes"], compressed["mrr@10"] / max(exact["mrr@10"], 1e-9)
    met = size <= MV_BYTES_SHARE and quality >= MV_MRR_SHARE
    return {"bytes_share": round(size, 4), "mrr_share": round(quality, 4), "met": met,
            "line": f"compressed multi-vector: 1/{1 / size:.1f} of the exact side's bytes, MRR@10 "
                    f"{compressed['mrr@10']:.3f} = {quality:.3f} of exact's {exact['mrr@10']:.3f} (goal <= 1/4 "
                    f"at >= {MV_MRR_SHARE}: {'met' if met else 'not met'})"}


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
    rows.append(exact_row(searcher, texts, queries))
    packed = compression_goal(rows[-2], rows[-1])
    for fusion in ("rrf", "weighted"):
        for systems in (["dense", "bm25"], ["dense", "multivector"], ["dense", "bm25", "multivector"]):
            hits, qps = timed(searcher, texts, hybrid=fusion, candidates=100, systems=systems)
            rows.append({"system": f"{fusion} {'+'.join(systems)}", **score(hits, queries), "bytes": None,
                         "queries/s": round(qps, 1)})
    return rows + [{"goal": packed["line"]}]


def trained_run(args, model: Path, root: Path) -> list[dict]:
    """--trained: the dense bi-encoder and the ColBERT model fine-tuned alike (see the docstring)."""
    sizes = Sizes(args.train_rows, args.epochs, args.batch_size, args.max_length, args.seed)
    lr = args.lr or 2e-5  # the bi-encoder's default rate (sentence-transformers'), for both
    dense = plain_model(args.work, sizes)
    rows_file = train_rows(args.work, DEEP, sizes.train_rows)
    colbert = train(args.work, f"colbert-{DEEP}-{sizes.tag}-lr{lr:g}", sizes, rows_file, "--task", "colbert",
                    "--mine", "none", "--lr", lr)
    corpus, queries = subset(DEEP, args.docs, args.queries)
    texts = [q.text for q in queries]
    path = write_corpus(root / "corpus.jsonl", corpus)
    engine = Engine.load(dense, use="embed", max_length=args.max_length)
    build_index(path, engine, root / "ix", progress=False, bm25=False)
    searcher = Searcher.open(root / "ix", model=engine)
    hits, qps = timed(searcher, texts)
    rows = [{"system": f"dense, {dense.name}", **score(hits, queries), "bytes": searcher.index.vectors.nbytes,
             "queries/s": round(qps, 1)}]
    tick = time.perf_counter()
    mv = build_multivector(root / "ix", colbert, kind="colbert", nbits=args.mv_nbits)
    print(f"ColBERT side: {mv['tokens']} tokens, {mv['centroids']} centroids, {time.perf_counter() - tick:.1f} s",
          flush=True)
    searcher = Searcher.open(root / "ix", model=engine, multi_vector=True)
    hits, qps = timed(searcher, texts, systems=["multivector"])
    rows.append({"system": f"multi-vector, {colbert.name}", **score(hits, queries),
                 "bytes": searcher.multivector.index.memory_bytes(), "queries/s": round(qps, 1)})
    rows.append(exact_row(searcher, texts, queries))
    packed = compression_goal(rows[-2], rows[-1])
    gain = 100 * (rows[1]["mrr@10"] - rows[0]["mrr@10"])
    met = gain >= COLBERT_GAIN
    rows.append({"goal": packed["line"] + f"; ColBERT over dense: MRR@10 {rows[1]['mrr@10']:.3f} vs "
                 f"{rows[0]['mrr@10']:.3f}, {gain:+.1f} points (goal >= +{COLBERT_GAIN:g}: "
                 f"{'met' if met else 'not met'})"})
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
    g = p.add_argument_group("--trained: fine-tuned dense against fine-tuned ColBERT (en-news-deep)")
    g.add_argument("--trained", action="store_true")
    g.add_argument("--work", type=Path, default=Path(__file__).resolve().parent.parent / "runs" / "embed_training",
                   help="trained models, shared with bench/embed_training.py")
    g.add_argument("--train-rows", type=int, default=256)
    g.add_argument("--epochs", type=int, default=1)
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--lr", type=float, default=None, help="both models' rate (2e-5)")
    g.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.trained and args.set != DEEP:
        p.error(f"--trained trains and searches {DEEP}; leave --set out")
    model = minilm()
    run = first_stage_run if args.first_stage else trained_run if args.trained else systems_run
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(args, model, Path(tmp))
    for row in rows:  # a goal row last: the line that says what was met
        print(row["goal"] if "goal" in row else json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
