"""Runs of queued jobs for several adapters of one base (and the base itself): the scheduler's
merged run when a group's jobs name different models (serve/adapters.py says how they are served)."""

from __future__ import annotations

from typing import Any, Sequence

from bertkit.adapters import mixed_embeddings, mixed_logits
from bertkit.inference.embed import resolve_pooling
from bertkit.serve.models import ServedModel
from bertkit.serve.runners import RUNNERS


def run_mixed(use: str, models: Sequence[ServedModel], key: tuple, items: Sequence[Any]) -> list[Any]:
    """RUNNERS[use]'s results for `items`, item i for `models[i]` (adapters of one base and the
    base itself): one engine run for embeddings and logits, one run per model otherwise."""
    engine = models[0].engine
    slots = [m.engine.adapter_slot for m in models]
    if use in ("logits", "embed"):  # token ids made on the tokenizing thread: (input_ids, token_type_ids)
        ids, types = [i[0] for i in items], [i[1] for i in items]
    if use == "logits":
        heads = {m.engine.adapter_slot: m.engine.model for m in models}
        if all(hasattr(h, "sentence_logits") and not getattr(h, "mean_pooling", False) for h in heads.values()):
            return mixed_logits(engine, ids, types, slots, heads)
    if use == "embed":
        modes = {resolve_pooling(m.engine, None, None)[0] for m in models}
        if len(modes) == 1:
            return mixed_embeddings(engine, ids, types, slots, modes.pop())
    out: list[Any] = [None] * len(items)
    members: dict[int, list[int]] = {}
    for i, model in enumerate(models):
        members.setdefault(id(model), []).append(i)
    for rows in members.values():
        for i, result in zip(rows, RUNNERS[use](models[rows[0]], key, [items[i] for i in rows])):
            out[i] = result
    return out
