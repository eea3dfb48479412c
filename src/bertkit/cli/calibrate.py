"""bertkit calibrate: static int8's activation ranges measured on text, saved with the model."""

from __future__ import annotations

import argparse
import json


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure static int8's activation ranges on text; write the "
                       "model with them (then --precision int8-static)")
    p.add_argument("model", help="model directory")
    p.add_argument("--calibration", required=True, metavar="FILE",
                   help="text to calibrate on: one text a line (.txt) or a text field a line (.jsonl); "
                   "a few hundred sentences like the ones the model will see")
    p.add_argument("--out", required=True, help="new directory: the model's files plus int8_static.safetensors "
                   "and int8_static.json")
    p.add_argument("--held-out", type=float, default=0.1,
                   help="share of the texts kept out of calibration to measure accuracy on (0.1)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier --out")
    p.add_argument("--max-batch-tokens", type=int, default=8192, help="real tokens per batch (8192)")
    p.set_defaults(func=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> None:
    from bertkit.inference.calibrate import calibrate

    manifest = calibrate(args.model, args.calibration, args.out, held_out=args.held_out,
                         max_batch_tokens=args.max_batch_tokens, overwrite=args.overwrite)
    held, cal = manifest["held_out"], manifest["calibration"]
    print(f"calibrated {manifest['linears']} Linear layers on {cal['texts']:,} texts ({cal['tokens']:,} tokens) "
          f"→ {args.out}" + (f" ({cal['skipped_rows']:,} bad row{'' if cal['skipped_rows'] == 1 else 's'} skipped)"
             if cal["skipped_rows"] else ""))
    print(f"held out {held['texts']:,} texts: cosine to fp32 min {held['min_cosine']:.4f}, "
          f"mean {held['mean_cosine']:.4f}")
    print(json.dumps(manifest, ensure_ascii=False))
