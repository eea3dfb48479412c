"""Int8 inference: every nn.Linear as an int8 matrix multiply with per-token activation scales.

Why not `torch.ao.quantization.quantize_dynamic`: it scales a whole batch's activations with one
number, so (a) one outlier token ([CLS] and [SEP] carry large activations in BERT) costs every
other token its resolution — all-MiniLM-L6-v2 embeddings of BBC sentences came out at min
cosine 0.914 against fp32 — and (b) a text's result depends on which texts share its batch.
Here each token (row) gets its own asymmetric 8-bit range, weights get one scale per output
channel, and the product runs on `torch._int_mm` (int8 × int8 → int32, the CPU's VNNI/AMX
paths through oneDNN). Min cosine on the same sentences: 0.996; a row's result depends only
on that row, so batching invariance holds exactly as in fp32.

With x ≈ s · (q − z) per row (q int8, zero point z) and W ≈ diag(w) · Q per output channel:
    y = x Wᵀ + b = (s ⊗ w) ⊙ (q Qᵀ − z ⊗ Σ_k Q_k) + b
so one int8 GEMM plus two rank-1 corrections; Σ_k Q_k is computed once.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from bertkit.model import EncoderLayer

log = logging.getLogger(__name__)

CHUNK_ELEMENTS = 1 << 20  # int32 accumulators per block of rows (4 MiB: fits the L2/L3 of a core pair)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: (N, K) float → (q (N, K) int8, scale (N,), zero (N,)) with x ≈ scale · (q − zero)."""
    lo, hi = torch.aminmax(x, dim=1)  # (N,) each
    lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)  # the range holds 0, so the zero point fits int8
    scale = (hi - lo).clamp(min=1e-12) / 255  # (N,)
    zero = -128 - torch.round(lo / scale)  # (N,) in [-128, 127]
    q = (x / scale[:, None]).round().add(zero[:, None]).clamp(-128, 127).to(torch.int8)  # (N, K)
    return q, scale, zero


def dequantize(acc: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, weight_scale: torch.Tensor,
               column_sums: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """acc (N, M) int32 = q Qᵀ → y (N, M) float32 (the formula in the module docstring)."""
    return acc.float() * (scale[:, None] * weight_scale) - (scale * zero)[:, None] * column_sums + bias


class _Kernels:
    """quantize_rows and dequantize, fused by torch.compile where a C++ compiler is available.

    Eager, each is 4–6 passes over its tensor; on 2 CPU threads they cost more than the int8
    matmul itself (8192 × 384 → 1152: quantize 52 ms, dequantize 135 ms, `_int_mm` 44 ms; fused:
    14 and 24 ms). The compiled functions compute the same values (checked in the tests).
    Compilation happens once per process on first use (seconds; cached on disk by inductor);
    BERTKIT_INT8_EAGER=1, or a failed compilation, keeps the eager functions.
    """

    def __init__(self) -> None:
        self.quantize, self.dequantize = quantize_rows, dequantize
        self.tried = os.environ.get("BERTKIT_INT8_EAGER") == "1"

    def get(self):
        if not self.tried:
            self.tried = True
            try:
                q = torch.compile(quantize_rows, dynamic=True)
                d = torch.compile(dequantize, dynamic=True)
                probe = torch.randn(3, 8)
                qq, sc, zz = q(probe)
                d(torch._int_mm(qq.repeat(6, 1)[:17], torch.ones(8, 8, dtype=torch.int8))[:3], sc, zz,
                  torch.ones(8), torch.ones(8), torch.zeros(8))
                self.quantize, self.dequantize = q, d
            except Exception as err:  # no C++ compiler, or an inductor limitation: stay eager
                log.info("int8: torch.compile unavailable (%s); using eager kernels", type(err).__name__)
        return self.quantize, self.dequantize


_KERNELS = _Kernels()


class Int8Linear(nn.Module):
    """A frozen nn.Linear for inference: int8 weights (per output channel), int8 activations
    (per row, asymmetric, range including 0), int32 accumulation, fp32 output."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        scale = weight.abs().amax(1).clamp(min=1e-12) / 127  # (out,)
        q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (out, in)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight_t", q.t().contiguous())  # (in, out): _int_mm's layout
        self.register_buffer("weight_scale", scale)  # (out,)
        self.register_buffer("column_sums", q.float().sum(1) * scale)  # (out,) Σ_k Q_k · w
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.register_buffer("bias", bias)  # (out,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) float → (..., out) float32."""
        shape = x.shape[:-1]
        quantize, dequantize = _KERNELS.get()
        q, scale, zero = quantize(x.reshape(-1, self.in_features).float())  # (N, in) int8, (N,), (N,)
        # Row blocks of ~1M int32 accumulators: each block is dequantized while it is still in
        # cache instead of going to memory and back (8192 × 384 → 1152 on 2 threads: 39 → 26 ms).
        rows = max(256, CHUNK_ELEMENTS // self.out_features)
        if q.shape[0] <= rows:
            acc = torch._int_mm(q, self.qweight_t)  # (N, out) int32
            y = dequantize(acc, scale, zero, self.weight_scale, self.column_sums, self.bias)  # (N, out)
            return y.view(*shape, self.out_features)
        y = torch.empty(q.shape[0], self.out_features)  # (N, out)
        for start in range(0, q.shape[0], rows):
            block = slice(start, start + rows)
            acc = torch._int_mm(q[block], self.qweight_t)  # (rows, out) int32
            y[block] = dequantize(acc, scale[block], zero[block], self.weight_scale, self.column_sums,
                                  self.bias)
        return y.view(*shape, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace every nn.Linear inside `module` (in place) by an Int8Linear, and give each encoder
    layer the fused int8 feed-forward (`Int8EncoderLayer`); returns `module`."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child)
            if type(child) is EncoderLayer:
                child.__class__ = Int8EncoderLayer  # same modules and weights; only the FFN's schedule differs
    return module


# ---------------------------------------------------------------------------------------------
# the feed-forward, fused
# ---------------------------------------------------------------------------------------------
def dequantize_act_quantize(acc: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                            weight_scale: torch.Tensor, column_sums: torch.Tensor, bias: torch.Tensor,
                            act) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ffn_in's int32 accumulators → act(ffn_in(x)) quantized for ffn_out, in one fused kernel."""
    return quantize_rows(act(dequantize(acc, scale, zero, weight_scale, column_sums, bias)))


def dequantize_add_norm(acc: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                        weight_scale: torch.Tensor, column_sums: torch.Tensor, bias: torch.Tensor,
                        residual: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """ffn_out's int32 accumulators → LayerNorm(residual + ffn_out(h)), fused."""
    y = residual + dequantize(acc, scale, zero, weight_scale, column_sums, bias)
    return torch.nn.functional.layer_norm(y, y.shape[-1:], norm_weight, norm_bias, eps)


class _FusedKernels:
    """The feed-forward's two fused steps, compiled once per activation function where the
    row kernels compiled (`_KERNELS` has found out whether torch.compile works here);
    compile=False keeps them eager."""

    def __init__(self, compile: bool = True) -> None:
        self.compile = compile
        self.cache: dict = {}

    def feed_forward(self, act):
        if act not in self.cache:
            pair = (lambda acc, *a: dequantize_act_quantize(acc, *a, act), dequantize_add_norm)
            if self.compile and _KERNELS.get()[0] is not quantize_rows:
                try:
                    pair = tuple(torch.compile(f, dynamic=True) for f in pair)
                except Exception as err:  # noqa: BLE001  an inductor limitation: stay eager
                    log.info("int8: feed-forward kernels not compiled (%s)", type(err).__name__)
            self.cache[act] = pair
        return self.cache[act]


_FUSED = _FusedKernels()


class Int8EncoderLayer(EncoderLayer):
    """An encoder layer whose Linears are Int8Linear, with the feed-forward run block by block.

    Per block of rows: the attention output's int8 GEMM, dequantized + residual + LayerNorm in one
    fused kernel; quantize that, ffn_in's int8 GEMM, then dequantize + activation + quantize in
    one fused kernel (the (rows, I) intermediate never goes to memory as floats), ffn_out's GEMM,
    then dequantize + residual + LayerNorm fused. Every step is per row, so the result equals the
    layer's own int8 forward (the same formulas, evaluated in another order: within float
    rounding) and stays independent of the batch. Inference only: dropout is the identity here.
    """

    def feed_forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        quantize, _ = _KERNELS.get()
        fused_act, fused_norm = _FUSED.feed_forward(self.act)
        ffn_in, ffn_out, norm = self.ffn_in, self.ffn_out, self.ffn_norm
        rows = max(256, CHUNK_ELEMENTS // ffn_in.out_features)
        out = torch.empty_like(x) if x.shape[0] > rows else None  # (N, H)
        for start in range(0, x.shape[0], rows):
            block = slice(start, start + rows)
            # the attention output's projection, dequantized into residual + LayerNorm (fused)
            q, scale, zero = quantize(y[block].float())  # (rows, H) int8
            acc = torch._int_mm(q, self.attn_out.qweight_t)  # (rows, H) int32
            a = fused_norm(acc, scale, zero, self.attn_out.weight_scale, self.attn_out.column_sums,
                           self.attn_out.bias, x[block], self.attn_norm.weight, self.attn_norm.bias,
                           self.attn_norm.eps)  # (rows, H)
            q, scale, zero = quantize(a)  # (rows, H) int8
            acc = torch._int_mm(q, ffn_in.qweight_t)  # (rows, I) int32
            q, scale, zero = fused_act(acc, scale, zero, ffn_in.weight_scale, ffn_in.column_sums, ffn_in.bias)
            acc = torch._int_mm(q, ffn_out.qweight_t)  # (rows, H) int32
            h = fused_norm(acc, scale, zero, ffn_out.weight_scale, ffn_out.column_sums, ffn_out.bias,
                           a, norm.weight, norm.bias, norm.eps)  # (rows, H)
            if out is None:
                return h
            out[block] = h
        return out
