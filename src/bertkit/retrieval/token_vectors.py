"""Where a multi-vector index's token vectors come from: one table, keyed by kind.

| kind           | model                        | vectors of a text                                  |
|----------------|------------------------------|----------------------------------------------------|
| `token-states` | any BERT (embed use)         | every token's last hidden state, unit rows         |
| `colbert`      | ColBERT (PyLate's layout)    | its query / document vectors (`inference.colbert`) |
| `m3`           | BGE-M3 (colbert_linear.pt)   | its ColBERT vectors (`inference.m3`)               |

A kind is an encoder of texts into one (T_i, D) float32 array each (`encode(engine, texts,
is_query)`: a kind may read queries and documents differently, as ColBERT's [Q] / [D] markers
and query padding do) and the way to load its engine (`load(model_dir, **options)`); the index
and its search read only the table.

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
    # model_dir → None, or a ValueError naming what the kind needs: checked before anything is written
    check: Callable[[Any], None] = lambda model_dir: None


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


class ColbertEngine:
    """A ColBERT model's engine with its settings and projection, read once when it loads (queries
    are encoded per search); everything else is the engine's (`model_dir`, `tokenizer`, ...)."""

    def __init__(self, colbert: Any):
        self.colbert = colbert

    def __getattr__(self, name: str) -> Any:
        return getattr(self.colbert.engine, name)


def _check_colbert(model_dir: Any) -> None:
    from bertkit.encoder.sentence_transformers import ColbertSettings
    from bertkit.inference.colbert import LATE_INTERACTION_NEEDS

    if ColbertSettings.read(model_dir) is None:
        raise ValueError(f"{model_dir} is not a ColBERT model; --multi-vector colbert needs {LATE_INTERACTION_NEEDS}")


def _load_colbert(model_dir: Any, **options: Any) -> ColbertEngine:
    from bertkit.inference.colbert import Colbert

    _check_colbert(model_dir)
    return ColbertEngine(Colbert.of(_load_states(model_dir, **options)))


def _colbert_vectors(engine: ColbertEngine, texts: Sequence[str], is_query: bool) -> list[np.ndarray]:
    return [v.numpy() for v in engine.colbert.encode(list(texts), is_query=is_query)]


def _check_m3(model_dir: Any) -> None:
    from bertkit.encoder.m3 import has_m3_heads

    if not has_m3_heads(model_dir):
        raise ValueError(f"{model_dir} has no BGE-M3 heads; --multi-vector m3 needs colbert_linear.pt and "
                         "sparse_linear.pt (or their .safetensors) beside the weights")


def _load_m3(model_dir: Any, **options: Any):
    _check_m3(model_dir)
    return _load_states(model_dir, **options)


def _m3_vectors(engine: Any, texts: Sequence[str], is_query: bool) -> list[np.ndarray]:
    """M3 reads queries and documents alike."""
    from bertkit.inference.m3 import encode_m3

    return [v.float().numpy() for v in encode_m3(engine, list(texts), ("colbert",))["colbert"]]


TOKEN_VECTORS: dict[str, TokenVectorKind] = {k.name: k for k in (
    TokenVectorKind("token-states", "a model's last hidden state per token, normalised", _load_states,
                    _token_states, lambda engine: engine.config.hidden_size, shares_dense_engine=True),
    TokenVectorKind("colbert", "a ColBERT model's projected token vectors (PyLate's layout)", _load_colbert,
                    _colbert_vectors, lambda engine: engine.colbert.dimension, shares_dense_engine=False,
                    check=_check_colbert),
    TokenVectorKind("m3", "BGE-M3's ColBERT vectors (colbert_linear)", _load_m3, _m3_vectors,
                    lambda engine: engine.m3.colbert_dim, shares_dense_engine=False, check=_check_m3),
)}


def token_vector_kind(name: str) -> TokenVectorKind:
    if name not in TOKEN_VECTORS:
        raise ValueError(f"unknown token-vector kind {name!r}; choose one of {', '.join(TOKEN_VECTORS)}")
    return TOKEN_VECTORS[name]
