"""Sentence embeddings: pooled last hidden states, one vector per text."""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from bertkit.constants import POOLINGS
from bertkit.encoder.model import encoder_of
from bertkit.encoder.packing import mean_pool
from bertkit.inference.common import Ids, Use, as_texts, engine_for, run_ids
from bertkit.inference.engine import Batch, Engine


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
    return mean_pool(hidden, packed)  # (B, H)


def embed(model: Engine | str | os.PathLike, texts: str | Sequence[str], *, pooling: str | None = None,
          normalize: bool | None = None, prompt: str = "", truncate_dim: int | None = None,
          **options: Any) -> torch.Tensor:
    """Sentence embeddings (N, H) float32 on the CPU, in the order of `texts`.

    model: an Engine, or a model dir (any BERT checkpoint; `options` go to `Engine.load`).
    pooling / normalize: None = the model's own sentence-transformers settings
    (1_Pooling/config.json, a Normalize module) when it has them, else mean pooling, unit length.
    prompt: text put before every input (`resolve_prompt` finds a model's named ones).
    truncate_dim: keep the first dimensions (Matryoshka), unit length again when normalized (as
    TEI's `dimensions`).
    """
    engine = engine_for(model, "embed", **options)
    if prompt and engine.pooling is not None and not engine.pooling.include_prompt:
        raise ValueError("this model's pooling leaves a prompt's tokens out (include_prompt false in its "
                         "Pooling config), which bertkit does not implement; embed without a prompt")
    texts = [prompt + text for text in as_texts(texts)] if prompt else as_texts(texts)
    mode, unit = resolve_pooling(engine, pooling, normalize)
    encoder = encoder_of(engine.model)
    out = torch.empty(len(texts), engine.config.hidden_size)

    def head(_model, batch: Batch) -> torch.Tensor:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return pool(hidden, batch, mode)

    for index, vectors in engine.run_encodings(engine.encode(texts), head):
        out[index] = vectors.cpu()
    if truncate_dim is not None:
        if not 0 < truncate_dim <= out.shape[1]:
            raise ValueError(f"truncate_dim must be in 1..{out.shape[1]}, got {truncate_dim}")
        out = out[:, :truncate_dim]
    return F.normalize(out, dim=-1) if unit else out


def resolve_prompt(settings: dict[str, Any], prompt_name: str | None = None, prompt: str | None = None) -> str:
    """The text to put before every input, as sentence-transformers chooses it: `prompt` itself,
    else the named one of the model's prompts (`sentence_transformers_settings`), else the model's
    default_prompt_name's, else none."""
    if prompt is not None:
        return prompt
    prompts = settings.get("prompts") or {}
    name = prompt_name if prompt_name is not None else settings.get("default_prompt_name")
    if name is None:
        return ""
    if name not in prompts:
        known = ", ".join(map(repr, prompts)) or "none (no config_sentence_transformers.json prompts)"
        raise ValueError(f"unknown prompt_name {name!r}; this model's prompts: {known}")
    return prompts[name]


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


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs, the exported graph
# ---------------------------------------------------------------------------------------------
def embed_chunk(engine: Engine, options: dict[str, Any]):
    """Records → (n, H) float32 NumPy rows, as `embed` gives them."""
    return lambda records: embed(engine, [r.text for r in records], **options).numpy()


def run_pooled(engine: Engine, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(H,) float32 pooled vector per sequence, not normalized (each request decides).
    key: () pools as the model does, (mode,) by `mode` (an index built with another --pooling)."""
    mode = key[0] if key else resolve_pooling(engine, None, None)[0]
    encoder = encoder_of(engine.model)

    def head(_model, batch) -> torch.Tensor:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return pool(hidden, batch, mode).cpu()  # (B, H)

    return run_ids(engine, items, head)


def run_token_vectors(engine: Engine, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(T, H) float32 last-layer state of every token of each sequence, specials included (TEI's /embed_all)."""
    encoder = encoder_of(engine.model)

    def head(_model, batch) -> list[torch.Tensor]:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return batch.split(hidden.float().cpu())  # [(T_i, H)]

    return run_ids(engine, items, head)


USE = Use("embed", embed, chunk=embed_chunk, runner=run_pooled, outputs=("last_hidden_state",),
          graph=lambda model, hidden: (hidden,), npy=True)
