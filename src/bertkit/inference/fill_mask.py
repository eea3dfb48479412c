"""Fill-mask: the top-k tokens with their probabilities at every [MASK] of a text."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from bertkit.encoder.model import encoder_of
from bertkit.inference.common import Use, as_texts, engine_for
from bertkit.inference.engine import Batch, Engine

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    token: str  # the vocabulary entry, e.g. "paris" or "##ing"
    token_id: int
    score: float  # softmax probability over the whole vocabulary at that [MASK] (transformers' "score")


def fill_mask(model: Engine | str | os.PathLike, texts: str | Sequence[str], *, top_k: int = 5,
              targets: Sequence[str] | None = None, **options: Any) -> list[list[list[Candidate]]]:
    """Top-k candidates at every [MASK]: result[text][mask] = up to k Candidates, best first.

    targets: score only these words (as transformers' fill-mask pipeline): each target's
    probability under the full softmax, the k best of them returned. A target that is not one
    vocabulary entry is scored by its first piece, with a warning (the pipeline does the same).
    A text with no [MASK], or whose [MASK] lies past the model's length limit, is an error.
    """
    engine = engine_for(model, "fill-mask", **options)
    texts = as_texts(texts)
    if top_k < 1:
        raise ValueError(f"top_k must be positive, got {top_k}")
    tokenizer = engine.tokenizer
    mask_id = tokenizer.mask_token_id
    target_ids = None if targets is None else _target_ids(tokenizer, targets)
    encodings = engine.encode(texts)
    for i, (text, enc) in enumerate(zip(texts, encodings)):
        if mask_id in enc.ids:
            continue
        if tokenizer.special_tokens["mask_token"] in text:
            raise ValueError(f"text {i}: its {tokenizer.special_tokens['mask_token']} lies past the "
                             f"model's limit of {engine.max_length} tokens, so it cannot be filled; "
                             "shorten the text before the mask")
        raise ValueError(f"text {i} has no {tokenizer.special_tokens['mask_token']} token: {text!r}")
    lost = [i for i, enc in enumerate(encodings) if enc.overflowing and
            sum(mask_id in o.ids for o in enc.overflowing)]
    if lost:
        raise ValueError(f"text {lost[0]}: a [MASK] lies past the model's limit of {engine.max_length} "
                         "tokens and would be dropped; shorten the text before that mask")

    results: list[list[list[Candidate]]] = [[] for _ in texts]

    def head(model, batch: Batch):
        rows = (batch.input_ids == mask_id).nonzero().squeeze(1)  # (M,) packed rows of the masks
        probs = model.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed,
                                     rows).logits.float().softmax(-1)  # (M, V)
        if target_ids is not None:
            scores = probs[:, target_ids]  # (M, K)
            top = scores.topk(min(top_k, len(target_ids)), dim=-1)
            ids = torch.tensor(target_ids)[top.indices.cpu()]  # (M, k)
        else:
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            ids = top.indices.cpu()
        return batch.packed.sequence_index[rows].cpu(), ids, top.values.cpu()

    for index, (owners, ids, values) in engine.run_encodings(encodings, head):
        for owner, row_ids, row_values in zip(owners.tolist(), ids.tolist(), values.tolist()):
            tokens = tokenizer.convert_ids_to_tokens(row_ids)
            results[index[owner]].append([Candidate(t, i, p) for t, i, p in zip(tokens, row_ids, row_values)])
    return results


def _target_ids(tokenizer, targets: Sequence[str]) -> list[int]:
    targets = as_texts(targets, "target")
    vocab = tokenizer.get_vocab()
    ids = []
    for word in targets:
        if word in vocab:
            ids.append(vocab[word])
            continue
        pieces = tokenizer.tokenize(word)
        if not pieces:
            raise ValueError(f"target {word!r} gives no tokens")
        if len(pieces) > 1:
            log.warning("target %r is not one vocabulary entry; scoring its first piece %r", word, pieces[0])
        ids.append(vocab[pieces[0]])
    return list(dict.fromkeys(ids))  # duplicates once, first order kept


def load_masked_lm(model_dir: str | os.PathLike):
    """A BertForMaskedLM from any BERT dir with an MLM head (error without one)."""
    return Engine.load(model_dir, use="fill-mask").model


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs, the exported graph
# ---------------------------------------------------------------------------------------------
def fill_mask_chunk(engine: Engine, options: dict[str, Any]):
    """Records → {"masks": [[{"token", "token_id", "score"}, ...] per [MASK]]} per record."""
    return lambda records: [{"masks": [[dataclasses.asdict(c) for c in mask] for mask in masks]}
                            for masks in fill_mask(engine, [r.text for r in records], **options)]


def run_fill_mask(engine: Engine, key: tuple, texts: Sequence[str]) -> list[list[list[dict]]]:
    """key: (top_k, targets or None); per text, per [MASK], the candidates as dicts."""
    top_k, targets = key
    found = fill_mask(engine, list(texts), top_k=top_k, targets=list(targets) if targets else None)
    return [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in mask] for mask in text]
            for text in found]


def mlm_logits(model, hidden: torch.Tensor) -> tuple[torch.Tensor]:
    """(B, T, H) → ((B, T, V) vocabulary logits,), the decoder tied to the word embeddings."""
    return (model.mlm(hidden, encoder_of(model).embeddings.word_embeddings.weight),)


USE = Use("fill-mask", fill_mask, chunk=fill_mask_chunk, runner=run_fill_mask, outputs=("logits",),
          graph=mlm_logits)
