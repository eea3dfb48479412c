"""The ColBERT model being trained (`train.colbert`): the encoder and the projection, reading
queries and documents as `inference.colbert` does, differentiable, and saved in PyLate's layout.

Shapes: B queries of Q tokens, C documents of up to T tokens, H hidden size, D token-vector size.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.model import BertModel
from bertkit.encoder.sentence_transformers import ColbertSettings, DenseLayer
from bertkit.inference.colbert import (
    Dense,
    colbert_token_ids,
    encode_with_key_mask,
    prefix_ids,
    projection,
    skiplist_ids,
)
from bertkit.util.fileio import atomic_path, atomic_write_json

# The module classes PyLate writes into modules.json (it reads them back by these names).
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
DENSE_MODULE = "pylate.models.Dense.Dense"


class ColbertNet(nn.Module):
    """Encoder + projection, with the tokenizer and settings that read texts for them."""

    def __init__(self, encoder: BertModel, dense: nn.Sequential, tokenizer: BertTokenizer, settings: ColbertSettings):
        super().__init__()
        self.encoder = encoder
        self.projection = dense
        self.tokenizer = tokenizer
        self.settings = settings
        self.query_prefix_id, self.document_prefix_id = prefix_ids(tokenizer, settings)
        self.register_buffer("skiplist", skiplist_ids(tokenizer, settings), persistent=False)

    @property
    def config(self):
        return self.encoder.config

    def _batch(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids → right-padded (B, T) input_ids and attention_mask on the model's device."""
        device = self.skiplist.device
        width = max(map(len, ids))
        input_ids = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros(len(ids), width, dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, :len(row)] = torch.tensor(row)
            attention[i, :len(row)] = 1
        return input_ids.to(device), attention.to(device)

    def queries(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, Q, D) unit token vectors and the (B, Q) bool mask of the tokens that score (None:
        all of them, as with query expansion)."""
        settings = self.settings
        ids, real, _ = colbert_token_ids(self.tokenizer, settings, self.query_prefix_id, texts, True)
        input_ids, attention = self._batch(ids)  # (B, Q)
        types = torch.zeros_like(input_ids)
        mask = None
        if not settings.do_query_expansion:
            hidden = self.encoder(input_ids, types, attention).last_hidden_state  # (B, Q, H)
            mask = attention.bool()
        elif settings.attend_to_expansion_tokens:
            hidden = self.encoder(input_ids, types).last_hidden_state  # (B, Q, H)
        else:  # the expansion tokens read the query; no token reads them
            keys = torch.arange(input_ids.shape[1], device=input_ids.device) < torch.tensor(
                real, device=input_ids.device)[:, None]  # (B, Q)
            hidden = encode_with_key_mask(self.encoder, input_ids, types, keys)  # (B, Q, H)
        return F.normalize(self.projection(hidden), dim=-1), mask

    def documents(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(C, T, D) unit token vectors and the (C, T) bool mask of the tokens that score (not
        padding, not in the skiplist)."""
        ids, _, _ = colbert_token_ids(self.tokenizer, self.settings, self.document_prefix_id, texts, False)
        input_ids, attention = self._batch(ids)  # (C, T)
        hidden = self.encoder(input_ids, torch.zeros_like(input_ids), attention).last_hidden_state  # (C, T, H)
        mask = attention.bool() & ~torch.isin(input_ids, self.skiplist)  # (C, T)
        return F.normalize(self.projection(hidden), dim=-1), mask

    def save_pretrained(self, out: str | Path) -> Path:
        """OUT as PyLate saves a ColBERT: the encoder (config.json, model.safetensors), the
        tokenizer with its prefix tokens, one folder per Dense module, modules.json,
        sentence_bert_config.json and config_sentence_transformers.json."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_MODULE}]
        for i, (layer, dense) in enumerate(zip(self.settings.dense, self.projection), start=1):
            folder = out / layer.path
            folder.mkdir(exist_ok=True)
            atomic_write_json(folder / "config.json", {
                "in_features": layer.in_features, "out_features": layer.out_features, "bias": layer.bias,
                "activation_function": "torch.nn.modules.linear.Identity", "use_residual": layer.use_residual})
            with atomic_path(folder / "model.safetensors") as tmp:
                save_file({k: v.detach().cpu().contiguous() for k, v in dense.state_dict().items()}, str(tmp))
            modules.append({"idx": i, "name": str(i), "path": layer.path, "type": DENSE_MODULE})
        atomic_write_json(out / "modules.json", modules)
        # The Transformer module's own length; PyLate sets it per call from the two below.
        atomic_write_json(out / "sentence_bert_config.json",
                          {"max_seq_length": self.settings.document_length - 1, "do_lower_case": False})
        atomic_write_json(out / "config_sentence_transformers.json",
                          {**self.settings.to_json(), "prompts": {}, "default_prompt_name": None})
        return out


def build_colbert(directory: str | Path, config) -> ColbertNet:
    """The model to train from `directory`: a ColBERT one as it is (its settings, tokenizer and
    projection), any other encoder made a ColBERT as PyLate makes one (the prefixes added to
    the tokenizer, a projection to `config.embedding_size` without bias). config: its
    `max_length` (document_length) and `query_length`, when set, replace the settings'."""
    directory = Path(directory)
    tokenizer = BertTokenizer.from_pretrained(directory)
    encoder = BertModel.from_pretrained(directory)
    settings = ColbertSettings.read(directory)
    limit = encoder.config.max_sequence_length
    if settings is None:
        hidden = encoder.config.hidden_size
        settings = ColbertSettings(dense=(DenseLayer("1_Dense", hidden, config.embedding_size, bias=False),))
        # PyLate's defaults (32, 180) where the model is long enough
        settings = dataclasses.replace(settings, query_length=min(settings.query_length, limit),
                                       document_length=min(settings.document_length, limit))
        tokenizer = with_prefix_tokens(tokenizer, settings)
        encoder = with_vocabulary(encoder, tokenizer.vocab_size)
        dense = nn.Sequential(Dense(settings.dense[0]))  # nn.Linear's own initialisation, from the run's seed
    else:
        dense = projection(directory, settings)
    settings = dataclasses.replace(settings, query_length=config.query_length or settings.query_length,
                                   document_length=config.max_length or settings.document_length)
    for name, flag in (("query_length", "--query-length"), ("document_length", "--max-length")):
        if getattr(settings, name) > limit:
            raise ValueError(f"{flag} {getattr(settings, name)} exceeds the model's limit of {limit} tokens; "
                             f"pass {flag} {limit} or less")
    return ColbertNet(encoder, dense, tokenizer, settings)


def with_prefix_tokens(tokenizer: BertTokenizer, settings: ColbertSettings) -> BertTokenizer:
    """The tokenizer with the query and document prefixes as added tokens (normalised, not
    special: what transformers' `add_tokens` makes, which PyLate calls)."""
    from tokenizers import AddedToken

    prefixes = (settings.query_prefix, settings.document_prefix)
    new = [p for p in prefixes if p and tokenizer.backend.token_to_id(p) is None]
    if new:
        tokenizer.backend.add_tokens([AddedToken(p, normalized=True, special=False) for p in new])
        tokenizer.vocab_size = tokenizer.backend.get_vocab_size(with_added_tokens=True)
    return tokenizer


def with_vocabulary(encoder: BertModel, vocab_size: int) -> BertModel:
    """The encoder with `vocab_size` word embeddings; new rows start at the mean of the others
    (transformers' resize_token_embeddings draws them around that mean)."""
    words = encoder.embeddings.word_embeddings.weight  # (V, E)
    if vocab_size <= words.shape[0]:
        return encoder
    grown = BertModel(encoder.config.replace(vocab_size=vocab_size), add_pooling_layer=encoder.pooler is not None)
    state = encoder.state_dict()
    name = next(key for key, value in encoder.named_parameters() if value is words)
    extra = words.detach().mean(0, keepdim=True).expand(vocab_size - words.shape[0], -1)  # (new, E)
    state[name] = torch.cat([words.detach(), extra])  # (vocab_size, E)
    grown.load_state_dict(state)
    return grown
