"""Each use over a file of any size: the per-chunk functions that `files.run_file` drives.

`run_use_on_file("embed", engine, "texts.jsonl", "vectors.npy")` streams the input, runs the
engine chunk by chunk and writes one ordered output (`.npy` for embeddings, else JSON Lines,
one object per usable input row with its source `line`); bad rows are named and skipped,
`resume=True` continues a killed run, and under torchrun the ranks split the input.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from bertkit.inference.classify import classify, rerank
from bertkit.inference.embed import embed
from bertkit.inference.engine import Engine
from bertkit.inference.fill_mask import fill_mask
from bertkit.inference.ner import ner
from bertkit.inference.qa import qa

USES = ("embed", "fill-mask", "classify", "ner", "qa", "rerank")


def chunk_function(use: str, engine: Engine, options: dict[str, Any]) -> Callable[[list], Any]:
    """The function from a chunk of `files.Record`s to their results, for `use`."""
    if use == "embed":
        return lambda records: embed(engine, [r.text for r in records], **options).numpy()
    if use == "fill-mask":
        return lambda records: [{"masks": [[dataclasses.asdict(c) for c in mask] for mask in masks]}
                                for masks in fill_mask(engine, [r.text for r in records], **options)]
    if use == "classify":
        def classify_chunk(records):
            pairs = [r.pair for r in records] if records[0].pair is not None else None
            return classify(engine, [r.text for r in records], pairs, **options)
        return classify_chunk
    if use == "ner":
        return lambda records: [{"entities": e} for e in ner(engine, [r.text for r in records], **options)]
    if use == "qa":
        return lambda records: [{"answers": a} for a in qa(engine, [r.text for r in records],
                                                            [r.pair for r in records], **options)]
    if use == "rerank":
        query = options.pop("query")

        def score_chunk(records):
            scored = rerank(engine, query, [r.text for r in records], **options)
            by_index = {s["index"]: s["score"] for s in scored}
            return [{"score": by_index[i]} for i in range(len(records))]
        return score_chunk
    raise ValueError(f"unknown use {use!r}; choose one of {', '.join(USES)}")


def run_use_on_file(use: str, engine: Engine, input_path: str | os.PathLike, out_path: str | os.PathLike,
                    *, text_field: str = "text", pair_field: str | None = None, resume: bool = False,
                    overwrite: bool = False, progress: bool = True, chunk_size: int = 1024,
                    fmt: str = "auto", **options: Any) -> dict[str, Any]:
    """Run `use` over every usable row of `input_path` into `out_path`; returns run_file's summary.

    options: the use's own keyword arguments (pooling, top_k, targets, query, ...). They, the
    model and the precision are recorded, so `resume` refuses to continue with other settings.
    """
    from bertkit.inference.files import run_file

    if use == "qa" and pair_field is None:
        raise ValueError("qa over a file needs the context column: pass --pair-field (e.g. context) "
                         "and --text-field for the question")
    out = Path(out_path)
    kind = "npy" if out.suffix == ".npy" else "jsonl"
    if kind == "npy" and use != "embed":
        raise ValueError(f"{out}: only embed writes .npy; give {use} a .jsonl output")
    settings = {"use": use, "model": str(Path(engine.model_dir).resolve()) if engine.model_dir else None,
                "precision": engine.precision, "max_length": engine.max_length,
                "truncate": engine.truncate, **options}
    return run_file(input_path, out, chunk_function(use, engine, dict(options)), kind=kind,
                    dim=engine.config.hidden_size if kind == "npy" else None, chunk_size=chunk_size,
                    resume=resume, overwrite=overwrite, progress=progress, settings=settings, fmt=fmt,
                    text_field=text_field, pair_field=pair_field, desc=use)
