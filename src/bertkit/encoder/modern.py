"""ModernBERT's pieces of the encoder: rotary positions, GeGLU, pre-LN layers, local–global attention.

Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder for Fast,
Memory Efficient, and Long Context Finetuning and Inference" (arXiv 2412.13663). `model.BertModel`
builds these when the family record's `layers` is "modern" (`config.is_modernbert`); everything
else (the packed engine path, the heads, the checkpoint names, LoRA, training) is the encoder's.
How it departs from BERT, and
the reference each piece follows (transformers' `models/modernbert/modeling_modernbert.py`, 5.24,
read as the oracle; the tests compare against it):

- Embeddings (`ModernBertEmbeddings`): token embeddings → LayerNorm → dropout. No learned
  positions, no segments (token_type_ids are ignored).
- Positions are rotary (`ModernBertRotaryEmbedding`, `apply_rotary_pos_emb`): Q and K of every
  layer are rotated by their token's position, with base `rope_theta` of the layer's type (160,000
  global, 10,000 local in the released models); cos/sin in fp32, the rotation in fp32 as there.
- Layers are pre-LN (`ModernBertEncoderLayer`): x = x + Attn(LN(x)); x = x + MLP(LN(x)); the first
  layer has no attention LayerNorm (the embedding norm precedes it), and a final LayerNorm follows
  the last layer (`final_norm`). LayerNorms and linear layers have biases only where the config's
  switches say (`norm_bias`, `attention_bias`, `mlp_bias`; all off in the released models).
- The feed-forward is GeGLU (`ModernBertMLP`): Wi maps H → 2I, split into input and gate,
  act(input) · gate → Wo (I → H). In memory Wi is `ffn_in` and Wo `ffn_out` (checkpoint.py maps).
- Local–global attention (`ModernBertAttention`, transformers' `sliding_window_bidirectional_overlay`):
  "sliding_attention" layers let a token see the tokens within local_attention // 2 positions on
  either side (|i − j| ≤ w); "full_attention" layers see everything. On the packed path (the
  engine's) the sliding layers never build a (T, T) score matrix: `local_attention` runs blocks of
  queries against the band of keys they can see, so a text costs O(n · w) there.
- Heads (`ModernBertPredictionHead`): dense (bias `classifier_bias`) → `classifier_activation` →
  LayerNorm, before the MLM decoder (tied to the word embeddings, bias `decoder_bias`) and before
  every task classifier; the sequence classifier pools the first token or the mean
  (`classifier_pooling`).
- Dropout: embedding_dropout after the embedding norm, attention_dropout on the probabilities and
  on Wo's output, mlp_dropout (BertConfig.hidden_dropout_prob) inside the GeGLU.
- Initialisation follows the reference's truncated normals: σ = initializer_range for Wqkv, Wi and
  the embeddings, σ / √(2L) for the output projections (Wo of attention and MLP), cut at ±2σ. The
  heads differ on purpose, for one code path with BERT's: their dense layers and classifiers start
  at σ (the reference: σ / √(2L) and H^-0.5); only a model trained from scratch sees it.

Dimension letters: B batch, T sequence length, N packed real tokens, H hidden, nh heads, hs head
size, I GeGLU width, w half window (local_attention // 2), C query block, W = C + 2w keys a block sees.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.encoder import fused, ops
from bertkit.encoder.config import BertConfig
from bertkit.encoder.packing import Packed, Padding

# Queries per block of the packed sliding-window attention: each block reads QUERY_BLOCK + 2w keys,
# so smaller blocks waste fewer scores and larger ones make fewer, larger kernel calls. At w = 64
# on the CPU, 32 and 64 measured alike and 128 or more slower (`bench/encoder.py --family
# modernbert --sweep-blocks`; docs/design.md).
QUERY_BLOCK = 64


def layer_norm(config: BertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


# ---------------------------------------------------------------------------------------------
# Rotary positions
# ---------------------------------------------------------------------------------------------
def inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    """(hs / 2,) fp32: θ^(-2i / hs), as the reference's compute_default_rope_parameters."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (...,) long → cos, sin (..., hs / 2) fp32. The reference repeats the frequencies
    over both halves of the head (cat(freqs, freqs)); one half is kept, as both are equal."""
    freqs = positions[..., None].float() * inv_freq.to(positions.device)  # (..., hs/2)
    return freqs.cos(), freqs.sin()


def rope_tables(layers, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos, sin of `positions` for each layer type of `layers` (made once per forward, not per layer)."""
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in layers:
        if layer.layer_type not in tables:
            tables[layer.layer_type] = rotary_tables(positions, layer.inv_freq)
    return tables


def rotate_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., 3H) fused projections → a new (..., 3H) with Q and K rotated, V copied.

    cos, sin: (..., hs / 2) fp32, one row per position. With x = (x1, x2) the two halves of a head,
    rotate_half(x) = (−x2, x1), so x · cos + rotate_half(x) · sin = (x1·c − x2·s, x2·c + x1·s):
    the reference's products and sums, in fp32 as there, without its concatenations.
    """
    shape = qkv.shape
    parts = qkv.view(*shape[:-1], 3, heads, -1)  # (..., 3, nh, hs)
    half = parts.shape[-1] // 2
    out = torch.empty_like(parts)
    qk = parts[..., :2, :, :].float()  # (..., 2, nh, hs); a view when already fp32
    x1, x2 = qk[..., :half], qk[..., half:]
    c, s = cos[..., None, None, :], sin[..., None, None, :]  # (..., 1, 1, hs/2)
    out[..., :2, :, :half] = x1 * c - x2 * s
    out[..., :2, :, half:] = x2 * c + x1 * s
    out[..., 2, :, :] = parts[..., 2, :, :]
    return out.view(shape)


# ---------------------------------------------------------------------------------------------
# Attention kernels
# ---------------------------------------------------------------------------------------------
def band_mask(length: int, half: int, device: torch.device) -> torch.Tensor:
    """(T, T) bool: True where |i − j| ≤ half."""
    index = torch.arange(length, device=device)
    return (index[:, None] - index[None, :]).abs() <= half


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sequence_index: torch.Tensor,
                    half: int, block: int = QUERY_BLOCK) -> torch.Tensor:
    """Sliding-window attention over packed sequences, without (T, T) scores.

    q, k, v: (N, nh, hs) packed rows; sequence_index: (N,) long, which sequence each row is.
    A query sees the keys of its own sequence within `half` rows on either side. The rows are cut
    into blocks of `block` queries; block b reads keys b·C − w … b·C + C + w − 1 (a strided view of
    the zero-padded keys), masked to the band and to its own sequence, in one batched SDPA call.
    Memory and work O(N · (C + 2w)). Returns (N, nh · hs).
    """
    rows, nh, hs = q.shape
    blocks = -(-rows // block)
    window = block + 2 * half
    padded_rows = blocks * block
    # keys / values with w zero rows before and enough after for the last block's window
    kv = q.new_zeros(2, padded_rows + 2 * half, nh, hs)  # (2, R, nh, hs)
    kv[0, half:half + rows] = k
    kv[1, half:half + rows] = v
    step = nh * hs
    kw, vw = (kv[i].as_strided((blocks, window, nh, hs), (block * step, step, hs, 1)).transpose(1, 2)
              for i in range(2))  # (blocks, nh, W, hs) each, views
    qb = q.new_zeros(padded_rows, nh, hs)
    qb[:rows] = q
    qb = qb.view(blocks, block, nh, hs).transpose(1, 2)  # (blocks, nh, C, hs)
    # sequence of every key row (−1 = padding; padded query rows are −1 too, so no row is empty)
    seq = sequence_index.new_full((padded_rows + 2 * half,), -1)
    seq[half:half + rows] = sequence_index
    seq_k = seq.as_strided((blocks, window), (block, 1))  # (blocks, W)
    seq_q = seq[half:half + padded_rows].view(blocks, block)  # (blocks, C)
    # query i of a block sits at key column i + w: the band is columns i … i + 2w
    offsets = torch.arange(window, device=q.device)[None, :] - torch.arange(block, device=q.device)[:, None]
    band = (offsets >= 0) & (offsets <= 2 * half)  # (C, W)
    mask = (seq_q[:, :, None] == seq_k[:, None, :]) & band  # (blocks, C, W)
    y = F.scaled_dot_product_attention(qb, kw, vw, attn_mask=mask[:, None])  # (blocks, nh, C, hs)
    return y.transpose(1, 2).reshape(padded_rows, nh * hs)[:rows]  # (N, H)


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
class Embeddings(nn.Module):
    """Token embeddings → LayerNorm → dropout (no positions, no segments)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        rate = config.embedding_dropout if config.embedding_dropout is not None else config.hidden_dropout_prob
        self.dropout = ops.Dropout(rate)
        self.reads_segments = False

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                sparse_word_grad: bool = False) -> torch.Tensor:
        """(B, T) ids → (B, T, H); token_type_ids unused. sparse_word_grad: see `BertModel.forward`."""
        sparse = (sparse_word_grad and input_ids.device.type == "cpu" and torch.is_grad_enabled()
                  and not torch.compiler.is_compiling())
        words = self.word_embeddings
        return self.dropout(self.norm(F.embedding(input_ids, words.weight, words.padding_idx, sparse=sparse)))

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       position_ids: torch.Tensor) -> torch.Tensor:
        """(N,) packed ids → (N, H); positions enter in the layers (rotary)."""
        return self.dropout(self.norm(self.word_embeddings(input_ids)))


class EncoderLayer(nn.Module):
    """Pre-LN layer: x = x + Wo(Attn(rotary(Wqkv(LN(x))))); x = x + Wo(act(a) · g), (a, g) = Wi(LN(x)).

    The module names are BERT's layer's (`qkv`, `attn_out`, `ffn_in`, `ffn_out`, `attn_norm`,
    `ffn_norm`), so LoRA, the parameter table and the int8 linears find them; checkpoint.py maps
    them to `attn.Wqkv`, `attn.Wo`, `mlp.Wi`, `mlp.Wo`, `attn_norm`, `mlp_norm`.
    """

    def __init__(self, config: BertConfig, index: int):
        super().__init__()
        hidden, bias = config.hidden_size, config.attention_bias
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.attention_dropout = config.attention_probs_dropout_prob
        self.layer_type = config.layer_types[index]
        self.half_window = config.local_attention // 2 if self.layer_type == "sliding_attention" else None
        self.register_buffer("inv_freq", inverse_frequencies(config.rope_theta(self.layer_type), config.head_dim),
                             persistent=False)
        self.attn_norm = layer_norm(config) if index else nn.Identity()  # layer 0: the embedding norm precedes
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=bias)
        self.ffn_norm = layer_norm(config)
        self.ffn_in = nn.Linear(hidden, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.ffn_out = nn.Linear(config.intermediate_size, hidden, bias=config.mlp_bias)
        self.act = ops.activation(config.hidden_act)
        self.out_dropout = ops.Dropout(config.attention_probs_dropout_prob)
        self.mlp_dropout = ops.Dropout(config.hidden_dropout_prob)

    def rotated(self, qkv: torch.Tensor, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """(..., 3H) projections and (...,) positions → the same with Q and K rotated (a new tensor).
        rope: this layer type's (cos, sin) of the positions when the caller made them (`rope_tables`)."""
        cos, sin = rope if rope is not None else rotary_tables(positions, self.inv_freq)
        return rotate_qk(qkv, cos, sin, self.num_heads)

    def forward(self, x: torch.Tensor, padding: Padding | None, batch: int, length: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x: (N, H) real tokens (B*T without padding) → (N, H); attention in the padded layout.
        rope: (cos, sin) (T, hs/2) of positions 0..T-1 for this layer's type, or None to make them."""
        qkv = fused.linear(self.qkv, self.attn_norm(x))  # (N, 3H)
        qkv = qkv.view(batch, length, -1) if padding is None else padding.pad(qkv)  # (B, T, 3H)
        qkv = self.rotated(qkv, torch.arange(length, device=x.device), rope)
        q, k, v = (qkv.view(batch, length, 3, self.num_heads, self.head_dim)
                   .permute(2, 0, 3, 1, 4).unbind(0))  # (B, nh, T, hs) each
        mask = None if padding is None else padding.key_mask  # (B, 1, 1, T)
        # An exported graph keeps the band whatever the traced length: decided by that length, a
        # short trace would drop it for every longer input (a band within one window hides nothing).
        if self.half_window is not None and (length > self.half_window + 1 or torch.compiler.is_exporting()):
            band = band_mask(length, self.half_window, x.device)[None, None]  # (1, 1, T, T)
            mask = band if mask is None else mask & band  # (B, 1, T, T)
        y = ops.attention(q, k, v, mask, self.attention_dropout, self.training)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(batch, length, -1)  # (B, T, H)
        y = y.view(batch * length, -1) if padding is None else padding.unpad(y)  # (N, H)
        return self.feed_forward(x, y)

    def explicit(self, x: torch.Tensor, batch: int, length: int, keys: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`forward` with the attention weights written out (the explorer's trace): x (B*T, H),
        keys (B, 1, 1, T) bool or None → scores (B, nh, T, T) before any mask, probabilities
        (the window and the padding applied), and the layer's output (B*T, H)."""
        qkv = self.rotated(self.qkv(self.attn_norm(x)).view(batch, length, -1),
                           torch.arange(length, device=x.device), None)  # (B, T, 3H)
        q, k, v = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-1, -2) * self.head_dim ** -0.5  # (B, nh, T, T)
        mask = keys
        if self.half_window is not None:
            band = band_mask(length, self.half_window, x.device)[None, None]  # (1, 1, T, T)
            mask = band if mask is None else mask & band
        probs = (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).softmax(-1)
        y = (probs @ v).transpose(1, 2).reshape(batch * length, -1)  # (B*T, H)
        return scores, probs, self.feed_forward(x, y)

    def forward_packed(self, x: torch.Tensor, packed: Packed,
                       rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x: (N, H) packed sequences → (N, H); attention never sees another sequence.
        rope: (cos, sin) (N, hs/2) of packed.position_ids for this layer's type, or None."""
        qkv = self.rotated(fused.linear(self.qkv, self.attn_norm(x)), packed.position_ids, rope)  # (N, 3H)
        if self.half_window is None or max(packed.lengths) <= self.half_window + 1:
            y = packed.attend(self, qkv)  # (N, H): global, or every sequence inside one window
        elif qkv.device.type == "cuda" and qkv.dtype in (torch.float16, torch.bfloat16):
            from torch.nn.attention.varlen import varlen_attn

            q, k, v = qkv.view(-1, 3, self.num_heads, self.head_dim).unbind(1)  # (N, nh, hs) each
            longest = max(packed.lengths)
            y = varlen_attn(q, k, v, packed.cu_seqlens, packed.cu_seqlens, longest, longest,
                            window_size=(self.half_window, self.half_window)).reshape(x.shape[0], -1)
        elif self.training and self.attention_dropout:
            raise ValueError("the packed path is for inference: train through forward (dropout)")
        else:
            q, k, v = qkv.view(-1, 3, self.num_heads, self.head_dim).unbind(1)  # (N, nh, hs) each
            y = local_attention(q, k, v, packed.sequence_index, self.half_window)  # (N, H)
        return self.feed_forward(x, y)

    def feed_forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (N, H) the layer's input, y (N, H) attention output → the layer's output (N, H)."""
        if not self.training:  # no dropout: the residual additions join the GEMMs (`fused`)
            x = fused.linear(self.attn_out, y, residual=x)  # (N, H)
            a, gate = fused.linear(self.ffn_in, self.ffn_norm(x)).chunk(2, dim=-1)  # (N, I) each
            return fused.linear(self.ffn_out, self.act(a) * gate, residual=x)  # (N, H)
        x = x + self.out_dropout(self.attn_out(y))  # (N, H)
        a, gate = self.ffn_in(self.ffn_norm(x)).chunk(2, dim=-1)  # (N, I) each
        return x + self.ffn_out(self.mlp_dropout(self.act(a) * gate))  # (N, H)


class PredictionHead(nn.Module):
    """dense (H → H, bias classifier_bias) → classifier_activation → LayerNorm: before every head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ops.activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))  # (..., H)


def init_weights(module: nn.Module, config: BertConfig) -> None:
    """The reference's truncated-normal init for one module (see the module docstring)."""
    std = config.initializer_range
    if isinstance(module, EncoderLayer):
        out_std = std / math.sqrt(2.0 * config.num_hidden_layers)
        for linear, s in ((module.qkv, std), (module.ffn_in, std), (module.attn_out, out_std),
                          (module.ffn_out, out_std)):
            nn.init.trunc_normal_(linear.weight, 0.0, s, -2 * s, 2 * s)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)


__all__ = ["Embeddings", "EncoderLayer", "PredictionHead", "local_attention", "rotary_tables", "rope_tables",
           "rotate_qk",
           "init_weights", "QUERY_BLOCK"]
