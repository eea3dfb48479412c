"""Where the engine's time goes: torch.profiler's self CPU time per op over MiniLM embeddings.

    python bench/profile_engine.py                      # 1,500 BBC sentences, fp32, 2 threads
    python bench/profile_engine.py --sentences 3000 --precision int8

One warm-up pass, one timed pass without the profiler (sentences/s), one profiled pass; prints
the ops that took the most self CPU time, with their share and call count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infer import MINILM_MAX_LENGTH, bbc_sentences, minilm_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1500)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="ops listed (12)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from torch.profiler import ProfilerActivity, profile

    from bertkit.inference.embed import embed
    from bertkit.inference.engine import Engine

    texts = bbc_sentences(args.sentences)
    engine = Engine.load(minilm_dir(), use="embed", precision=args.precision, max_length=MINILM_MAX_LENGTH)
    embed(engine, texts[:200])
    start = time.perf_counter()
    embed(engine, texts)
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        embed(engine, texts)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{args.precision}, {args.threads} threads: {len(texts) / wall:.1f} sentences/s unprofiled; "
          f"self CPU time {total / 1e6:.2f} s profiled")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
        print(f"{e.key[:60]:60s} {100 * e.self_cpu_time_total / total:5.1f}%  {e.count} calls")


if __name__ == "__main__":
    main()
