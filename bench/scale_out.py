"""Scale-out overhead on one machine: Ray Data against the single-process file job, and replicas
behind nginx against one server. On 2 cores overhead, not speed-up, is what can be shown.

(a) files  every passage of the built-in corpora (BBC News, People's Daily, the Chinese reviews)
           cut at 126 pieces by all-MiniLM-L6-v2's tokenizer (50,139; --passages takes a prefix),
           as JSON Lines, embedded by MiniLM at --precision, each way timed end to end as a
           command (start-up and model loads included):
             single  `bertkit embed --input … --out X.npy --threads 2` (the file job, 1 process);
             ray     `bertkit embed --input … --out DIR --ray --ray-actors 2 --ray-actor-cpus 1`
                     (a local Ray started by the command: 2 actors of 1 thread each).
           passages/s, the ratio ray / single (goal ≥ 0.9), the largest difference between the
           shards and the .npy; for sizing a cluster of N machines: an actor's peak resident
           memory (sampled from /proc while it runs) and the model's load time in a fresh process.
(b) serve  two `bertkit serve --threads 1` behind nginx (docs/scaling.md's configuration) against
           one `bertkit serve --threads 2`: --clients concurrent clients, one passage per request,
           --requests requests in all; requests/s and statuses.

    python bench/scale_out.py [--passages 50139] [--precision int8] [--clients 16] [--requests 4000]

Run it on a quiet machine: the two sides run one after the other, never at once. Needs the `ray`
extra, httpx, and nginx (Debian: nginx-light) for (b). Last line: one JSON object with every figure.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # web_fixtures: `bertkit serve` processes and nginx, as the tests run them

from retrieval_scale import MINILM, real_texts  # noqa: E402  (this directory: the same passages)

from web_fixtures import NGINX, free_port, nginx, serve_process  # noqa: E402

BERTKIT = [sys.executable, "-m", "bertkit.cli"]


def passages(n: int | None) -> list[str]:
    """The built-in corpora's passages of ≤ 126 pieces, in corpus order (the first n)."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.retrieval.passages import split_passages, tokenize_documents

    tokenizer, out = BertTokenizer.from_pretrained(MINILM), []
    for texts in real_texts().values():
        for text, (_, offsets, starts) in zip(texts, tokenize_documents(tokenizer, texts)):
            out.extend(text[p.start:p.end] for p in split_passages(text, offsets, starts, 126))
    return out[:n]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def actor_peak(stop: threading.Event, peak: dict[str, float]) -> None:
    """The largest resident memory of any ShardWriter actor, sampled every 0.2 s until `stop`."""
    while not stop.wait(0.2):
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and b"ShardWriter" in (entry / "cmdline").read_bytes():
                    peak["mib"] = max(peak.get("mib", 0.0), rss_mib(int(entry.name)))
            except OSError:
                continue


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return time.monotonic() - started


def files(args, work: Path, texts: list[str]) -> dict:
    from bertkit.ray import read_shards

    corpus = work / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["embed", str(MINILM), "--input", str(corpus), "--precision", args.precision, "--no-progress"]
    single = timed([*BERTKIT, *common, "--out", str(work / "single.npy"), "--threads", "2"], env)
    stop, peak = threading.Event(), {}
    sampler = threading.Thread(target=actor_peak, args=(stop, peak), daemon=True)
    sampler.start()
    try:
        ray = timed([*BERTKIT, *common, "--out", str(work / "shards"), "--ray", "--ray-actors", "2",
                     "--ray-actor-cpus", "1", "--ray-chunk-size", str(args.chunk_size)], env)
    finally:
        stop.set()
        sampler.join()
    _, vectors = read_shards(work / "shards")
    load = subprocess.run([sys.executable, "-c", "import time; t = time.monotonic(); "
                           "from bertkit.inference import Engine; "
                           f"Engine.load({str(MINILM)!r}, precision={args.precision!r}); "
                           "print(time.monotonic() - t)"], capture_output=True, text=True, check=True)
    n = len(texts)
    return {"passages": n, "precision": args.precision, "single_s": round(single, 1), "ray_s": round(ray, 1),
            "single_per_s": round(n / single, 1), "ray_per_s": round(n / ray, 1),
            "ratio": round(single / ray, 3),
            "max_abs_diff": float(np.abs(vectors - np.load(work / "single.npy")).max()),
            "actor_peak_mib": round(peak.get("mib", 0.0)), "model_load_s": round(float(load.stdout), 2)}


def load(url: str, texts: list[str], clients: int, requests: int) -> dict:
    """`requests` POST /embed of one text each from `clients` threads: requests/s and statuses."""
    import httpx

    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            for i in range(k, requests, clients):
                status = c.post("/embed", json={"inputs": texts[i % len(texts)], "truncate": True}).status_code
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    seconds = time.monotonic() - started
    return {"requests": requests, "seconds": round(seconds, 1), "per_s": round(requests / seconds, 1),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def serve(args, work: Path, texts: list[str]) -> dict:
    if NGINX is None:
        return {"skipped": "nginx is not installed (Debian: apt-get install nginx-light)"}
    base = [str(MINILM), "--port", "0", "--precision", args.precision]
    with serve_process([*base, "--threads", "2"]) as (_, url):
        one = load(url, texts, args.clients, args.requests)
    with serve_process([*base, "--threads", "1"]) as (_, a), serve_process([*base, "--threads", "1"]) as (_, b):
        prefix = work / "nginx"
        prefix.mkdir()
        with nginx(prefix, free_port(), [a.removeprefix("http://"), b.removeprefix("http://")]) as url:
            two = load(url, texts, args.clients, args.requests)
    return {"one_server_2_threads": one, "two_replicas_1_thread_nginx": two,
            "ratio": round(two["per_s"] / one["per_s"], 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, default=None, help="the first N passages (default: all 50,139)")
    p.add_argument("--precision", default="int8", choices=("fp32", "bf16", "int8"))
    p.add_argument("--chunk-size", type=int, default=2048, help="passages per Ray shard (2048)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--parts", nargs="+", default=["files", "serve"], choices=("files", "serve"))
    args = p.parse_args()
    texts = passages(args.passages)
    out = {"machine": f"{os.cpu_count()} cores", "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        if "files" in args.parts:
            out["files"] = files(args, Path(tmp), texts)
            f = out["files"]
            print(f"files: single {f['single_per_s']}/s, ray {f['ray_per_s']}/s (ratio {f['ratio']}, goal ≥ 0.9); "
                  f"actor peak {f['actor_peak_mib']} MiB, model load {f['model_load_s']} s", flush=True)
        if "serve" in args.parts:
            out["serve"] = serve(args, Path(tmp), texts)
            print(f"serve: {out['serve']}", flush=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
