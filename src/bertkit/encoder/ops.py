"""Training kernels that PyTorch's CPU defaults make slow, written with plain tensor ops.

Profiling a `mini` pre-training step on 2 CPU cores (bf16 autocast) showed two costs that have
nothing to do with the model's arithmetic:

- Dropout masks. `torch.bernoulli_` draws one 32-bit random number per element and costs about as
  much as all the attention matmuls; with attention dropout on, SDPA also leaves its fused CPU
  kernel for the math path. `dropout` here draws 64 random bits and cuts them into four 16-bit
  lanes, one per element, in a third of bernoulli_'s time. CUDA keeps `F.dropout`, which is
  fused there.
- The MLM cross-entropy over a (M, V) bf16 logit matrix: an fp32 copy, log-softmax, a zero-filled
  one-hot gradient, the log-softmax backward and a copy back to bf16, each a full pass over
  M × 30k values. `sparse_cross_entropy` reads the logits once forward and once backward, in
  row chunks whose fp32 temporaries stay in cache, and writes the gradient in the logits' dtype.

Together they make a `mini` training step over a third faster on 2 threads, with the same losses
(docs/design.md; `bench/pretrain.py` gives the ratios against `transformers`).

Both are exact in what they compute (up to float summation order); the dropout probability is
rounded to a multiple of 2⁻¹⁵ (0.1 → 0.100006) and the kept values are scaled by 1 / (1 - that).
Random numbers come from torch's default generator, so seeds and saved RNG states still fix them.
The price: a dropout mask is kept for the backward pass in the activations' dtype (2 bytes per
element under bf16, 4 in fp32) where `F.dropout` keeps 1 byte.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LANE_BITS = 15  # random_() on int64 draws from [0, 2**63): the low 15 bits of every 16-bit lane are uniform
_LANE_VALUES = 1 << _LANE_BITS


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device,
              dtype: torch.dtype = torch.bool) -> tuple[torch.Tensor, float]:
    """(mask of `shape`: 1 with probability 1 - p', else 0, in `dtype`), and p' = round(p · 2¹⁵) / 2¹⁵.

    A mask in the activations' dtype multiplies without a conversion pass (a bool one needs one).
    """
    threshold = round(p * _LANE_VALUES)
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    if torch.compiler.is_compiling():  # functional ops only: the compiler fuses them
        random_fill_(words)
        keep = words.view(torch.int16)[:n].bitwise_and(_LANE_VALUES - 1).ge(threshold).to(dtype)
    else:
        lanes = words.random_().view(torch.int16)[:n].bitwise_and_(_LANE_VALUES - 1)
        keep = torch.ge(lanes, threshold, out=torch.empty(n, dtype=dtype, device=device))
    return keep.view(shape), threshold / _LANE_VALUES


@torch.library.custom_op("bertkit::random_fill_", mutates_args=("words",))
def random_fill_(words: torch.Tensor) -> None:
    """words.random_(), as an op that torch.compile calls as it is (Dynamo cannot trace random_()).

    In place on a fresh tensor, so that no compiler pass merges two draws of the same size into
    one: a graph did exactly that with an out-of-place op, giving two dropouts the same mask.
    """
    words.random_()


class _MaskedScale(torch.autograd.Function):
    """y = x · keep · scale, with the same mask in the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    keep, rounded = keep_mask(x.shape, p, x.device, x.dtype)
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - rounded))


class Dropout(nn.Module):
    """`nn.Dropout` with the fast CPU mask of `dropout` (no parameters: checkpoints unchanged)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
              dropout_p: float, training: bool) -> torch.Tensor:
    """softmax(q kᵀ / √hs + mask) v, with dropout on the probabilities while training.

    q, k, v: (B, nh, T, hs); key_mask: (B, 1, 1, T) bool, True where a key may be attended, or a
    float mask added to the scores (MPNet's relative bias, -inf at padding keys) broadcast to
    (B, nh, T, T), or None. Without dropout this is `F.scaled_dot_product_attention` (fused
    kernels). With dropout on CPU the probabilities are materialised, as SDPA's own math path
    does, but masked by `dropout`; so they are with a float mask under torch.export (below).
    """
    if key_mask is not None and key_mask.is_floating_point():
        key_mask = key_mask.to(q.dtype)  # SDPA takes a float mask in the queries' dtype (bf16 autocast)
    # A float mask under torch.export (MPNet's bias, DeBERTa's position terms, in `bertkit export`)
    # takes the written-out path: the ONNX exporter's decomposition of SDPA with such a mask
    # reshapes its output as a view its strides do not allow, and stops.
    exporting = torch.compiler.is_exporting() and key_mask is not None and key_mask.is_floating_point()
    dropping = training and dropout_p > 0.0
    if not exporting and (not dropping or q.device.type != "cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p if dropping else 0.0)
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # (B, nh, T, T)
    if key_mask is not None and key_mask.is_floating_point():
        scores = scores + key_mask
    elif key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1)  # (B, nh, T, T)
    probs = dropout(probs, dropout_p, True) if dropping else probs
    return torch.matmul(probs, v)  # (B, nh, T, hs)


class _SparseCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (M, V) logits against (M,) targets, and each row's argmax.

    fp32 math, chunked over rows; the argmax comes from the same pass that finds each row's
    maximum for the log-sum-exp, while the chunk is in cache.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (M,)
        predictions = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)  # (M,)
        for start in range(0, logits.shape[0], rows):
            chunk = logits[start:start + rows]
            top, predictions[start:start + rows] = chunk.max(dim=-1)  # exact in any dtype
            top = top.float()[:, None]
            # bf16 - fp32 promotes to fp32 in the same pass: no separate fp32 copy of the chunk
            lse[start:start + rows] = (chunk - top).exp_().sum(-1).log_().add_(top.squeeze(1))
        picked = logits.gather(1, targets[:, None]).squeeze(1).float()  # (M,)
        ctx.save_for_backward(logits, targets, lse)
        ctx.rows = rows
        ctx.mark_non_differentiable(predictions)
        return (lse - picked).mean(), predictions

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _predictions_grad: None):
        logits, targets, lse = ctx.saved_tensors
        scale = grad.float() / logits.shape[0]
        out = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.rows):
            stop = min(start + ctx.rows, logits.shape[0])
            probs = (logits[start:stop] - lse[start:stop, None]).exp_()  # fp32 softmax rows
            probs[torch.arange(stop - start, device=probs.device), targets[start:stop]] -= 1.0
            out[start:stop] = probs.mul_(scale)
        return out, None, None


def sparse_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`F.cross_entropy(logits.float(), targets)`, `logits.argmax(-1)`) for (M, V) logits, M ≥ 1,
    without -100 targets: the loss and the predicted ids (for accuracy, without another pass).

    Computes in fp32 whatever the logits' dtype (as autocast would) and returns the gradient in
    the logits' dtype; about 1M values per chunk keep the fp32 temporaries in cache. On CPU only:
    elsewhere this is `F.cross_entropy`, whose kernels do not pay for the copies the same way.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"need (M, V) logits and (M,) targets, got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    if logits.device.type != "cpu":  # GPUs run the plain ops as a few large kernels
        return F.cross_entropy(logits.float(), targets), logits.detach().argmax(-1)
    rows = max(1, (1 << 20) // max(1, logits.shape[1]))
    return _SparseCrossEntropy.apply(logits, targets, rows)


__all__ = ["dropout", "Dropout", "attention", "sparse_cross_entropy", "keep_mask"]


def activation(name: str):
    """The FFN (or classifier head) non-linearity named in config.json (`hidden_act`,
    `classifier_activation`; the set of `config.ACTIVATIONS`), for BERT's and ModernBERT's layers."""
    if name == "gelu":
        return F.gelu  # exact erf form, as the original BERT
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown activation {name!r}")
