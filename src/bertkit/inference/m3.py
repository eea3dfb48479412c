"""BGE-M3's three outputs from one forward pass, and its scores (FlagEmbedding's BGEM3FlagModel).

One packed forward of the encoder gives the last states (N, H); from them, per text:

    dense    the [CLS] state, unit length                                   (H,)
    sparse   lexical weights: ReLU(sparse_linear(h_i)) per token, the largest per token id, the
             [CLS], separator, padding and unknown ids dropped, zeros dropped   {id: weight}
    colbert  colbert_linear(h_i) for every token after [CLS] (its closing separator included),
             each unit length                                               (T - 1, D)

as FlagEmbedding's `M3Embedder.encode` (return_dense / return_sparse / return_colbert_vecs) and
its `_process_token_weights` / `_process_colbert_vecs` give them. The heads' weights are
`encoder.m3`'s. Scores (`compute_score`) are M3's: dense and sparse are inner products, colbert is
`multivector.maxsim(normalize=True)` (the sum of each query token's best match over the query's
T - 1 tokens), and the mixed modes are weighted means of those.

Where bertkit differs on purpose:
- The separator is dropped from the lexical weights whatever the tokenizer calls it (M3 drops the
  ids of `cls_token`, `eos_token`, `pad_token` and `unk_token`; XLM-R's `</s>` is both eos and
  separator, so for BGE-M3 the two agree).
- `compute_score` embeds every pair alone. FlagEmbedding pads each batch of passages to its
  longest, and a padding position's ColBERT vector is zero, so in its colbert score a query token
  whose every real match is negative scores 0 instead, when its passage is shorter than the
  longest of its batch: FlagEmbedding's colbert score depends on the batch, never below bertkit's.
  The dense and sparse scores do not depend on it.
- Queries and passages are cut at the engine's `max_length` (BGE-M3: 512), where FlagEmbedding
  has a length for each side (512 both by default).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from bertkit.encoder.model import encoder_of
from bertkit.inference.common import Ids, Use, as_texts, engine_for, run_ids
from bertkit.inference.embed import pool, resolve_pooling
from bertkit.inference.engine import Batch, Engine
from bertkit.inference.multivector import maxsim

OUTPUTS = ("dense", "sparse", "colbert")
# compute_score's modes, in FlagEmbedding's order; weights are (dense, sparse, colbert)
SCORE_MODES = ("colbert", "sparse", "dense", "sparse+dense", "colbert+sparse+dense")
HEADS_NEEDED = ("BGE-M3's head files beside the encoder (colbert_linear.pt and sparse_linear.pt, as "
                "FlagEmbedding saves them, or their .safetensors)")


def check_outputs(engine: Engine, outputs: str | Sequence[str]) -> tuple[str, ...]:
    """The outputs asked for, as a tuple in OUTPUTS' order; ValueError for an unknown one, or for
    sparse / colbert on a model without M3's heads (dense runs on any model: its own pooling,
    unit length)."""
    asked = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    if not asked:
        raise ValueError(f"no output asked for; choose from {', '.join(OUTPUTS)}")
    unknown = [o for o in asked if o not in OUTPUTS]
    if unknown:
        raise ValueError(f"unknown output {unknown[0]!r}; choose from {', '.join(OUTPUTS)}")
    need_heads = [o for o in asked if o != "dense"]
    if need_heads and engine.m3 is None:
        raise ValueError(f"{engine.model_dir or 'this model'} has no BGE-M3 heads; output {need_heads[0]!r} "
                         f"needs {HEADS_NEEDED}")
    return tuple(o for o in OUTPUTS if o in asked)


def m3_outputs(engine: Engine, outputs: tuple[str, ...]):
    """The head function for `Engine.run`: a batch → per sequence {output: value} (batch order).

    dense: float32 (H,); sparse: (indices long (K,) ascending, values float32 (K,) > 0);
    colbert: float32 (T - 1, D). All on the CPU.
    """
    encoder = encoder_of(engine.model)
    heads = engine.m3
    # M3's dense vector is [CLS]; a model without M3's heads pools as it does for `embed`. Unit length both.
    dense_mode = "cls" if heads is not None else resolve_pooling(engine, None, None)[0]
    dropped = torch.tensor(sorted({engine.tokenizer.cls_token_id, engine.tokenizer.sep_token_id,
                                   engine.tokenizer.pad_token_id, engine.tokenizer.unk_token_id}))

    def head(_model, batch: Batch) -> list[dict[str, Any]]:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden  # (N, H)
        rows: list[dict[str, Any]] = [{} for _ in batch.index]
        if "dense" in outputs:
            vectors = F.normalize(pool(hidden, batch, dense_mode), dim=-1).cpu()  # (B, H) fp32
            for row, vector in zip(rows, vectors):
                row["dense"] = vector
        states = hidden.to(heads.sparse_linear.weight.dtype) if heads is not None else hidden
        if "sparse" in outputs:
            for row, weights in zip(rows, _lexical_weights(heads, states, batch, dropped)):
                row["sparse"] = weights
        if "colbert" in outputs:
            keep = torch.ones(len(states), dtype=torch.bool, device=states.device)  # (N,)
            keep[batch.packed.starts] = False  # [CLS] has no ColBERT vector
            vectors = F.normalize(heads.colbert_linear(states[keep]).float(), dim=-1).cpu()  # (N - B, D)
            for row, tokens in zip(rows, vectors.split([n - 1 for n in batch.packed.lengths])):
                row["colbert"] = tokens
        return rows

    return head


def _lexical_weights(heads, states: torch.Tensor, batch: Batch, dropped: torch.Tensor
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(indices, values) per sequence: the largest ReLU(sparse_linear) weight of each token id
    in it, the dropped ids and zero weights left out."""
    weights = heads.sparse_linear(states).float().relu().squeeze(-1).cpu()  # (N,)
    ids = batch.input_ids.cpu()  # (N,)
    lengths = torch.tensor(batch.packed.lengths)
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (N,) sequence of each token
    keep = (weights > 0) & ~torch.isin(ids, dropped)
    # One key per (sequence, id), so one scatter takes every sequence's maximum per id at once.
    span = int(ids.max()) + 1
    keys = sequence[keep] * span + ids[keep]  # (K,)
    unique, slot = torch.unique(keys, return_inverse=True)  # (U,) ascending: by sequence, then by id
    best = torch.zeros(len(unique)).scatter_reduce(0, slot, weights[keep], reduce="amax", include_self=False)
    counts = torch.bincount(unique // span, minlength=len(lengths)).tolist()  # keys per sequence
    return list(zip((unique % span).split(counts), best.split(counts)))


def encode_m3(model: Engine | str | os.PathLike, texts: str | Sequence[str],
              outputs: str | Sequence[str] = OUTPUTS, *, prompt: str = "", **options: Any) -> dict[str, Any]:
    """BGE-M3's outputs for `texts` from one forward pass, {output: values in the order of texts}:

    dense: float32 (N, H) unit rows; sparse: [(indices long (K,) ascending, values float32 (K,))];
    colbert: [float32 (T_i - 1, D) unit rows]. model: an Engine or a model dir (`options` go to
    `Engine.load`). prompt: text put before every input (FlagEmbedding's instruction).
    """
    engine = engine_for(model, "embed", **options)
    outputs = check_outputs(engine, outputs)
    texts = [prompt + text for text in as_texts(texts)] if prompt else as_texts(texts)
    encodings = engine.encode(texts)
    rows = engine.run_ordered([e.ids for e in encodings], [e.type_ids for e in encodings],
                              m3_outputs(engine, outputs))
    out: dict[str, Any] = {name: [row[name] for row in rows] for name in outputs}
    if "dense" in out:
        out["dense"] = torch.stack(out["dense"])
    return out


def lexical_score(query: tuple[torch.Tensor, torch.Tensor], document: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Σ over the token ids both hold of their weights' product (M3's lexical matching score)."""
    q_ids, q_values = query
    d_ids, d_values = document
    common, q_at, d_at = _intersect(q_ids, d_ids)
    return float((q_values[q_at] * d_values[d_at]).sum()) if len(common) else 0.0


def _intersect(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids in both ascending id tensors, and their positions in each."""
    both = torch.isin(a, b)
    common = a[both]
    return common, both.nonzero().squeeze(1), torch.searchsorted(b, common)


def compute_score(model: Engine | str | os.PathLike, pairs: Sequence[tuple[str, str]], *,
                  weights: Sequence[float] | None = None, **options: Any) -> dict[str, list[float]]:
    """M3's scores of (query, passage) pairs, {mode: one float per pair} for every mode of
    SCORE_MODES, as FlagEmbedding's `compute_score` (see the module docstring for its batching).

    weights: (dense, sparse, colbert) for the mixed modes, default (1, 1, 1):
    sparse+dense = (w_s·sparse + w_d·dense) / (w_s + w_d), colbert+sparse+dense likewise over all three.
    """
    engine = engine_for(model, "embed", **options)
    weights = _weights(weights)
    pairs = list(pairs)
    if not pairs:
        raise ValueError("no pairs given")
    for i, pair in enumerate(pairs):
        if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"pair {i} is not a (query, passage) pair of two texts")
        for side, text in zip(("query", "passage"), pair):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"pair {i}'s {side} is {'empty' if isinstance(text, str) else 'not a string'}")
    texts = [q for q, _ in pairs] + [p for _, p in pairs]
    encoded = encode_m3(engine, texts, OUTPUTS)
    n = len(pairs)
    dense = (encoded["dense"][:n] * encoded["dense"][n:]).sum(-1).tolist()
    sparse = [lexical_score(encoded["sparse"][i], encoded["sparse"][n + i]) for i in range(n)]
    colbert = [maxsim(encoded["colbert"][i], encoded["colbert"][n + i], normalize=True) for i in range(n)]
    w_dense, w_sparse, w_colbert = weights
    return {"colbert": colbert, "sparse": sparse, "dense": dense,
            "sparse+dense": [(s * w_sparse + d * w_dense) / (w_sparse + w_dense) for s, d in zip(sparse, dense)],
            "colbert+sparse+dense": [(c * w_colbert + s * w_sparse + d * w_dense) / sum(weights)
                                     for c, s, d in zip(colbert, sparse, dense)]}


def _weights(weights: Sequence[float] | None) -> tuple[float, float, float]:
    if weights is None:
        return (1.0, 1.0, 1.0)
    values = tuple(weights)
    if len(values) != 3 or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in values):
        raise ValueError(f"weights must be three numbers (dense, sparse, colbert), got {weights!r}")
    if values[0] + values[1] == 0 or sum(values) == 0:
        raise ValueError(f"weights {values} sum to 0 for a mixed mode; give dense and sparse a non-zero sum")
    return tuple(float(w) for w in values)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs
# ---------------------------------------------------------------------------------------------
def m3_chunk(engine: Engine, options: dict[str, Any]):
    """Records → one JSON object per record: "dense" [H floats], "sparse" {"indices", "values"}
    (as `embed --sparse` writes), "colbert" [[D floats] per token], those asked for in `outputs`."""
    options = dict(options)
    outputs = check_outputs(engine, options.pop("outputs", OUTPUTS))

    def run(records) -> list[dict[str, Any]]:
        got = encode_m3(engine, [r.text for r in records], outputs, **options)
        rows: list[dict[str, Any]] = [{} for _ in records]
        for name in outputs:
            for row, value in zip(rows, got[name]):
                row[name] = ({"indices": value[0].tolist(), "values": value[1].tolist()} if name == "sparse"
                             else value.tolist())
        return rows

    return run


def run_m3(engine: Engine, key: tuple, items: Sequence[Ids]) -> list[dict[str, Any]]:
    """{output: value} per sequence, as `encode_m3` gives one text's. key: the outputs (default all)."""
    return run_ids(engine, items, m3_outputs(engine, check_outputs(engine, key or OUTPUTS)))


USE = Use("embed-m3", encode_m3, chunk=m3_chunk, runner=run_m3)
