"""Toy labelled data for the fine-tuning, LoRA and distillation tests: sentiment rows that a tiny
model learns in a few epochs, one polarity word among filler (a helper module, not collected)."""

from __future__ import annotations

import json
import random
from pathlib import Path

POS, NEG = ["great", "good", "excellent", "nice"], ["bad", "awful", "terrible", "poor"]
FILLER = ["the", "movie", "was", "very", "a", "film", "plot", "and"]


def sentiment_rows(n: int, seed: int, labelled: bool = True) -> list[dict]:
    """n rows {"text", "label": "pos" | "neg"} (no label when not `labelled`), the same for a seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        positive = rng.random() < 0.5
        words = [rng.choice(POS if positive else NEG)] + rng.choices(FILLER, k=5)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), **({"label": "pos" if positive else "neg"} if labelled else {})})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sentiment_file(path: Path, n: int, seed: int) -> Path:
    """`sentiment_rows(n, seed)` written to path as JSON Lines."""
    return write_jsonl(path, sentiment_rows(n, seed))
