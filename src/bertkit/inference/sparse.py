"""Sparse embeddings (SPLADE): a masked-LM head's vocabulary logits as term weights.

SPLADE (Formal et al., SIGIR 2021; v2 arXiv:2109.10086) reads every position's MLM logits as
weights over the vocabulary and keeps, per term, its largest over the text:

    w_t = max over positions i of log(1 + ReLU(logit_{i,t}))

so a text becomes a vector as wide as the vocabulary with a few hundred non-zeros, its own terms
and related ones (the "expansion"), which an inverted index searches (`retrieval.sparse`).

Equal to sentence-transformers' `SparseEncoder` (MLMTransformer + SpladePooling) on the same
weights (within 1e-5, fp32), the pooling settings read from the model's own
1_SpladePooling/config.json (`max` or `sum`, `relu` or `log1p_relu`), and its `max_active_dims`
pruning as `top_k`. Where it differs in how, not what: sequences are packed (no padding rows, so
no vocabulary projection for padding) and the projection runs over at most `PROJECTION_ROWS`
tokens at a time, pooled as it goes, so a batch never holds a (tokens × vocabulary) tensor: for a
30k vocabulary and an 8k-token batch that would be a gigabyte. Every real token needs its
projection (the max runs over all of them), so this is the only saving there is.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from bertkit.encoder import tasks
from bertkit.encoder.model import encoder_of
from bertkit.encoder.sentence_transformers import SpladePooling
from bertkit.inference.common import Ids, Use, as_texts, run_ids
from bertkit.inference.engine import Batch, Engine

# Token rows per vocabulary projection: 512 × 30,522 fp32 logits are 62 MB, large enough for
# efficient GEMMs, small enough for any machine.
PROJECTION_ROWS = 512


def sparse_engine(model_dir: str | os.PathLike, **options: Any) -> Engine:
    """An engine over a model directory's masked-LM head, or a one-line ValueError naming what
    sparse embeddings need when the directory has no such head. (A SparseEncoder directory's
    max_seq_length is its input length, as for every use: `engine.input_length`.)"""
    use = tasks.use_of(model_dir)
    if use != "fill-mask":
        kind = tasks.HEADS[tasks.USES[use].kind].description
        raise ValueError(f"{model_dir} is {kind} ({use}); sparse embeddings (SPLADE) need "
                         f"{tasks.USES['fill-mask'].needs}")
    return Engine.load(model_dir, use="fill-mask", **options)


def embed_sparse(model: Engine | str | os.PathLike, texts: str | Sequence[str], *, top_k: int | None = None,
                 prompt: str = "", pooling: SpladePooling | None = None,
                 **options: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """SPLADE term weights per text, in the order of `texts`: [(indices, values)] with indices
    long (K,) vocabulary ids in increasing order and values float32 (K,) > 0, on the CPU.

    model: an Engine loaded for fill-mask, or a model dir with a masked-LM head (`options` go to
    `Engine.load`). top_k: keep each text's k largest weights (sentence-transformers'
    max_active_dims). prompt: text put before every input. pooling: default, the model's own
    (`SpladePooling.read`).
    """
    engine = model if isinstance(model, Engine) else sparse_engine(model, **options)
    if isinstance(model, Engine) and options:
        raise ValueError(f"options {sorted(options)} apply when loading a model dir; set them on the Engine")
    if engine.use != "fill-mask":
        raise ValueError(f"sparse embeddings need an engine loaded for fill-mask (a masked-LM head), "
                         f"not {engine.use}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be positive, got {top_k}")
    pooling = pooling or SpladePooling.read(engine.model_dir)
    texts = [prompt + text for text in as_texts(texts)] if prompt else as_texts(texts)
    encodings = engine.encode(texts)
    return engine.run_ordered([e.ids for e in encodings], [e.type_ids for e in encodings],
                              lambda model, batch: splade_weights(model, batch, pooling, top_k))


def splade_weights(model, batch: Batch, pooling: SpladePooling, top_k: int | None
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batch's sequences' term weights, (indices, values) per sequence in batch order.

    The encoder runs once over the packed batch; the MLM head then runs over groups of whole
    sequences of at most PROJECTION_ROWS tokens (a longer sequence alone), each group's logits
    pooled into (b, V) weights and made sparse before the next group is projected.
    """
    encoder = encoder_of(model)
    hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden  # (N, H)
    decoder = encoder.embeddings.word_embeddings.weight  # (V, E), tied
    lengths = batch.packed.lengths
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    start, i = 0, 0
    while i < len(lengths):
        j, rows = i + 1, lengths[i]
        while j < len(lengths) and rows + lengths[j] <= PROJECTION_ROWS:
            rows += lengths[j]
            j += 1
        logits = model.mlm(hidden[start:start + rows], decoder).float()  # (n, V)
        weights = logits.relu_().log1p_()  # (n, V) log(1 + ReLU(logit))
        if pooling.activation_function == "log1p_relu":
            weights = weights.log1p_()
        group = torch.tensor(lengths[i:j], device=weights.device)
        if pooling.pooling_strategy == "max":
            pooled = torch.segment_reduce(weights, "max", lengths=group, axis=0)  # (b, V)
        else:
            pooled = torch.segment_reduce(weights, "sum", lengths=group, axis=0)  # (b, V)
        out.extend(_sparse_rows(pooled, top_k))
        start += rows
        i = j
    return out


def _sparse_rows(pooled: torch.Tensor, top_k: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(b, V) non-negative weights → per row (indices ascending, values), zeros dropped; top_k:
    only the k largest (torch.topk, as sentence-transformers' max_active_dims)."""
    if top_k is not None and top_k < pooled.shape[1]:
        top = pooled.topk(top_k, dim=1)
        pooled = torch.zeros_like(pooled).scatter_(1, top.indices, top.values)  # (b, V)
    pooled = pooled.cpu()
    rows = []
    for row in pooled:
        indices = row.nonzero().squeeze(1)  # (K,) ascending
        rows.append((indices, row[indices].contiguous()))
    return rows


def to_sparse_tensor(rows: Sequence[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """[(indices, values)] → a coalesced sparse COO tensor (N, vocab_size) float32, the form
    sentence-transformers' SparseEncoder.encode returns."""
    row_ids = torch.cat([torch.full((len(ix),), n, dtype=torch.long) for n, (ix, _) in enumerate(rows)])
    cols = torch.cat([ix for ix, _ in rows]) if rows else torch.zeros(0, dtype=torch.long)
    values = torch.cat([v for _, v in rows]) if rows else torch.zeros(0)
    # Rows in order and each row's indices ascending: already coalesced, and said so.
    return torch.sparse_coo_tensor(torch.stack([row_ids, cols]), values, (len(rows), vocab_size),
                                   check_invariants=False, is_coalesced=True)


def decode(tokenizer, indices: torch.Tensor, values: torch.Tensor, top_k: int | None = None
           ) -> list[tuple[str, float]]:
    """(token, weight) pairs of one text's weights, largest first (ties by vocabulary id), the
    k largest with top_k: what sentence-transformers' SparseEncoder.decode gives."""
    order = sorted(range(len(indices)), key=lambda k: (-float(values[k]), int(indices[k])))
    if top_k is not None:
        order = order[:top_k]
    tokens = tokenizer.convert_ids_to_tokens([int(indices[k]) for k in order])
    return [(t, float(values[k])) for t, k in zip(tokens, order)]


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs (SPLADE has no graph of its own:
# an export of the masked-LM head gives the logits its weights come from)
# ---------------------------------------------------------------------------------------------
def sparse_chunk(engine: Engine, options: dict[str, Any]):
    """Records → {"indices", "values"} per record: the shape Qdrant and TEI take."""
    return lambda records: [{"indices": ix.tolist(), "values": v.tolist()}
                            for ix, v in embed_sparse(engine, [r.text for r in records], **options)]


def run_sparse(engine: Engine, key: tuple, items: Sequence[Ids]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(indices, values) SPLADE weights per sequence. key: (SpladePooling,) or () for the model's
    own settings (`SpladePooling.read`)."""
    pooling = key[0] if key else SpladePooling.read(engine.model_dir)
    return run_ids(engine, items, lambda m, batch: splade_weights(m, batch, pooling, None))


USE = Use("embed-sparse", embed_sparse, chunk=sparse_chunk, runner=run_sparse)
