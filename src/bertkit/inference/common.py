"""What the uses share: turning the caller's model argument into an engine, checking texts."""

from __future__ import annotations

import os
from typing import Any, Sequence

from bertkit.inference.engine import Engine


def engine_for(model: "Engine | str | os.PathLike", use: str, **options: Any) -> Engine:
    """An Engine as it is, or one loaded for `use` from a model directory."""
    if isinstance(model, Engine):
        if options:
            raise ValueError(f"options {sorted(options)} apply when loading a model dir; set them "
                             "on the Engine instead")
        return model
    if isinstance(model, (str, os.PathLike)):
        return Engine.load(model, use=use, **options)
    raise TypeError(f"expected an Engine or a model directory, got {type(model).__name__}")


def as_texts(texts: str | Sequence[str], what: str = "text") -> list[str]:
    """A non-empty list of non-empty strings (a single string becomes a list of one)."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError(f"no {what}s given")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"{what} {i} is a {type(text).__name__}, not a string")
        if not text.strip():
            raise ValueError(f"{what} {i} is empty")
    return texts
