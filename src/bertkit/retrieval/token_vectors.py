"""Where a multi-vector index's token vectors come from: one table, keyed by kind.

| kind           | model                | vectors of a text                                                    |
|----------------|----------------------|----------------------------------------------------------------------|
| `token-states` | any BERT (embed use) | every token's last hidden state, [CLS] and [SEP] included, unit rows |

A kind is an encoder of texts into one (T_i, D) float32 array each (`encode(engine, texts,
is_query)`: a kind may read queries and documents differently, as ColBERT's [Q] / [D] markers
and query padding do) and the way to load its engine (`load(model_dir, **options)`). A
late-interaction encoder (ColBERT's projection, BGE-M3's colbert_linear) joins as one more row;
the index and its search read only the table.

`token-states` is the untrained baseline: a bi-encoder's own token states, scored by MaxSim
without a projection trained for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class TokenVectorKind:
    name: str
    description: str
    load: Callable[..., Any]  # (model_dir, **engine options) → an Engine
    encode: Callable[[Any, Sequence[str], bool], list[np.ndarray]]  # (engine, texts, is_query) → [(T_i, D)]
    dim: Callable[[Any], int]  # engine → D
    shares_dense_engine: bool  # its engine is the dense index's (the same model and use): loaded once


def _load_states(model_dir: Any, **options: Any):
    from bertkit.inference import Engine

    return Engine.load(model_dir, use="embed", **options)


def _token_states(engine: Any, texts: Sequence[str], is_query: bool) -> list[np.ndarray]:
    """(T_i, H) float32 unit rows per text: every token's last hidden state (queries and
    documents alike)."""
    import torch.nn.functional as F

    from bertkit.inference.embed import run_token_vectors

    encodings = engine.encode(list(texts))
    states = run_token_vectors(engine, (), [(e.ids, e.type_ids) for e in encodings])  # [(T_i, H)]
    return [F.normalize(s.float(), dim=-1).numpy() for s in states]


TOKEN_VECTORS: dict[str, TokenVectorKind] = {k.name: k for k in (
    TokenVectorKind("token-states", "a model's last hidden state per token, normalised", _load_states,
                    _token_states, lambda engine: engine.config.hidden_size, shares_dense_engine=True),
)}


def token_vector_kind(name: str) -> TokenVectorKind:
    if name not in TOKEN_VECTORS:
        raise ValueError(f"unknown token-vector kind {name!r}; choose one of {', '.join(TOKEN_VECTORS)}")
    return TOKEN_VECTORS[name]
