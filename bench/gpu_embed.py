"""Embeddings on one device, bertkit's engine vs sentence-transformers, side by side.

For a lent GPU (`bench/gpu.sh` runs it with `--device cuda`): all-MiniLM-L6-v2 over the first N
BBC sentences (the texts of bench/infer.py's workload a), bertkit at each precision the device
runs (CUDA 16-bit: the variable-length flash kernel of `Model.forward_packed`) against
sentence-transformers' `encode` (batch 32, fp32 and, with `torch_dtype`, bf16). Each side is timed
over the whole set after a warm-up, the device synchronised before the clock stops; the fastest of
--repeats is kept. Rows: sentences/s and the minimum cosine against sentence-transformers fp32.
Last line: `speedup vs sentence-transformers: fp32 X×, bf16 Y×` (same precision on both sides).

    python bench/gpu_embed.py --device cuda              # on the GPU machine
    python bench/gpu_embed.py --device cpu --sentences 500   # the same code path, here
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from infer import bbc_sentences, minilm_dir  # noqa: E402

ST_BATCH = 32


def timed(run, device: str, repeats: int) -> tuple[float, np.ndarray]:
    """(fastest seconds, outputs) of run() over `repeats` passes, after one warm-up pass."""
    run()
    best, out = float("inf"), None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, np.asarray(out, dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sentences", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --device cpu")
    from sentence_transformers import SentenceTransformer

    from bertkit.inference import Engine, embed

    model_dir = minilm_dir()
    texts = bbc_sentences(args.sentences)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{name}; all-MiniLM-L6-v2, {len(texts):,} BBC sentences; fastest of {args.repeats}")
    rows, reference = [], None
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        peer = SentenceTransformer(str(model_dir), device=args.device, model_kwargs={"torch_dtype": dtype})
        seconds, vectors = timed(partial(peer.encode, texts, batch_size=ST_BATCH, convert_to_numpy=True,
                                         show_progress_bar=False), args.device, args.repeats)
        reference = vectors if reference is None else reference
        rows.append((f"sentence-transformers {precision}", precision, seconds, vectors))
        engine = Engine.load(model_dir, use="embed", precision=precision, device=args.device)
        seconds, vectors = timed(lambda e=engine: embed(e, texts).float().cpu(), args.device, args.repeats)
        rows.append((f"bertkit {precision}", precision, seconds, vectors))
        del peer, engine
    print(f"{'side':<28} {'sentences/s':>12} {'min cos vs st fp32':>19}")
    rate = {}
    for label, _, seconds, vectors in rows:
        cos = (vectors * reference).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))
        rate[label] = len(texts) / seconds
        print(f"{label:<28} {rate[label]:>12,.1f} {cos.min():>19.5f}")
    print("speedup vs sentence-transformers: " + ", ".join(
        f"{p} {rate[f'bertkit {p}'] / rate[f'sentence-transformers {p}']:.2f}×" for p in ("fp32", "bf16")))


if __name__ == "__main__":
    main()
