"""DeBERTa-v2's pieces: disentangled attention, relative embeddings, the convolution, the embeddings.

He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention"; He et al. 2023,
"DeBERTaV3" (the same encoder, pre-trained as ELECTRA; mDeBERTa-v3 is its multilingual vocabulary).
transformers' `models/deberta_v2/modeling_deberta_v2.py` (5.25) is the oracle the tests compare
against. The layers are BERT's (`model.EncoderLayer`: post-LN, fused Q/K/V on transformers'
query_proj / key_proj / value_proj); what differs is here:

- Attention scores add two terms read from a table of relative-position embeddings (2S, H):
  content-to-position (c2p: query i · the key projection of the embedding of δ(i, j)) and
  position-to-content (p2c: key j · the query projection of the embedding of δ(j, i)), all three
  divided by √(hs · (1 + number of terms)). δ is i − j, bucketed logarithmically past
  position_buckets / 2 (`log_buckets`) and clipped to ±S, where S is position_buckets (or
  max_relative_positions, or max_position_embeddings). With share_att_key (v3) the positions go
  through the layer's own query and key projections, else through pos_query_proj / pos_key_proj.
- The table is read by every layer: `RelativeEmbeddings` normalises it (norm_rel_ebd
  "layer_norm", v3) and buckets the distances once per forward (`Positions`); each layer projects it.
  Only the rows the batch's distances reach are kept (a 30-token text reads 59 of v3's 512), so
  the projections and the position terms cost what the lengths need; the values are the same.
- DeBERTa-v2 (not v3) adds a convolution over the embeddings to the first layer's output
  (`ConvLayer`, conv_kernel_size), each sequence zero-padded at its own ends.
- The embeddings (`Embeddings`): absolute positions only when position_biased_input (v2; v3 has
  none), segments only when type_vocab_size > 0, and a projection E → H without bias *before*
  the LayerNorm where embedding_size differs (ALBERT and ELECTRA project after it).

Where it differs from transformers, on purpose: attention runs through SDPA with the two position
terms as its float mask (transformers materialises the scores itself); padding rows are never
computed; the packed path (`attend_packed`) runs each run of equal-length sequences as one call.

Dimension letters: B batch, T (padded) length, L a run's length, c sequences in a run, N tokens,
M rows a convolution computes, H hidden size, E embedding width, nh heads, hs head size,
S the relative span (2S table rows), R the rows a batch reads, K the convolution's kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.encoder import ops
from bertkit.encoder.config import BertConfig
from bertkit.encoder.packing import Packed, Padding


def activation(name: str):
    """DeBERTa's conv_act and pooler_hidden_act: tanh (the convolution's default) or a config.ACTIVATIONS name."""
    return torch.tanh if name == "tanh" else ops.activation(name)


def log_buckets(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Relative distances (long, any shape) → their log buckets (long, same shape), in ±(buckets / 2 − 1)
    beyond which the table clips. Distances under buckets / 2 keep their value; farther ones grow
    logarithmically up to max_position. transformers' `make_log_bucket_position`, step for step in
    fp32, so a boundary distance lands where it lands there."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    magnitude = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    far = torch.ceil(torch.log(magnitude / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                     * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative.type_as(far), far * sign).long()


def relative_span(config: BertConfig) -> tuple[int, int]:
    """(S, max_position): the span of the table (S rows each side) and the distance the buckets reach."""
    max_position = config.max_relative_positions if config.max_relative_positions >= 1 \
        else config.max_position_embeddings
    return (config.position_buckets if config.position_buckets > 0 else max_position), max_position


def _tracing() -> bool:
    """Whether a graph is being traced (torch.compile, torch.export, the ONNX exporters)."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


@dataclass
class Positions:
    """What every layer's disentangled attention reads, made once per forward (`RelativeEmbeddings`)."""
    embeddings: torch.Tensor | None  # (R, H) the relative embeddings' rows read, normalised per norm_rel_ebd
    index: torch.Tensor | None  # (T, T) long: the bucketed distance i − j of key j from query i
    first_row: int  # the row of the whole (2S, H) table that `embeddings` starts at
    # (both None under relative_attention false: content scores alone)
    key_mask: torch.Tensor | None  # (B, 1, 1, T) bool, True at real keys; None without padding


class RelativeEmbeddings(nn.Module):
    """The table every layer reads (`encoder.rel_embeddings` on disk) and its LayerNorm (`encoder.LayerNorm`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.span, self.max_position = relative_span(config)
        self.buckets = config.position_buckets
        # relative_attention false (transformers' default; no release has it): no table, while the
        # LayerNorm exists wherever norm_rel_ebd names it, as there
        self.embeddings = nn.Embedding(2 * self.span, config.hidden_size) if config.relative_attention else None
        normed = "layer_norm" in [part.strip() for part in config.norm_rel_ebd.lower().split("|")]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if normed else None

    def of_length(self, length: int, key_mask: torch.Tensor | None = None) -> Positions:
        """The table and the bucketed distances of `length` tokens; a shorter sequence reads the
        top-left block of the index, as the distance alone decides it."""
        if self.embeddings is None:
            return Positions(None, None, 0, key_mask)
        ids = torch.arange(length, device=self.embeddings.weight.device)  # (T,)
        index = ids[:, None] - ids[None, :]  # (T, T): i − j
        if self.buckets > 0:
            index = log_buckets(index, self.buckets, self.max_position)
        # the rows δ + S and −δ + S can reach (δ is antisymmetric), clipped to the table as the terms clip;
        # a traced or exported graph keeps them all, as the length is not a constant there
        reach = self.span if _tracing() else int(index[-1, 0])  # the farthest distance's bucket
        first, last = max(0, self.span - reach), min(2 * self.span - 1, self.span + reach)
        table = self.embeddings.weight[first:last + 1]  # (R, H), R ≤ 2S
        return Positions(self.norm(table) if self.norm is not None else table, index, first, key_mask)

    def scores(self, length: int, padding: Padding | None) -> Positions:
        """`of_length` with a padded batch's key mask (the name `model.BertModel` asks every relative scheme)."""
        return self.of_length(length, None if padding is None else padding.key_mask)


class DisentangledAttention(nn.Module):
    """One layer's position terms: its own position projections (without share_att_key) and the
    attention that adds c2p and p2c to the content scores."""

    def __init__(self, config: BertConfig):
        super().__init__()
        kinds = config.pos_att_type or []
        self.c2p, self.p2c = "c2p" in kinds, "p2c" in kinds
        self.num_heads, self.head_dim, self.hidden = config.num_attention_heads, config.head_dim, config.hidden_size
        self.scale = math.sqrt(self.head_dim * (1 + self.c2p + self.p2c))
        # SDPA divides q·k by √hs; the queries carry the rest of DeBERTa's larger divisor
        self.query_factor = math.sqrt(self.head_dim) / self.scale
        self.span = relative_span(config)[0]
        self.share_att_key = config.share_att_key
        separate = config.relative_attention and not config.share_att_key
        self.pos_key_proj = nn.Linear(config.hidden_size, config.hidden_size) if separate and self.c2p else None
        self.pos_query_proj = nn.Linear(config.hidden_size, config.hidden_size) if separate and self.p2c else None
        self.pos_dropout = ops.Dropout(config.hidden_dropout_prob)

    def projections(self, layer: nn.Module, table: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(R, H) relative embeddings → their query and key projections (nh, R, hs) each, or None where unused.

        With share_att_key the layer's fused qkv projects them (a LoRA or int8 qkv included, as
        PEFT's query_proj and key_proj are called on them there); its value third is not used."""
        if table is None:  # relative_attention false
            return None, None
        table = self.pos_dropout(table)
        if self.share_att_key:
            pos_q, pos_k, _ = layer.qkv(table).split(self.hidden, dim=-1)  # (R, H) each
        else:
            pos_q = self.pos_query_proj(table) if self.pos_query_proj is not None else None
            pos_k = self.pos_key_proj(table) if self.pos_key_proj is not None else None

        def heads(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.view(-1, self.num_heads, self.head_dim).transpose(0, 1)  # (nh, R, hs)
        return heads(pos_q if self.p2c else None), heads(pos_k if self.c2p else None)

    def position_scores(self, q: torch.Tensor, k: torch.Tensor, pos_q: torch.Tensor | None,
                        pos_k: torch.Tensor | None, index: torch.Tensor, first_row: int) -> torch.Tensor | float:
        """c2p + p2c, each divided by the scale: q (c, nh, Lq, hs) of the first Lq tokens (L, or 1
        for the first token alone), k (c, nh, L, hs), index (L, L), the projected rows from
        first_row of the table on → (c, nh, Lq, L) float."""
        span, lq, length = self.span, q.shape[2], k.shape[2]
        score: torch.Tensor | float = 0.0
        if pos_k is not None:  # content → position: query i reads the embedding of δ(i, j)
            c2p = torch.matmul(q, pos_k.transpose(-1, -2))  # (c, nh, Lq, R)
            at = (index[:lq] + span).clamp(0, 2 * span - 1) - first_row  # (Lq, L)
            score = score + torch.gather(c2p, -1, at.expand(*c2p.shape[:2], lq, length)) / self.scale
        if pos_q is not None:  # position → content: key j reads the embedding of δ(j, i)
            p2c = torch.matmul(k, pos_q.transpose(-1, -2))  # (c, nh, L, R)
            at = (-index[:, :lq] + span).clamp(0, 2 * span - 1) - first_row  # (L, Lq): key j, query i
            gathered = torch.gather(p2c, -1, at.expand(*p2c.shape[:2], length, lq))  # (c, nh, L, Lq)
            score = score + gathered.transpose(-1, -2) / self.scale  # (c, nh, Lq, L)
        return score

    def attend(self, layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               projected: tuple[torch.Tensor | None, torch.Tensor | None], positions: Positions,
               key_mask: torch.Tensor | None) -> torch.Tensor:
        """q (c, nh, Lq, hs), k, v (c, nh, L, hs), key_mask (c, 1, 1, L) bool or None → (c, nh, Lq, hs)."""
        length, index = k.shape[2], positions.index
        bias = 0.0 if index is None else self.position_scores(q, k, *projected, index[:length, :length],
                                                              positions.first_row)
        if not torch.is_tensor(bias):  # no position terms (pos_att_type empty): the scale alone differs
            bias = q.new_zeros(1, 1, 1, length)
        if key_mask is not None:
            bias = bias.masked_fill(~key_mask, float("-inf"))  # padding keys
        return ops.attention(q * self.query_factor, k, v, bias, layer.attention_dropout, layer.training)

    def forward(self, layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: Positions) -> torch.Tensor:
        """A padded batch: q (B, nh, Tq, hs) of the first Tq tokens, k, v (B, nh, T, hs) → (B, nh, Tq, hs)."""
        return self.attend(layer, q, k, v, self.projections(layer, positions.embeddings), positions,
                           positions.key_mask)

    def attend_packed(self, layer: nn.Module, qkv: torch.Tensor, packed: Packed, positions: Positions,
                      first_only: bool = False) -> torch.Tensor:
        """(N, 3H) fused projections of packed sequences → (N, H), each sequence seeing only itself;
        first_only: each sequence's first token alone → (B, H). One call per run of equal lengths,
        whose index is the top-left block of the longest sequence's."""
        nh, hs = self.num_heads, self.head_dim
        projected = self.projections(layer, positions.embeddings)  # once per layer, for every run
        out = qkv.new_empty(len(packed.lengths) if first_only else qkv.shape[0], nh * hs)  # (B or N, H)
        done = 0
        for first, count, length in packed.runs:
            block = qkv[first:first + count * length].view(count, length, 3, nh, hs)  # (c, L, 3, nh, hs)
            q, k, v = block.permute(2, 0, 3, 1, 4).unbind(0)  # (c, nh, L, hs) each
            y = self.attend(layer, q[:, :, :1] if first_only else q, k, v, projected, positions, None)
            if first_only:
                out[done:done + count] = y.reshape(count, nh * hs)  # (c, H)
                done += count
            else:
                out[first:first + count * length] = y.transpose(1, 2).reshape(count * length, nh * hs)
        return out


@dataclass
class Rows:
    """Where the rows a convolution computes sit in their sequences."""
    at: torch.Tensor  # (M,) long: the rows of the (N, H) input
    position: torch.Tensor  # (M,) long: each row's position in its sequence
    length: torch.Tensor  # (M,) long: the length of each row's sequence


def padded_rows(padding: Padding | None, batch: int, length: int, device: torch.device,
                first_only: bool = False) -> Rows:
    """The N real rows of a (B, T) batch (unpadded in row-major order), or each sequence's first row."""
    if padding is None:
        flat = torch.arange(batch * length, device=device)  # (N,)
        lengths = torch.full((batch, length), length, device=device)  # (B, T)
    else:
        flat = padding.index  # (N,) b * T + t
        lengths = padding.key_mask.view(batch, length).sum(1, keepdim=True).expand(batch, length)  # (B, T)
    # Each row's position and length are read from (B, T) grids at its flat index, not computed as
    # flat % T and flat // T: the ONNX exporter has no remainder by a symbolic length.
    positions = torch.arange(length, device=device).expand(batch, length)  # (B, T)
    rows = Rows(torch.arange(flat.shape[0], device=device), positions.reshape(-1)[flat], lengths.reshape(-1)[flat])
    return _first_rows(rows) if first_only else rows


def packed_rows(packed: Packed, first_only: bool = False) -> Rows:
    """The N rows of packed sequences, or each sequence's first row."""
    lengths = torch.tensor(packed.lengths, device=packed.position_ids.device)[packed.sequence_index]  # (N,)
    rows = Rows(torch.arange(lengths.shape[0], device=lengths.device), packed.position_ids, lengths)
    return _first_rows(rows) if first_only else rows


def _first_rows(rows: Rows) -> Rows:
    first = rows.position == 0  # (N,) bool
    return Rows(rows.at[first], rows.position[first], rows.length[first])


class ConvLayer(nn.Module):
    """DeBERTa-v2's convolution (`encoder.conv` on disk): the first layer's output at each row gains
    act(conv(embeddings)) over K neighbours of its own sequence (zeros past either end, as the
    reference's masked padded batch gives), then a LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2,
                              groups=config.conv_groups)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = ops.Dropout(config.hidden_dropout_prob)
        self.act = activation(config.conv_act)

    def forward(self, embedded: torch.Tensor, out: torch.Tensor, rows: Rows) -> torch.Tensor:
        """embedded: (N, H) the first layer's input; out: (M, H) its output at `rows` → (M, H)."""
        size, reach = self.conv.kernel_size[0], self.conv.padding[0]
        neighbours = []
        for offset in range(-reach, size - reach):  # the K inputs of each output, zero outside its sequence
            inside = ((rows.position + offset >= 0) & (rows.position + offset < rows.length))  # (M,)
            source = (rows.at + offset).clamp(0, embedded.shape[0] - 1)  # (M,)
            neighbours.append(embedded[source] * inside[:, None].to(embedded.dtype))  # (M, H)
        window = torch.stack(neighbours, dim=-1)  # (M, H, K): each row a sequence of K
        conv = F.conv1d(window, self.conv.weight, self.conv.bias, groups=self.conv.groups).squeeze(-1)  # (M, H)
        return self.norm(out + self.act(self.dropout(conv)))


class Embeddings(nn.Module):
    """token (+ absolute position where position_biased_input) (+ segment where type_vocab_size > 0)
    embeddings of width E, projected to H without bias where E differs, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        dim = config.embedding_dim
        self.word_embeddings = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, dim)
                                    if config.position_biased_input else None)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, dim) if config.has_segments else None
        self.embed_proj = nn.Linear(dim, config.hidden_size, bias=False) if dim != config.hidden_size else None
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = ops.Dropout(config.hidden_dropout_prob)
        self.reads_segments = config.reads_segments

    def _finish(self, x: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """x: (..., E) token embeddings; positions: (T,) or (N,); token_type_ids as x's rows → (..., H)."""
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(positions)  # (..., E)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids if self.reads_segments
                                               else torch.zeros_like(token_type_ids))  # (..., E)
        if self.embed_proj is not None:
            x = self.embed_proj(x)  # (..., H)
        return self.dropout(self.norm(x))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                sparse_word_grad: bool = False) -> torch.Tensor:
        """(B, T) ids and segments → (B, T, H); sparse_word_grad as `model.Embeddings`."""
        sparse = (sparse_word_grad and input_ids.device.type == "cpu" and torch.is_grad_enabled()
                  and not torch.compiler.is_compiling())
        words = self.word_embeddings
        x = F.embedding(input_ids, words.weight, words.padding_idx, sparse=sparse)  # (B, T, E)
        return self._finish(x, torch.arange(input_ids.shape[1], device=input_ids.device), token_type_ids)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       position_ids: torch.Tensor) -> torch.Tensor:
        """(N,) ids, segments and positions (0-based in each sequence) of packed sequences → (N, H)."""
        return self._finish(self.word_embeddings(input_ids), position_ids, token_type_ids)


__all__ = ["ConvLayer", "DisentangledAttention", "Embeddings", "Positions", "RelativeEmbeddings", "Rows",
           "log_buckets", "packed_rows", "padded_rows", "relative_span"]
