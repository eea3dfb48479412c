"""How each use runs the inputs of several requests as one call of the engine.

A runner takes a model, the options its requests share (`key`) and the inputs of all of them
in order, and returns one result per input. Embeddings and classifier logits start from token
ids made on the tokenizing thread and go through `Engine.run` with the same head the library's
`embed` / `classify` use; fill-mask, NER and QA call the library functions on the merged texts
(their windows and word handling live there). Either way the engine makes each sequence's
result independent of its neighbours, so a request's answer equals the library's for it alone.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from bertkit.encoder.model import encoder_of
from bertkit.inference import fill_mask, ner, qa
from bertkit.inference.embed import pool, resolve_pooling
from bertkit.inference.sparse import splade_weights
from bertkit.serve.models import ServedModel

Ids = tuple[list[int], list[int]]  # (input_ids, token_type_ids) of one sequence, specials included


def _run_ids(model: ServedModel, items: Sequence[Ids], head: Callable) -> list[torch.Tensor]:
    return model.engine.run_ordered([i[0] for i in items], [i[1] for i in items], head)


def run_embed(model: ServedModel, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(H,) float32 pooled vector per sequence, not normalized (each request decides).
    key: () pools as the model does, (mode,) by `mode` (an index built with another --pooling)."""
    mode = key[0] if key else resolve_pooling(model.engine, None, None)[0]
    encoder = encoder_of(model.engine.model)

    def head(_model, batch) -> torch.Tensor:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return pool(hidden, batch, mode).cpu()  # (B, H)

    return _run_ids(model, items, head)


def run_token_vectors(model: ServedModel, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(T, H) float32 last-layer state of every token of each sequence, specials included (TEI's /embed_all)."""
    encoder = encoder_of(model.engine.model)

    def head(_model, batch) -> list[torch.Tensor]:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return batch.split(hidden.float().cpu())  # [(T_i, H)]

    return _run_ids(model, items, head)


def run_logits(model: ServedModel, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(K,) float32 classifier logits per sequence (a text or a pair)."""

    def head(m, batch) -> torch.Tensor:
        return m.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).logits.float().cpu()

    return _run_ids(model, items, head)


def run_fill_mask(model: ServedModel, key: tuple, texts: Sequence[str]) -> list[list[list[dict]]]:
    top_k, targets = key
    found = fill_mask(model.engine, list(texts), top_k=top_k, targets=list(targets) if targets else None)
    return [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in mask] for mask in text]
            for text in found]


def run_ner(model: ServedModel, key: tuple, texts: Sequence[str]) -> list[list[dict]]:
    return ner(model.engine, list(texts))


def run_qa(model: ServedModel, key: tuple, pairs: Sequence[tuple[str, str]]) -> list[list[dict]]:
    top_k, max_answer_length, allow_no_answer = key
    return qa(model.engine, [q for q, _ in pairs], [c for _, c in pairs], top_k=top_k,
              max_answer_length=max_answer_length, allow_no_answer=allow_no_answer)


def run_embed_sparse(model: ServedModel, key: tuple, items: Sequence[Ids]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(indices, values) SPLADE weights per sequence, with the model's own pooling settings."""
    pooling = model.splade
    return _run_ids(model, items, lambda m, batch: splade_weights(m, batch, pooling, None))


RUNNERS: dict[str, Callable[[ServedModel, tuple, Sequence[Any]], list[Any]]] = {
    "embed": run_embed, "token-vectors": run_token_vectors, "logits": run_logits,
    "fill-mask": run_fill_mask, "ner": run_ner, "qa": run_qa, "embed-sparse": run_embed_sparse,
}
