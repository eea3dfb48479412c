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

from bertkit.encoder import native
from bertkit.encoder.model import EncoderLayer

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


def _int8_product(x: torch.Tensor, linear: tuple) -> tuple:
    """x (rows, in) float and a Linear's `Int8Linear.terms()` → the arguments of `dequantize`:
    the int32 accumulators (rows, out), x's scales and zero points, the Linear's own terms."""
    q, scale, zero = quantize_rows(x)  # (rows, in) int8
    return torch._int_mm(q, linear[0]), scale, zero, *linear[1:]


def linear_rows(x: torch.Tensor, out: torch.Tensor, qweight_t: torch.Tensor, weight_scale: torch.Tensor,
                column_sums: torch.Tensor, bias: torch.Tensor) -> None:
    """x (N, in) float → Int8Linear's output written into out (N, out) float32: quantize, int8
    GEMM, dequantize (compiled, the last kernel writes `out` directly: no copy after it)."""
    out.copy_(dequantize(*_int8_product(x, (qweight_t, weight_scale, column_sums, bias))))


class _Kernels:
    """quantize_rows, dequantize and linear_rows, fused by a compiler where a C++ compiler is
    available.

    Eager, quantize and dequantize are 4–6 passes over their tensor each; on 2 CPU threads they
    cost more than the int8 matmul itself, fused a fraction of it (docs/design.md has the
    timings). The compiled functions compute the same values (checked in the tests).

    Which kernels, BERTKIT_INT8_KERNELS=native|aot|compile|eager:
    - native (the default): bertkit's own (`encoder/kernels/int8.cpp` through `native.int8()`):
      per block of rows one pass before each int8 GEMM and one after it, which dequantizes, adds,
      normalizes, activates and quantizes the next GEMM's input in registers; compiled in about a
      second on a machine's first int8 start. Where it cannot be compiled, aot;
    - aot: ahead of time, once per machine, thread count and layer shape, kept on
      disk (`inference.aot`): the first int8 start on a machine compiles them (about a minute for
      MiniLM on 2 cores; it logs each kernel), every later process loads them in milliseconds, so
      an int8 start costs about what an fp32 one does; the kernels run as fast as compile's
      (`bench/int8_start.py`, docs/benchmarks.md). Where AOTInductor fails, compile takes over;
    - compile: torch.compile in each process (inductor caches the code on disk, but every process
      traces again: seconds per kernel at every start);
    - eager: no compiler (also what a failed compilation falls back to).
    BERTKIT_INT8_EAGER=1 is the same as eager.
    """

    def __init__(self) -> None:
        self.quantize, self.dequantize, self.linear = quantize_rows, dequantize, linear_rows
        mode = os.environ.get("BERTKIT_INT8_KERNELS", "native")
        if os.environ.get("BERTKIT_INT8_EAGER") == "1":
            mode = "eager"
        if mode not in ("native", "aot", "compile", "eager"):
            raise ValueError(f"BERTKIT_INT8_KERNELS={mode!r}: use native, aot, compile or eager")
        self.mode = mode
        self.tried = mode == "eager"
        self.aot: dict = {}

    def get(self):
        """(quantize, dequantize, linear) compiled by torch.compile (modes aot and compile: the
        aot mode's kernels are per layer shape, `linear_for`), else the eager functions."""
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
                self.linear = torch.compile(linear_rows, dynamic=True)
            except Exception as err:  # no C++ compiler, or an inductor limitation: stay eager
                log.info("int8: torch.compile unavailable (%s); using eager kernels", type(err).__name__)
                self.mode = "eager"
        return self.quantize, self.dequantize, self.linear

    def native(self):
        """`native.int8()` in mode native; None in the other modes, and where the native kernels
        cannot be had (the mode becomes aot then)."""
        if self.mode != "native":
            return None
        kernels = native.int8()
        if kernels is None:
            self.mode = "aot"
        return kernels

    def linear_for(self, layer: "Int8Linear"):
        """linear_rows(x, out, *layer.terms()) for blocks of `layer`'s rows, compiled."""
        if self.mode != "aot":
            return self.get()[2]
        key = (layer.in_features, layer.out_features)
        if key not in self.aot:
            example = (torch.randn(8, layer.in_features), torch.empty(8, layer.out_features), *layer.terms())
            self.aot[key] = self.ahead_of_time("int8_linear", linear_rows, example, rows=(0, 1))
        return self.aot[key]

    def ahead_of_time(self, name: str, fn, example: tuple, rows: tuple):
        """An `aot.AotKernel`, loaded (or compiled) now, so that a failure falls back at once to
        torch.compile (mode compile) rather than in the middle of a batch."""
        from bertkit.backend.aot import AotKernel

        kernel = AotKernel(name, fn, example, rows, __file__)
        try:
            kernel(*example)
        except Exception as err:
            log.warning("int8: ahead-of-time compilation failed (%s: %s); compiling in this process instead",
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            self.mode = "compile"
            return self.get()[2] if name == "int8_linear" else None
        return kernel


_KERNELS = _Kernels()


def native_kernels():
    """The native int8 kernels (`native.Int8`) where BERTKIT_INT8_KERNELS is native (the default)
    and they compiled here; else None."""
    return _KERNELS.native()


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
        x = x.reshape(-1, self.in_features).float()  # (N, in)
        terms = self.terms()
        # Row blocks of ~1M int32 accumulators: each block is dequantized while it is still in
        # cache instead of going to memory and back (a third less time: docs/design.md).
        rows = max(256, CHUNK_ELEMENTS // self.out_features)
        y = torch.empty(x.shape[0], self.out_features)  # (N, out)
        kernels = native_kernels()
        if kernels is not None:
            steps = _NativeSteps(kernels, min(rows, x.shape[0]), self.in_features, self.out_features)
            for start in range(0, x.shape[0], rows):
                block = slice(start, start + rows)
                q, scale, zero = steps.quantize(x[block], self)
                kernels.epilogue(steps.product(q, self.qweight_t), scale, zero, terms, out=y[block])
            return y.view(*shape, self.out_features)
        run = _KERNELS.linear_for(self)
        for start in range(0, x.shape[0], rows):
            run(x[start:start + rows], y[start:start + rows], *terms)
        return y.view(*shape, self.out_features)

    def terms(self) -> tuple[torch.Tensor, ...]:
        """(qweight_t, weight_scale, column_sums, bias): what the kernels take of this layer."""
        return self.qweight_t, self.weight_scale, self.column_sums, self.bias

    def input_range(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None:
        """How the native kernels quantize this Linear's input: None, per row at each call (a
        static Linear gives its calibrated range, `int8_static.StaticInt8Linear`)."""
        return None

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
# the layer after attention, fused
# ---------------------------------------------------------------------------------------------
def dequantize_add_norm(acc: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                        weight_scale: torch.Tensor, column_sums: torch.Tensor, bias: torch.Tensor,
                        residual: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """A Linear's int32 accumulators → LayerNorm(residual + the Linear's output)."""
    y = residual + dequantize(acc, scale, zero, weight_scale, column_sums, bias)
    return torch.nn.functional.layer_norm(y, y.shape[-1:], norm_weight, norm_bias, eps)


def attention_out_ffn_in(y: torch.Tensor, x: torch.Tensor, attn_out: tuple, attn_norm: tuple,
                         ffn_in: tuple, act) -> tuple[torch.Tensor, torch.Tensor]:
    """y (rows, H) attention output, x (rows, H) the layer's input → a = LayerNorm(x + attn_out(y))
    (rows, H) and act(ffn_in(a)) (rows, I). Each Linear is given as its `Int8Linear.terms()`,
    each LayerNorm as (weight, bias, eps)."""
    a = dequantize_add_norm(*_int8_product(y, attn_out), x, *attn_norm)  # (rows, H)
    return a, act(dequantize(*_int8_product(a, ffn_in)))  # (rows, H), (rows, I)


def ffn_out_norm(h: torch.Tensor, a: torch.Tensor, out: torch.Tensor, ffn_out: tuple, ffn_norm: tuple) -> None:
    """h (rows, I) activations, a (rows, H) the residual → LayerNorm(a + ffn_out(h)) written into out."""
    out.copy_(dequantize_add_norm(*_int8_product(h, ffn_out), a, *ffn_norm))  # (rows, H)


class _FusedKernels:
    """The layer after attention as two compiled graphs, split at the activations: compiled as
    one, inductor fused the activation into both passes of the quantization that follows (its
    range, then its values) and computed GELU's erf twice per value; materialized in between, the
    (rows, I) floats are written once and read twice while the block is in cache, and the graphs'
    kernels took 15–30% less time (kernel-level profile, 1,500 BBC sentences through MiniLM).
    Compiled once per activation function, where the row kernels compiled (`_KERNELS` has found
    out whether torch.compile works here); compile=False keeps them eager."""

    def __init__(self, compile: bool = True) -> None:
        self.compile = compile
        self.cache: dict = {}

    def after_attention(self, act, layer: "Int8EncoderLayer | None" = None):
        """run(y, x, out, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm) for blocks of rows;
        with `layer`, the mode aot's kernels for its shapes (`_KERNELS.mode`)."""
        if self.compile and layer is not None and _KERNELS.mode in ("aot", "native"):
            return self._ahead_of_time(act, layer)
        if act not in self.cache:
            def first(y, x, attn_out, attn_norm, ffn_in):
                return attention_out_ffn_in(y, x, attn_out, attn_norm, ffn_in, act)
            second = ffn_out_norm
            if self.compile and _KERNELS.get()[0] is not quantize_rows:
                first, second = torch.compile(first, dynamic=True), torch.compile(second, dynamic=True)

            def run(y, x, out, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm):
                a, h = first(y, x, attn_out, attn_norm, ffn_in)  # (rows, H), (rows, I)
                second(h, a, out, ffn_out, ffn_norm)
            self.cache[act] = run
        return self.cache[act]

    def _ahead_of_time(self, act, layer: "Int8EncoderLayer"):
        """The two graphs compiled ahead of time for this layer's sizes, epsilons and activation
        (`aot.AotKernel`: the tensors are arguments, the rest is fixed in the kernel's name)."""
        eps = (layer.attn_norm.eps, layer.ffn_norm.eps)
        key = (act, layer.attn_out.in_features, layer.ffn_in.out_features, eps)
        if key not in self.cache:
            def first(y, x, *t):
                return attention_out_ffn_in(y, x, t[0:4], (t[4], t[5], eps[0]), t[6:10], act)

            def second(h, a, out, *t):
                ffn_out_norm(h, a, out, t[0:4], (t[4], t[5], eps[1]))

            hidden, inner = layer.attn_out.in_features, layer.ffn_in.out_features
            terms = (*layer.attn_out.terms(), layer.attn_norm.weight, layer.attn_norm.bias, *layer.ffn_in.terms())
            rows = torch.randn(8, hidden), torch.randn(8, hidden)
            activation = _describe(act)
            k1 = _KERNELS.ahead_of_time(f"int8_attention_out_ffn_in[{activation},eps={eps[0]}]", first,
                                        (*rows, *terms), rows=(0, 1))
            tail = (*layer.ffn_out.terms(), layer.ffn_norm.weight, layer.ffn_norm.bias)
            k2 = k1 and _KERNELS.ahead_of_time(f"int8_ffn_out_norm[eps={eps[1]}]", second,
                                               (torch.randn(8, inner), rows[1], torch.empty(8, hidden), *tail),
                                               rows=(0, 1, 2))
            if not k2:  # the compiler failed: torch.compile's graphs (or eager) from now on
                return self.after_attention(act)

            def run(y, x, out, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm):
                a, h = k1(y, x, *attn_out, attn_norm[0], attn_norm[1], *ffn_in)  # (rows, H), (rows, I)
                k2(h, a, out, *ffn_out, ffn_norm[0], ffn_norm[1])
            self.cache[key] = run
        return self.cache[key]


_FUSED = _FusedKernels()


def _describe(act) -> str:
    """A name that tells activation functions apart, for a compiled kernel's key: a module's repr,
    a builtin's name, a Python function's name and a digest of its code (two lambdas differ)."""
    if isinstance(act, nn.Module):
        return repr(act)
    code = getattr(act, "__code__", None)
    name = getattr(act, "__qualname__", None) or repr(act)
    if code is None:
        return name
    import hashlib

    return f"{name}:{hashlib.sha1(code.co_code + repr(code.co_consts).encode()).hexdigest()[:8]}"


def _norm_params(norm: nn.LayerNorm) -> tuple:
    return norm.weight, norm.bias, norm.eps


class Int8EncoderLayer(EncoderLayer):
    """An encoder layer whose Linears are Int8Linear, with everything after attention run block
    by block in fused kernels (`_FusedKernels`).

    Per block of rows: the attention output's int8 GEMM, dequantized + residual + LayerNorm;
    quantized, ffn_in's GEMM, dequantized + activation; quantized, ffn_out's GEMM, dequantized +
    residual + LayerNorm, written into the layer's output. Every step is per row, so the result
    equals the layer's own int8 forward (the same formulas, evaluated in another order: within
    float rounding) and stays independent of the batch. Inference only: dropout is the identity.
    """

    def feed_forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        kernels = native_kernels()
        act = NATIVE_ACTIVATIONS.get(self.act)
        if kernels is not None and act is not None:
            return self._native_feed_forward(kernels, act, x, y)
        if any(linear.input_range() is not None for linear in (self.attn_out, self.ffn_in, self.ffn_out)):
            return super().feed_forward(x, y)  # static Linears, one at a time (`int8_static`)
        run = _FUSED.after_attention(self.act, self)
        params = (self.attn_out.terms(), _norm_params(self.attn_norm), self.ffn_in.terms(),
                  self.ffn_out.terms(), _norm_params(self.ffn_norm))
        return self._by_blocks(x, y, lambda y_, x_, out: run(y_, x_, out, *params))

    def _block_rows(self) -> int:
        """Rows per block after attention: a block's (rows, I) activations stay in cache."""
        return max(256, CHUNK_ELEMENTS // self.ffn_in.out_features)

    def _by_blocks(self, x: torch.Tensor, y: torch.Tensor, run) -> torch.Tensor:
        """The layer's output (N, H), run(y block as fp32, x block, out block) writing each block
        of `_block_rows` rows; one block is passed whole (each slice is a torch call, and each
        torch call gives the GIL up)."""
        rows = self._block_rows()
        out = torch.empty_like(x)  # (N, H)
        if x.shape[0] <= rows:
            run(y.float(), x, out)
            return out
        for start in range(0, x.shape[0], rows):
            block = slice(start, start + rows)
            run(y[block].float(), x[block], out[block])
        return out

    def _feed_forward_args(self, kernels, act: str):
        """`native.Int8.feed_forward_args` of this layer, made on first use and kept; made anew
        where the weights are not the ones it points into (a deep copy of the layer)."""
        linears = (self.attn_out, self.ffn_in, self.ffn_out)
        key = (act, *(linear.qweight_t.data_ptr() for linear in linears))
        kept = self.__dict__.get("_native_args")
        if kept is None or kept[0] != key:
            args = kernels.feed_forward_args(tuple(linear.terms() for linear in linears),
                                             tuple(linear.input_range() for linear in linears),
                                             (_norm_params(self.attn_norm), _norm_params(self.ffn_norm)), act)
            kept = self.__dict__["_native_args"] = (key, args)
        return kept[1]

    def _native_feed_forward(self, kernels, act: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """feed_forward through the native kernels: per block of rows, three int8 GEMMs
        (torch._int_mm), each followed by one pass of `native.Int8.epilogue` that also quantizes
        the next GEMM's input (per row, or with a static Linear's calibrated range); the (rows, I)
        activations are never stored as floats."""
        hidden, inner = self.attn_out.in_features, self.ffn_in.out_features
        rows = min(self._block_rows(), x.shape[0])
        if kernels.fused:  # the same steps in one C++ call per block
            args = self._feed_forward_args(kernels, act)
            buffers = kernels.feed_forward_buffers(rows, hidden, inner)
            return self._by_blocks(x, y, lambda y_, x_, out: kernels.feed_forward(args, y_, x_, out, buffers))
        steps = _NativeSteps(kernels, rows, hidden, inner)

        def run(y_: torch.Tensor, x_: torch.Tensor, out: torch.Tensor) -> None:
            q, scale, zero = steps.quantize(y_, self.attn_out)
            a = steps.floats(hidden)  # (rows, H): LayerNorm(x + attn_out(y)), the FFN's residual
            (qa, sa, za), into = steps.quantized_by(self.ffn_in)
            kernels.epilogue(steps.product(q, self.attn_out.qweight_t), scale, zero, self.attn_out.terms(),
                             residual=x_, norm=_norm_params(self.attn_norm), out=a, **into)
            (qh, sh, zh), into = steps.quantized_by(self.ffn_out)
            kernels.epilogue(steps.product(qa, self.ffn_in.qweight_t), sa, za, self.ffn_in.terms(), act=act, **into)
            kernels.epilogue(steps.product(qh, self.ffn_out.qweight_t), sh, zh, self.ffn_out.terms(),
                             residual=a, norm=_norm_params(self.ffn_norm), out=out)

        return self._by_blocks(x, y, run)


# ---------------------------------------------------------------------------------------------
# the native kernels (encoder/kernels/int8.cpp)
# ---------------------------------------------------------------------------------------------
NATIVE_ACTIVATIONS = {torch.nn.functional.gelu: "gelu", torch.nn.functional.relu: "relu"}


class _NativeSteps:
    """Buffers for one call's row blocks (at most `rows` rows), reused from block to block: the
    int8 inputs and their scales, two at a time (a GEMM's input and the next one's), the int32
    accumulators and a float block."""

    def __init__(self, kernels, rows: int, *widths: int):
        widest = max(widths)
        self.kernels = kernels
        self.int8 = [torch.empty(rows * widest, dtype=torch.int8) for _ in range(2)]
        self.scales = [torch.empty(2, rows) for _ in range(2)]
        self.acc = torch.empty(rows * widest, dtype=torch.int32)
        self.float_block = torch.empty(rows * widest)
        self.turn = 0
        self.block = rows

    def quantized_by(self, linear: Int8Linear) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], dict]:
        """Where an epilogue puts `linear`'s quantized input (the next buffers, alternating):
        ((q (rows, in) int8, the scale and zero point the GEMM's epilogue reads), the epilogue's
        keyword arguments for it)."""
        self.turn ^= 1
        q = self.int8[self.turn][:self.block * linear.in_features].view(self.block, linear.in_features)
        static = linear.input_range()
        if static is None:  # per row: the epilogue writes the scales
            scale, zero = self.scales[self.turn][:, :self.block].unbind()
            return (q, scale, zero), {"q": q, "q_scale": scale, "q_zero": zero}
        multiplier, scale, zero, zero_value = static
        return (q, scale, zero), {"q": q, "q_multiplier": multiplier, "q_static_zero": zero_value}

    def quantize(self, x: torch.Tensor, linear: Int8Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (rows, in) float, the first GEMM's input of a block, quantized as `linear` takes it."""
        self.block = x.shape[0]
        (q, scale, zero), into = self.quantized_by(linear)
        if "q_multiplier" in into:
            self.kernels.quantize(x, q, multiplier=into["q_multiplier"], static_zero=into["q_static_zero"])
        else:
            self.kernels.quantize(x, q, scale, zero)
        return q, scale, zero

    def product(self, q: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
        """torch._int_mm(q, weight_t) (rows, out) int32, into the reused accumulators."""
        acc = self.acc[:q.shape[0] * weight_t.shape[1]].view(q.shape[0], weight_t.shape[1])
        return torch._int_mm(q, weight_t, out=acc)

    def floats(self, width: int) -> torch.Tensor:
        return self.float_block[:self.block * width].view(self.block, width)
