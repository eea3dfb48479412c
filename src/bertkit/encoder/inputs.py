"""The encoder's input checks, at the boundary: clear messages instead of index errors deep inside.

`model.BertModel.forward` checks a padded batch (`check_inputs`), `forward_packed` packed sequences
(`check_packed`): shapes, lengths against the position table, ids against the vocabulary and the
segment table, and rows without any token.
"""

from __future__ import annotations

import torch

from bertkit.encoder.config import BertConfig
from bertkit.encoder.packing import Packed


def check_inputs(config: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 attention_mask: torch.Tensor | None) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, sequence), got shape {tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    if batch == 0 or length == 0:
        raise ValueError(f"empty batch: input_ids has shape {tuple(input_ids.shape)}")
    if length > config.max_sequence_length:
        raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}{_offset_note(config)}; truncate to "
                         f"{config.max_sequence_length} tokens or use sliding windows")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= config.vocab_size:
        bad = high if high >= config.vocab_size else low
        raise ValueError(f"token id {bad} is outside the vocabulary (vocab_size {config.vocab_size}); "
                         "was the input made with this model's tokenizer?")
    for name, tensor in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if tensor is not None and tensor.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but input_ids has "
                             f"{tuple(input_ids.shape)}")
    if token_type_ids is not None and config.reads_segments:
        top = int(token_type_ids.max())
        if top >= config.type_vocab_size or int(token_type_ids.min()) < 0:
            raise ValueError(f"segment id {top} is out of range for type_vocab_size "
                             f"{config.type_vocab_size}; single-segment models take token_type_ids of 0")
    if attention_mask is not None:
        empty = (attention_mask.sum(dim=1) == 0).nonzero()
        if len(empty):
            raise ValueError(f"row {int(empty[0])} of attention_mask has no tokens (all 0); "
                             "every sequence needs at least [CLS]")


def _offset_note(config: BertConfig) -> str:
    if not config.position_offset:
        return ""
    return (f" less RoBERTa's position offset {config.position_offset}, i.e. "
            f"{config.max_sequence_length} tokens")


def check_packed(config: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                 packed: Packed) -> None:
    if input_ids.dim() != 1 or token_type_ids.shape != input_ids.shape:
        raise ValueError(f"packed input_ids and token_type_ids must be 1-D of one length, got "
                         f"{tuple(input_ids.shape)} and {tuple(token_type_ids.shape)}")
    if sum(packed.lengths) != input_ids.shape[0]:
        raise ValueError(f"packed lengths sum to {sum(packed.lengths)} but there are "
                         f"{input_ids.shape[0]} tokens")
    longest = max(packed.lengths)
    if longest > config.max_sequence_length:
        raise ValueError(f"sequence length {longest} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}{_offset_note(config)}; truncate or use sliding windows")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= config.vocab_size:
        raise ValueError(f"token id {high if high >= config.vocab_size else low} is outside the vocabulary "
                         f"(vocab_size {config.vocab_size}); was the input made with this model's tokenizer?")
    if config.reads_segments and (int(token_type_ids.max()) >= config.type_vocab_size
                                or int(token_type_ids.min()) < 0):
        raise ValueError(f"segment id {int(token_type_ids.max())} is out of range for type_vocab_size "
                         f"{config.type_vocab_size}; single-segment models take token_type_ids of 0")


__all__ = ["check_inputs", "check_packed"]
