"""`bertkit calibrate`: a model directory with static int8's activation ranges saved beside its
weights (`backend.int8_static`), and the accuracy that costs, measured as NNCF reports it: the
min and mean cosine between fp32 and int8-static embeddings of held-out text.

The output directory is the model's files, copied unchanged, plus two of ours:
- `int8_static.safetensors`: each encoder Linear's input ranges (tensors only, never pickle);
- `int8_static.json`: how they were measured and on what, and the held-out accuracy.
`Engine.load(out, precision="int8-static")` (`--precision int8-static` on every use) reads them;
the same directory still loads in fp32, bf16 or dynamic int8, and in any tool that reads BERT.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from bertkit.backend.int8_static import ALPHA, MANIFEST_FILE, SCALES_FILE, calibration_texts
from bertkit.inference.embed import embed
from bertkit.inference.engine import DEFAULT_MAX_BATCH_TOKENS, Engine
from bertkit.util.fileio import atomic_write_json, check_writable_output, model_directory, staged_directory

HELD_OUT = 0.1  # the share of the calibration texts kept out of calibration to measure accuracy
MAX_HELD_OUT = 1000  # enough for a stable minimum; more only slows the command down


def held_out_split(texts: list[str], share: float = HELD_OUT) -> tuple[list[str], list[str]]:
    """texts → (to calibrate on, held out): the last `share` of them (at least 1, at most
    MAX_HELD_OUT) held out, so the accuracy is measured on text calibration never saw."""
    if not 0 < share < 1:
        raise ValueError(f"--held-out {share} must be between 0 and 1 (a share of the calibration texts, e.g. 0.1)")
    if len(texts) < 2:
        raise ValueError(f"{len(texts)} usable calibration text; calibrate needs at least 2 (one to calibrate "
                         "on, one held out to measure accuracy): give --calibration more lines")
    held = min(MAX_HELD_OUT, len(texts) - 1, max(1, round(len(texts) * share)))
    return texts[:-held], texts[-held:]


def calibrate(model_dir: str | os.PathLike, calibration: str | os.PathLike, out: str | os.PathLike, *,
              held_out: float = HELD_OUT, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
              overwrite: bool = False) -> dict[str, Any]:
    """Measure int8-static's ranges of `model_dir` on the texts of `calibration` (one a line, or
    .jsonl with a text field), write the model with them to `out` (a new or empty directory;
    overwrite: one that holds files of the same names, which are replaced) and return the manifest
    written there (accuracy under "held_out")."""
    out = check_writable_output(out, overwrite=overwrite, kind="dir")
    model_dir = model_directory(model_dir)
    if out.resolve() == model_dir.resolve():
        raise ValueError(f"--out {out} is the model directory itself; the original weights stay untouched: "
                         "choose another --out")
    texts, skipped = calibration_texts(calibration)
    train, held = held_out_split(texts, held_out)
    options = {"max_batch_tokens": max_batch_tokens}
    quantized = Engine.load(model_dir, "embed", precision="int8-static", calibration=train, **options)
    scales = quantized.int8_scales
    reference = embed(Engine.load(model_dir, "embed", precision="fp32", **options), held)  # (n, H)
    cosine = torch.nn.functional.cosine_similarity(reference, embed(quantized, held), dim=-1)  # (n,)
    manifest = {
        "precision": "int8-static",
        "weights": "int8, symmetric, one scale per output channel (of the smoothed weights)",
        "activations": "int8, asymmetric, one scale and zero point per Linear input: min/max over the "
                       "calibration tokens, after SmoothQuant smoothing",
        "smoothquant_alpha": scales.alpha,
        "linears": len(scales.channel_min),
        "calibration": {"source": str(calibration), "texts": len(train), "tokens": scales.tokens,
                        "skipped_rows": skipped},
        "held_out": {"texts": len(held), "min_cosine": round(cosine.min().item(), 6),
                     "mean_cosine": round(cosine.mean().item(), 6), "measured_on": "embed"},
        "model": str(model_dir),
    }
    _write(model_dir, out, scales, manifest)
    return manifest


def _write(model_dir: Path, out: Path, scales, manifest: dict) -> None:
    """The model's files and ours, assembled in a temp directory beside `out` and renamed onto it."""
    with staged_directory(out) as work:
        for entry in model_dir.iterdir():
            if entry.name in (SCALES_FILE, MANIFEST_FILE):
                continue  # an earlier calibration's: replaced by this one's
            copy = shutil.copytree if entry.is_dir() else shutil.copy2
            copy(entry, work / entry.name)
        scales.save(work)
        atomic_write_json(work / MANIFEST_FILE, manifest)


__all__ = ["ALPHA", "HELD_OUT", "calibrate", "held_out_split"]
