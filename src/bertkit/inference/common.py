"""What the uses share: the record of a use's behaviour (`Use`), turning the caller's model
argument into an engine, checking texts, running token ids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from bertkit.inference.engine import Engine

# Token ids of one sequence made on a service's tokenizing thread: (input_ids, token_type_ids),
# special tokens included.
Ids = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Use:
    """One use of the engine and what it does beyond its function, in every place it runs.

    Each use module (embed.py, classify.py, ...) exposes its record next to its function;
    `inference/uses.py` gathers them. The head a use loads and the routes it adds are the head
    table's (`encoder.tasks.USES`).
    """

    name: str  # "ner", a name of `constants.USES`
    function: Callable[..., Any]  # the library function: ner(model, texts, ...)
    # A file's chunk: (engine, the use's options) → a function from a chunk of `files.Record`s to
    # one result per record (JSON Lines objects, or an (n, H) array for a .npy output).
    chunk: Callable[[Engine, dict[str, Any]], Callable[[list], Any]]
    # A service's merged run: (engine, the options the merged requests share, their inputs in
    # order: token ids or texts) → one result per input, each as the library gives it alone.
    runner: Callable[[Engine, tuple, Sequence[Any]], list[Any]]
    # The exported graph (`bertkit export`): its output names, and how they come from the last
    # hidden states of a padded batch, (model, (B, T, H)) → the outputs; () / None: not exported.
    outputs: tuple[str, ...] = ()
    graph: Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, ...]] | None = None
    npy: bool = False  # a file's results may be one NumPy array (.npy) besides JSON Lines
    # Refuses a file reading the use cannot run, before the model loads: (pair_field, fmt) → None.
    check_file: Callable[[str | None, str], None] | None = None
    # How `predict` reads a file for a fine-tuned task of this use: (task, path, its suffix, fmt,
    # the caller's columns, stride, finetune_config.json's settings) → (format, the reading's
    # fields, the use's options); None: `predict` does not run it.
    predict_reading: Callable[..., tuple[str, dict[str, Any], dict[str, Any]]] | None = None


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


def run_ids(engine: Engine, items: Sequence[Ids], head: Callable) -> list[Any]:
    """`head(model, batch)`'s per-sequence results for token ids (`Ids`), in input order."""
    return engine.run_ordered([i[0] for i in items], [i[1] for i in items], head)


def column(columns: dict[str, str | None], saved: dict[str, Any], key: str, default: str) -> str:
    """A column `predict` reads: the caller's, else the one fine-tuning recorded, else `default`."""
    return columns[key] or saved.get(key) or default
