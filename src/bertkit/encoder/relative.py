"""MPNet's relative-position bias: one table of bucketed distances, shared by every layer's attention.

Song et al. 2020, "MPNet: Masked and Permuted Pre-training for Language Understanding". MPNet's
layers are BERT's (`model.EncoderLayer`, post-LN), its learned positions are numbered as RoBERTa's
(from padding_idx + 1) and it has no segments; what differs is attention. Each head adds a learned
bias, chosen by the relative distance j − i of key j from query i, to its scores before the softmax:
one (relative_attention_num_buckets, nh) table (`encoder.relative_attention_bias` on disk) serves
every layer. Distances fall into BUCKETS buckets as T5's do, both directions apart: half of them per
direction, the nearest num_buckets // 4 distances one bucket each, the farther ones logarithmic up to
MAX_DISTANCE, and everything past it the last bucket. transformers' `MPNetEncoder.compute_position_bias`
and `relative_position_bucket` (5.25) are the oracle the tests compare against.

The bias depends on the distance alone, so a sequence of L tokens reads the top-left (L, L) block of
the longest sequence's bias: `BertModel` computes it once per forward, for the longest length, and
every layer and every sequence slices it.

- Padded path (`RelativeBias.scores`): the bias with padding keys at -inf is the float mask of
  SDPA, in place of the boolean padding mask (B, nh, T, T).
- Packed path (`packing.Packed.attend` with the bias): each run of neighbouring sequences of equal
  length is one SDPA call with its (1, nh, L, L) block as the mask, so no sequence sees another and
  no (N, N) tensor is built. The variable-length flash kernel and the key windows of BERT's packed
  path take no bias; these runs go through SDPA on every device.

Dimension letters: B batch, T (padded) length, L a run's length, c sequences in a run, N packed
tokens, nh heads, hs head size, H hidden size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bertkit.encoder.config import BertConfig
from bertkit.encoder.packing import Padding

# Distances from this on share the last bucket of their direction (transformers' max_distance).
MAX_DISTANCE = 128
# The buckets attention reads: transformers' `compute_position_bias` buckets with its default of 32
# whatever relative_attention_num_buckets says (the table's rows; all released models have 32), so
# a larger table's rows past 32 are never read, and a smaller one is refused (config.py).
BUCKETS = 32


def bucket(relative: torch.Tensor, num_buckets: int, max_distance: int = MAX_DISTANCE) -> torch.Tensor:
    """Relative distances j − i (long, any shape) → their buckets (long, same shape), in [0, num_buckets).

    Keys before the query (j < i) take buckets 0 … num_buckets/2 − 1, keys after it the upper half;
    the arithmetic is transformers' step for step, so a boundary distance lands where it does there.
    """
    half = num_buckets // 2
    n = -relative
    out = (n < 0).to(torch.long) * half
    n = n.abs()
    exact = half // 2
    # log(0) at n = 0 is -inf, never read: torch.where takes n there
    far = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).to(torch.long)
    far = torch.min(far, torch.full_like(far, half - 1))
    return out + torch.where(n < exact, n, far)


class RelativeBias(nn.Embedding):
    """The shared table: (relative_attention_num_buckets, nh), one bias per bucket and head."""

    def __init__(self, config: BertConfig):
        super().__init__(config.relative_attention_num_buckets, config.num_attention_heads)

    def of_length(self, length: int) -> torch.Tensor:
        """(1, nh, length, length) float: the bias of key j for query i at [0, h, i, j]."""
        positions = torch.arange(length, device=self.weight.device)  # (T,)
        buckets = bucket(positions[None, :] - positions[:, None], BUCKETS)  # (T, T)
        return self(buckets).permute(2, 0, 1).unsqueeze(0)  # (T, T, nh) → (1, nh, T, T)

    def scores(self, length: int, padding: Padding | None) -> torch.Tensor:
        """The float attention mask of a padded batch: the bias, and -inf at padding keys →
        (1, nh, T, T) without padding, else (B, nh, T, T)."""
        bias = self.of_length(length)  # (1, nh, T, T)
        if padding is None:
            return bias
        return torch.where(padding.key_mask, bias, float("-inf"))  # (B, 1, 1, T) keys → (B, nh, T, T)


__all__ = ["BUCKETS", "MAX_DISTANCE", "RelativeBias", "bucket"]
