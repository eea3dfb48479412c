"""fp32 GEMM rate of all-MiniLM-L6-v2's own shapes against the 1024³ probe `bench/infer.py` uses as its peak.

    python bench/gemm_shapes.py [--threads 2]

Each encoder layer multiplies tokens × 384 by 384 × 1152 (Q, K, V), 384 × 384 (attention output),
384 × 1536 (FFN in) and tokens × 1536 by 1536 × 384 (FFN out). If these ran far below the square
probe, an MFU short of the peak would be the shapes' fault; printed per token count: each shape's
GFLOP/s and their FLOP-weighted mean as a share of the probe (fastest of 8 calls each).
"""

from __future__ import annotations

import argparse
import time

import torch

LAYER = [(384, 1152), (384, 384), (384, 1536), (1536, 384)]  # (in, out) of each Linear in a layer


def rate(m: int, k: int, n: int, reps: int = 8) -> float:
    """GFLOP/s of (m, k) @ (k, n), the fastest of `reps` calls after two warm-ups."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak = rate(1024, 1024, 1024)
    print(f"1024³: {peak:.0f} GFLOP/s ({args.threads} threads)")
    for tokens in (256, 1024, 4096):
        rates = [rate(tokens, k, n) for k, n in LAYER]
        flops = [k * n for k, n in LAYER]
        mean = sum(flops) / sum(f / r for f, r in zip(flops, rates))  # time-weighted: FLOPs / seconds
        shapes = ", ".join(f"{k}→{n} {r:.0f}" for (k, n), r in zip(LAYER, rates))
        print(f"tokens {tokens}: {shapes}; a layer's GEMMs {mean:.0f} GFLOP/s = {mean / peak:.0%} of the 1024³ rate")


if __name__ == "__main__":
    main()
