"""Using a model: fill-mask top-k with probabilities, and sentence embeddings.

Inputs are batched by length (sorted, then restored to the caller's order) so short texts never
pay for a long neighbour's padding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from bertkit.model import BertForMaskedLM, BertModel
from bertkit.tokenizer import BertTokenizer


@dataclass
class Candidate:
    token: str  # the vocabulary entry, e.g. "paris" or "##ing"
    token_id: int
    prob: float  # softmax probability at that [MASK]


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def _as_list(texts: str | Sequence[str]) -> list[str]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError("no texts given")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text {i} is empty")
    return texts


def collate(encodings: Sequence, pad_id: int) -> dict[str, torch.Tensor]:
    """Encodings → input_ids, token_type_ids, attention_mask (B, T) long, padded to the longest."""
    width = max(len(e.ids) for e in encodings)
    batch = {name: torch.zeros(len(encodings), width, dtype=torch.long)
             for name in ("input_ids", "token_type_ids", "attention_mask")}
    batch["input_ids"].fill_(pad_id)
    for row, e in enumerate(encodings):
        n = len(e.ids)
        batch["input_ids"][row, :n] = torch.tensor(e.ids)
        batch["token_type_ids"][row, :n] = torch.tensor(e.type_ids)
        batch["attention_mask"][row, :n] = 1
    return batch


def _encode_sorted(tokenizer: BertTokenizer, texts: list[str], batch_size: int, max_length: int):
    """Tokenize once; yield (indices, batch tensors), each batch padded to its own longest text."""
    encodings = tokenizer.encode_batch(texts, max_length=max_length)
    for index in length_sorted_batches([len(e.ids) for e in encodings], batch_size):
        yield index, collate([encodings[i] for i in index], tokenizer.pad_token_id)


def load_masked_lm(model_dir: str | os.PathLike) -> BertForMaskedLM:
    """An MLM model from any BERT dir that has an MLM head (ours or Hugging Face's)."""
    model = BertForMaskedLM.from_pretrained(model_dir)
    if any(name.startswith("cls.predictions") for name in model.load_report.missing):
        raise ValueError(f"{model_dir} has no masked-LM head (cls.predictions.* missing); fill-mask needs "
                         "a checkpoint pre-trained with MLM, e.g. one made by `bertkit pretrain`")
    return model


@torch.no_grad()
def fill_mask(model: BertForMaskedLM | str | os.PathLike, tokenizer: BertTokenizer | None,
              texts: str | Sequence[str], top_k: int = 5, batch_size: int = 32,
              max_length: int = 512) -> list[list[list[Candidate]]]:
    """Top-k candidates at every [MASK]: result[text][mask_index] = k Candidates, best first.

    `model` is a BertForMaskedLM or a model dir (its tokenizer files are used when `tokenizer` is None).
    """
    if not isinstance(model, BertForMaskedLM):
        tokenizer = tokenizer or BertTokenizer.from_pretrained(model)
        model = load_masked_lm(model)
    model.eval()
    texts = _as_list(texts)
    if top_k <= 0:
        raise ValueError(f"top_k must be positive, got {top_k}")
    mask_id = tokenizer.mask_token_id
    results: list[list[list[Candidate]]] = [[] for _ in texts]
    for index, batch in _encode_sorted(tokenizer, texts, batch_size, max_length):
        labels = torch.where(batch["input_ids"] == mask_id, batch["input_ids"], -100)  # (B, T)
        for row, text_index in enumerate(index):
            if not bool((labels[row] != -100).any()):
                raise ValueError(f"text {text_index} has no [MASK] token: {texts[text_index]!r}")
        # Sparse path: the vocabulary projection runs only at [MASK] positions.
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], labels=labels).logits
        probs = logits.float().softmax(-1)  # (M, V), masks in row-major order
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        rows = (labels != -100).nonzero()[:, 0].tolist()  # batch row of each mask
        for m, row in enumerate(rows):
            ids = top.indices[m].tolist()
            tokens = tokenizer.convert_ids_to_tokens(ids)
            results[index[row]].append([Candidate(tok, i, float(p))
                                        for tok, i, p in zip(tokens, ids, top.values[m].tolist())])
    return results


@torch.no_grad()
def embed(model: BertModel | str | os.PathLike, tokenizer: BertTokenizer | None, texts: str | Sequence[str],
          pooling: str = "mean", normalize: bool = True, batch_size: int = 32, max_length: int = 256) -> torch.Tensor:
    """Sentence embeddings (N, H) float32, in the order of `texts`.

    pooling: "mean" (average of real tokens' last hidden states, as sentence-transformers'
    all-MiniLM-L6-v2 is trained) or "cls" (the [CLS] hidden state). normalize: unit length, so a dot
    product is the cosine similarity.
    """
    if pooling not in ("mean", "cls"):
        raise ValueError(f"unknown pooling {pooling!r}; use 'mean' or 'cls'")
    if not isinstance(model, BertModel):
        tokenizer = tokenizer or BertTokenizer.from_pretrained(model)
        model = BertModel.from_pretrained(model)
    model.eval()
    texts = _as_list(texts)
    out = torch.empty(len(texts), model.config.hidden_size)
    for index, batch in _encode_sorted(tokenizer, texts, batch_size, max_length):
        hidden = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).last_hidden_state
        if pooling == "cls":
            vectors = hidden[:, 0]  # (B, H)
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            vectors = (hidden * mask).sum(1) / mask.sum(1)  # (B, H)
        out[index] = vectors.float()
    return F.normalize(out, dim=-1) if normalize else out


def similarity(model_dir: str | Path, texts: Sequence[str], pooling: str = "mean") -> torch.Tensor:
    """Cosine similarity matrix (N, N) of the texts' embeddings."""
    vectors = embed(model_dir, None, texts, pooling=pooling, normalize=True)
    return vectors @ vectors.T
