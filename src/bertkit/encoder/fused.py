"""Linear layers fused with what follows them, for inference on the CPU (oneDNN).

Profiling all-MiniLM-L6-v2 embeddings of BBC sentences (fp32, 2 threads, ~8k tokens a batch)
put 9% of the time in `copy_` calls inside `addmm` — PyTorch's CPU addmm first writes the bias
into every output row, then multiplies into it — and another 6% in GELU and 1% in the residual
additions, each one more pass over a (tokens, width) tensor. oneDNN's matmul primitive, which
PyTorch ships as `torch.ops.mkldnn._linear_pointwise`, adds the bias inside the GEMM and can
apply the activation (GELU, erf or tanh form; ReLU) or a residual addition to each output tile
while it is still in cache.

`linear(module, x, post=..., residual=...)` takes that path when it is sound: no autograd
(inference mode or no_grad: the op has no backward), not under torch.compile, a CPU tensor of
the weight's dtype, fp32 or bf16, a plain nn.Linear (a LoRA or int8 layer keeps its own
forward) and a probe that found the op present and equal to the unfused result on this
machine. Otherwise it computes the same thing unfused. A layer with per-row adapter terms
(`bertkit.adapters.routed.RoutedLinear`: `base` and `add_rows`) runs its base here (fused
where it can) and adds the terms before the activation; a batch without its adapters runs the
base alone. The results equal the unfused ones up
to float summation order (≤ 1e-5 on the model's outputs: the inference tests compare against
transformers). BERTKIT_ONEDNN=0 turns it off.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# hidden_act → oneDNN post-op (name, scalars, algorithm); activations not listed run unfused.
POST_OPS = {
    "gelu": ("gelu", [None], "none"),  # erf form, as torch's nn.GELU() and BERT's checkpoints
    "gelu_new": ("gelu", [None], "tanh"),
    "gelu_pytorch_tanh": ("gelu", [None], "tanh"),
    "relu": ("relu", [], ""),
}

_PROBED: dict[torch.dtype, bool] = {}
_held_off = threading.local()  # .depth > 0 inside `unfused()`, on that thread only


def post_op(hidden_act: str) -> tuple | None:
    """The fused form of a config's hidden_act, or None when it has none."""
    return POST_OPS.get(hidden_act)


def _available(dtype: torch.dtype) -> bool:
    """Whether the oneDNN op exists here and agrees with F.linear (probed once per dtype)."""
    if dtype not in _PROBED:
        ok = os.environ.get("BERTKIT_ONEDNN", "1") != "0" and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        if ok:
            try:
                generator = torch.Generator().manual_seed(0)
                x = torch.randn(5, 16, generator=generator).to(dtype)
                w = torch.randn(8, 16, generator=generator).to(dtype)
                b = torch.randn(8, generator=generator).to(dtype)
                r = torch.randn(5, 8, generator=generator).to(dtype)
                ref = F.linear(x.float(), w.float(), b.float())
                tol = 1e-4 if dtype == torch.float32 else 0.1
                plain = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
                added = torch.ops.mkldnn._linear_pointwise.binary(x, r, w, b, "add")
                gelu = torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [None], "none")
                ok = (torch.allclose(plain.float(), ref, atol=tol, rtol=tol)
                      and torch.allclose(added.float(), ref + r.float(), atol=tol, rtol=tol)
                      and torch.allclose(gelu.float(), F.gelu(ref), atol=tol, rtol=tol))
            except (RuntimeError, NotImplementedError, TypeError):  # a build without oneDNN's matmul
                ok = False
        _PROBED[dtype] = ok
    return _PROBED[dtype]


@contextmanager
def unfused() -> Iterator[None]:
    """`linear` computes unfused inside (on this thread), with or without autograd. For a pass without a graph
    that must equal the same pass with one (GradCache's first pass over a batch, replayed later
    with a graph), and that would otherwise leave oneDNN a cached primitive per token count."""
    _held_off.depth = getattr(_held_off, "depth", 0) + 1
    try:
        yield
    finally:
        _held_off.depth -= 1


def usable(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether `linear` can take the fused path for `module` applied to `x`."""
    return (type(module) is nn.Linear and not torch.is_grad_enabled() and x.device.type == "cpu"
            and not getattr(_held_off, "depth", 0)
            and not torch.compiler.is_compiling()  # inductor fuses on its own, and cannot lower this op
            and x.dim() == 2 and x.dtype == module.weight.dtype
            and x.dtype in (torch.float32, torch.bfloat16) and _available(x.dtype))


def linear(module: nn.Module, x: torch.Tensor, post: tuple | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """post(module(x)) + residual, in one oneDNN call where `usable` (module: an nn.Linear or a
    wrapper of one; x (N, in); post: a POST_OPS value, applied before the residual; the two are
    not combined: residual only with post=None). Returns (N, out)."""
    if post is not None and residual is not None:
        raise ValueError("linear fuses an activation or a residual addition, not both")
    add_rows = getattr(module, "add_rows", None)
    if add_rows is not None:  # per-row adapter terms: the base fused, the terms added before `post`
        plan = module.active(x.shape[0])
        if plan is None:
            return linear(module.base, x, post, residual)
        y = add_rows(x, linear(module.base, x, residual=residual), plan)
        if post is not None:
            y = F.relu(y) if post[0] == "relu" else F.gelu(y, approximate=post[2] or "none")
        return y
    if usable(module, x):
        if residual is not None and residual.is_contiguous() and residual.dtype == x.dtype:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, module.weight, module.bias, "add")
        if residual is None:
            name, scalars, algorithm = post if post is not None else ("none", [], "")
            return torch.ops.mkldnn._linear_pointwise(x, module.weight, module.bias, name, scalars, algorithm)
    y = module(x)
    if post is not None:
        y = F.relu(y) if post[0] == "relu" else F.gelu(y, approximate=post[2] or "none")
    return y if residual is None else residual + y
