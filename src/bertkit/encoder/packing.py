"""Sequences without padding: where the real tokens of a batch sit, and attention over them.

Two layouts, used by the encoder in `model.py` (this module is its kernels, as MosaicBERT keeps
`bert_padding.py` apart from its model):

- `Padding`: a (B, T) batch with right padding. Dense layers and LayerNorm run on the N real
  tokens only (a packed (N, H) tensor, `unpad`); attention sees the padded (B, T) layout again
  (`pad`) with the padding mask. Used by training and by `BertModel.forward`.
- `Packed`: sequences laid end to end, no padding anywhere (the inference engine's layout,
  `BertModel.forward_packed`). Attention runs per *run* of neighbouring sequences of equal length,
  as one batched SDPA call over a view of the packed tensor; on CUDA in 16 bits, as one
  variable-length flash-attention call (`torch.nn.attention.varlen`).

Native kernel (CPU, fp32 or bf16, inference, no scores bias): every sequence of up to 512 tokens
attends in one call of bertkit's own kernel (`kernels/attention.cpp`, `native_attention`), which
does each (sequence, head) in registers and measured faster than SDPA at every length it takes
(docs/design.md has the sweep). Where it cannot be compiled, SDPA as above.

Key windows (CPU, fp32, inference, without the native kernel): for most lengths 1-13 short of a
multiple of 16, each sequence reads its keys through a window rounded up to that multiple, the
rows past the sequence masked with -inf (`key_windows`, `windowed_attention`): SDPA's CPU flash
kernel runs the last length % 16 keys of every score row through a slow partial-vector path.
docs/design.md has the sweep that chose the lengths.

Dimension letters: B batch, T sequence length, N real tokens, H hidden size, nh heads, hs head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.encoder import native, ops


@dataclass
class Padding:
    """Where the real tokens sit in a (B, T) batch; None-free only when the batch has padding."""
    index: torch.Tensor  # (N,) long: flat positions b * T + t of real tokens
    key_mask: torch.Tensor  # (B, 1, 1, T) bool: True where a key may be attended
    batch: int
    length: int

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> "Padding | None":
        """None when there is no padding: then nothing is gathered or scattered."""
        mask = attention_mask.bool()
        if bool(mask.all()):
            return None
        batch, length = mask.shape
        index = mask.flatten().nonzero().squeeze(1)  # (N,)
        return cls(index=index, key_mask=mask[:, None, None, :], batch=batch, length=length)

    def first_rows(self) -> torch.Tensor:
        """(B,) long: the row of each sequence's first token among the N real ones (right padding)."""
        lengths = self.key_mask.view(self.batch, self.length).sum(1)  # (B,)
        return lengths.cumsum(0) - lengths

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """(N, D) → (B, T, D) with zeros at padding positions."""
        out = packed.new_zeros(self.batch * self.length, packed.shape[-1])
        out.index_copy_(0, self.index, packed)
        return out.view(self.batch, self.length, -1)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, T, D) → (N, D)."""
        return padded.reshape(self.batch * self.length, -1).index_select(0, self.index)


@dataclass
class Packed:
    """Sequences laid end to end, no padding anywhere: row r of an (N, ...) tensor is one token.

    Built by `from_lengths`; the inference engine orders each batch by length so that sequences
    of equal length sit next to each other and attend as one batched call (a `run`).
    """
    lengths: list[int]  # tokens of each of the B sequences, in packed order
    starts: torch.Tensor  # (B,) long: row of each sequence's first token ([CLS])
    position_ids: torch.Tensor  # (N,) long: 0 … len-1 within each sequence
    sequence_index: torch.Tensor  # (N,) long: which sequence each row belongs to
    runs: list[tuple[int, int, int]]  # (first row, sequences, length) of equal-length neighbours
    cu_seqlens: torch.Tensor  # (B + 1,) int32 cumulative lengths, for the varlen kernel
    length_tensor: torch.Tensor  # (B,) long: lengths, for the native kernel (on the CPU)

    @classmethod
    def from_lengths(cls, lengths: list[int], device: torch.device | str = "cpu") -> "Packed":
        if not lengths or min(lengths) < 1:
            raise ValueError(f"every packed sequence needs at least one token, got lengths {lengths[:8]}")
        lens = torch.tensor(lengths, dtype=torch.long)
        ends = lens.cumsum(0)
        starts = ends - lens  # (B,)
        total = int(ends[-1])
        sequence_index = torch.repeat_interleave(torch.arange(len(lengths)), lens)  # (N,)
        position_ids = torch.arange(total) - starts[sequence_index]  # (N,)
        runs: list[tuple[int, int, int]] = []
        for i, n in enumerate(lengths):
            if runs and runs[-1][2] == n:
                first, count, _ = runs[-1]
                runs[-1] = (first, count + 1, n)
            else:
                runs.append((int(starts[i]), 1, n))
        cu = torch.cat([torch.zeros(1, dtype=torch.long), ends]).to(torch.int32)
        return cls(lengths=list(lengths), starts=starts.to(device), position_ids=position_ids.to(device),
                   sequence_index=sequence_index.to(device), runs=runs, cu_seqlens=cu.to(device),
                   length_tensor=lens)

    def attend(self, layer: nn.Module, qkv: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(N, 3H) fused projections → (N, H) attention outputs, each sequence seeing only itself.

        layer: the encoder layer (`model.EncoderLayer`): its num_heads, head_dim,
        attention_dropout and training mode are read.
        bias: scores bias by relative position (MPNet's, `relative.py`), (1, nh, T, T) for a T of
        at least the longest sequence, or None: a run of length L adds its top-left (L, L) block.
        With a bias every run goes through SDPA (the varlen kernel and the key windows take none).
        """
        nh, hs = layer.num_heads, layer.head_dim
        if bias is None and qkv.device.type == "cuda" and qkv.dtype in (torch.float16, torch.bfloat16):
            from torch.nn.attention.varlen import varlen_attn

            q, k, v = qkv.view(-1, 3, nh, hs).unbind(1)  # (N, nh, hs) each
            longest = max(self.lengths)
            y = varlen_attn(q, k, v, self.cu_seqlens, self.cu_seqlens, longest, longest)  # (N, nh, hs)
            return y.reshape(qkv.shape[0], nh * hs)
        out = qkv.new_empty(qkv.shape[0], nh * hs)  # (N, H)
        runs = self._native(layer, qkv, bias, out, first_only=False)
        if not runs:
            return out
        if len(self.runs) == 1 and runs is self.runs and bias is None and not key_windows(layer, qkv, runs[0][2]):
            # one length, all of it here: SDPA's output, transposed, is already (N, H) in order
            count, length = self.runs[0][1:]
            q, k, v = qkv.view(count, length, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)
            y = ops.attention(q, k, v, None, layer.attention_dropout, layer.training)  # (c, nh, L, hs)
            return y.transpose(1, 2).reshape(qkv.shape[0], nh * hs)  # a view when SDPA's layout allows
        for first, count, length in runs:
            rows = slice(first, first + count * length)
            # written in place: no concatenation of the runs' outputs afterwards
            target = out[rows].view(count, length, nh, hs)
            if bias is None and key_windows(layer, qkv, length):
                windowed_attention(qkv, first, length, target)
                continue
            q, k, v = (qkv[rows].view(count, length, 3, nh, hs)  # (c, L, 3, nh, hs), a view
                       .permute(2, 0, 3, 1, 4).unbind(0))  # (c, nh, L, hs) each
            mask = None if bias is None else bias[:, :, :length, :length]  # (1, nh, L, L)
            y = ops.attention(q, k, v, mask, layer.attention_dropout, layer.training)  # (c, nh, L, hs)
            target.copy_(y.transpose(1, 2))
        return out

    def attend_first(self, layer: nn.Module, qkv: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(N, 3H) fused projections → (B, H): attention of each sequence's first token alone
        (bias: see `attend`)."""
        nh, hs = layer.num_heads, layer.head_dim
        out = qkv.new_empty(len(self.lengths), nh * hs)  # (B, H)
        native_runs = set(self.runs) - set(self._native(layer, qkv, bias, out, first_only=True))
        done = 0
        for first, count, length in self.runs:
            if (first, count, length) in native_runs:
                done += count
                continue
            block = qkv[first:first + count * length].view(count, length, 3, nh, hs)  # a view
            q = block[:, :1, 0].transpose(1, 2)  # (c, nh, 1, hs)
            k, v = block[:, :, 1].transpose(1, 2), block[:, :, 2].transpose(1, 2)  # (c, nh, L, hs)
            mask = None if bias is None else bias[:, :, :1, :length]  # (1, nh, 1, L)
            y = ops.attention(q, k, v, mask, layer.attention_dropout, layer.training)  # (c, nh, 1, hs)
            out[done:done + count] = y.reshape(count, nh * hs)
            done += count
        return out

    def _native(self, layer: nn.Module, qkv: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                first_only: bool) -> list[tuple[int, int, int]]:
        """Attention of the sequences the native kernel takes (`native_attention`), written into out;
        returns the runs left to PyTorch's kernels (all of them where the kernel does not apply)."""
        kernel = native_attention(layer, qkv, bias)
        if kernel is None:
            return self.runs
        taken = [length <= kernel.max_length for _, _, length in self.runs]
        if not any(taken):
            return self.runs
        nh, hs = layer.num_heads, layer.head_dim
        if all(taken):
            kernel(qkv, out, self.starts, self.length_tensor, nh, hs, first_only)
            return []
        index = torch.tensor([i for i, n in enumerate(self.lengths) if n <= kernel.max_length])
        starts, lengths = self.starts[index], self.length_tensor[index]
        if first_only:  # the kernel writes row b of its own (B', H) output
            out[index] = kernel(qkv, out.new_empty(len(index), nh * hs), starts, lengths, nh, hs, True)
        else:
            kernel(qkv, out, starts, lengths, nh, hs)
        return [run for run, native in zip(self.runs, taken) if not native]


def native_attention(layer: nn.Module, qkv: torch.Tensor, bias: torch.Tensor | None):
    """`native`'s attention kernel where it applies, else None: fp32 or bf16 on the CPU at
    inference (no dropout, no autograd, no compiler tracing), without a scores bias, for a head
    size it has code for, where it compiled (`native.status()` says why not)."""
    if (bias is not None or qkv.dtype not in native.Attention.dtypes or qkv.device.type != "cpu" or layer.training
            or qkv.stride(1) != 1 or (torch.is_grad_enabled() and qkv.requires_grad)
            or layer.head_dim not in native.Attention.head_sizes
            or torch.compiler.is_compiling() or torch.compiler.is_exporting()):
        return None
    return native.attention()


def mean_pool(hidden: torch.Tensor, layout: "Packed | torch.Tensor") -> torch.Tensor:
    """Each sequence's mean token state, [CLS] and [SEP] included (as sentence-transformers' mean
    pooling, whose attention mask covers them) → (B, H) in hidden's dtype.

    layout: the `Packed` of (N, H) packed states, or the (B, T) attention_mask (1 = token) of
    (B, T, H) padded states. A padded row without any token averages to zeros, not NaN.
    """
    if isinstance(layout, Packed):
        lengths = torch.tensor(layout.lengths, device=hidden.device, dtype=hidden.dtype)  # (B,)
        sums = hidden.new_zeros(len(layout.lengths), hidden.shape[1]).index_add_(
            0, layout.sequence_index, hidden)  # (B, H)
        return sums / lengths[:, None]
    mask = layout.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, H)


def _window(length: int) -> int:
    """Keys each query of a `length`-token sequence reads in `windowed_attention`: the length
    rounded up to a multiple of 16."""
    return -(-length // 16) * 16


def key_windows(layer: nn.Module, qkv: torch.Tensor, length: int) -> bool:
    """Whether sequences of `length` tokens attend through `windowed_attention`: fp32 on the
    CPU, at inference (no dropout, no autograd), for lengths of 8–384 tokens that are 1–13 short
    of a multiple of 16 (length % 16 of 3–15).

    Why: the CPU flash-attention kernel runs the last length % 16 keys of each score row through
    its slow partial-vector path, which made a 30-token sequence more than twice as slow per token
    as a 32-token one. One or two tokens past a multiple of 16, past 384 and below 8 tokens, the
    wider window measured the same or slower, so those lengths attend as they are (the sweep is in
    docs/design.md). fp32 only: bf16 takes another path of the kernel, and autograd would have
    to run backwards through overlapping views.
    """
    return (length % 16 > 2 and 8 <= length <= 384 and qkv.dtype == torch.float32
            and qkv.device.type == "cpu" and qkv.stride(1) == 1 and not layer.training
            and not (torch.is_grad_enabled() and qkv.requires_grad))


_MASKS: dict[int, torch.Tensor] = {}  # (1, 1, 1, window) -inf past each length, made once


def windowed_attention(qkv: torch.Tensor, first: int, length: int, out: torch.Tensor) -> None:
    """Attention of the consecutive `length`-token sequences from row `first` of the packed
    (N, 3H) projections, written into out (count, length, nh, hs): each query reads a window of
    `_window(length)` keys from its sequence's first row on — its own keys, then rows of the
    sequences after it, masked with -inf.

    No copy: the windows are overlapping strided views of `qkv`. The few sequences whose window
    would run past the last row read the same windows from a zero-padded copy of their rows, so
    every sequence goes through the same kernel call shape. Equal to attention over the sequence
    alone within float rounding (the masked keys get exactly zero weight), and bit-identical
    whatever the neighbours are, whose finite values are multiplied by those zeros (a neighbour
    whose projections overflowed to inf would turn its window's rows to NaN: a diverged model's).
    """
    count, _, nh, hs = out.shape
    window = _window(length)
    if length not in _MASKS:
        mask = torch.zeros(1, 1, 1, window)
        mask[..., length:] = float("-inf")
        _MASKS[length] = mask

    def attend(rows: torch.Tensor, start: int, sequences: int, target: torch.Tensor) -> None:
        step = rows.stride(0)
        q = rows[start:start + sequences * length].view(sequences, length, 3, nh, hs)[:, :, 0].transpose(1, 2)
        kv = rows.as_strided((sequences, window, 2, nh, hs), (length * step, step, nh * hs, hs, 1),
                             rows.storage_offset() + start * step + nh * hs)  # (c, W, 2, nh, hs) windows of K, V
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # (c, nh, W, hs) each
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=_MASKS[length])  # (c, nh, L, hs)
        target.copy_(y.transpose(1, 2))

    fit = min(count, max(0, (qkv.shape[0] - first - window) // length + 1))  # windows inside qkv's rows
    if fit:
        attend(qkv, first, fit, out[:fit])
    if fit < count:
        tail = qkv.new_zeros((count - fit) * length + window - length, qkv.shape[1])  # (rows, 3H)
        tail[:(count - fit) * length] = qkv[first + fit * length:first + count * length]
        attend(tail, 0, count - fit, out[fit:])
