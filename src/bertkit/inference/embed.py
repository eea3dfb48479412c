"""Sentence embeddings: pooled last hidden states, one vector per text."""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from bertkit.inference.common import as_texts, engine_for
from bertkit.inference.engine import Batch, Engine
from bertkit.model import encoder_of

POOLINGS = ("mean", "cls", "max")


def pool(hidden: torch.Tensor, batch: Batch, mode: str) -> torch.Tensor:
    """(N, H) packed token states → (B, H) one vector per sequence, in fp32.

    mean: average over every token, [CLS] and [SEP] included, as sentence-transformers does
    (its attention mask covers them); cls: the [CLS] state; max: elementwise max over tokens.
    """
    packed = batch.packed
    hidden = hidden.float()
    if mode == "cls":
        return hidden[packed.starts]  # (B, H)
    lengths = torch.tensor(packed.lengths, device=hidden.device)
    if mode == "max":
        return torch.segment_reduce(hidden, "max", lengths=lengths, axis=0)  # (B, H)
    sums = hidden.new_zeros(len(packed.lengths), hidden.shape[1]).index_add_(0, packed.sequence_index, hidden)
    return sums / lengths[:, None].to(hidden.dtype)  # (B, H)


def embed(model: Engine | str | os.PathLike, texts: str | Sequence[str], *, pooling: str | None = None,
          normalize: bool | None = None, **options: Any) -> torch.Tensor:
    """Sentence embeddings (N, H) float32 on the CPU, in the order of `texts`.

    model: an Engine, or a model dir (any BERT checkpoint; `options` go to `Engine.load`).
    pooling / normalize: None = the model's own sentence-transformers settings
    (1_Pooling/config.json, a Normalize module) when it has them, else mean pooling, unit length.
    """
    engine = engine_for(model, "embed", **options)
    texts = as_texts(texts)
    mode, unit = resolve_pooling(engine, pooling, normalize)
    encoder = encoder_of(engine.model)
    out = torch.empty(len(texts), engine.config.hidden_size)

    def head(_model, batch: Batch) -> torch.Tensor:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return pool(hidden, batch, mode)

    for index, vectors in engine.run_encodings(engine.encode(texts), head):
        out[index] = vectors.cpu()
    return F.normalize(out, dim=-1) if unit else out


def resolve_pooling(engine: Engine, pooling: str | None, normalize: bool | None) -> tuple[str, bool]:
    own = engine.pooling
    mode = pooling or (own.mode if own else "mean")
    if mode not in POOLINGS:
        raise ValueError(f"unknown pooling {mode!r}; use one of {', '.join(POOLINGS)}")
    unit = normalize if normalize is not None else (own.normalize if own else True)
    return mode, unit


def similarity(model: Engine | str | os.PathLike, texts: Sequence[str], **options: Any) -> torch.Tensor:
    """Cosine similarity matrix (N, N) of the texts' embeddings."""
    vectors = embed(model, texts, normalize=True, **options)
    return vectors @ vectors.T
