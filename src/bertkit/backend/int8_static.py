"""Static int8: every Linear of the encoder with activation scales calibrated once, on text.

Dynamic int8 (`int8.py`) measures each token's range at every call: a pass over the activations
before each GEMM. Here the range is measured once, over calibration text, and stored as data, so
at inference a Linear's input goes straight to int8 with a fixed scale and zero point (one
elementwise pass, fused with nothing to reduce) — the scheme of OpenVINO's NNCF post-training
quantization and of CTranslate2's int8 models.

The scheme, per nn.Linear inside the encoder (the pooler and the embedding projection included;
a task's head outside the encoder stays fp32: a few thousand multiply-adds a sequence):

- smoothing (SmoothQuant, Xiao et al. 2023, which NNCF also applies to transformers): BERT's
  activations have a few channels a hundred times larger than the rest (the outliers `int8.py`
  speaks of), and one scale for the whole tensor would leave the other channels a few levels.
  Each input channel j is divided by m_j = max|x_j|^α / max|W_·j|^(1−α) and W's column j
  multiplied by it, which leaves x Wᵀ unchanged and moves part of the range into the weights.
  α = `ALPHA` = 0.8, measured: on all-MiniLM-L6-v2 (300 BBC sentences to calibrate, 300 others
  held out) the held-out min cosine to fp32 peaks there, 0.9959, against 0.969 at α 0.5 and
  0.986 at 1.0 (`bench/int8_static_alpha.py`, docs/benchmarks.md);
- activations: one asymmetric 8-bit range per Linear input (per tensor), from the min and max of
  the smoothed input over every calibration token. Min/max rather than a percentile: BERT's
  largest activations ([CLS], [SEP], the outlier channels) are systematic and carry the output,
  so a percentile would clip exactly the values that matter, and after smoothing no lone value
  stretches the range far past the rest;
- weights: per output channel, symmetric, as dynamic int8's (`Int8Linear`), of the smoothed W.

With x̃ = x / m ≈ s · (q − z) (s, z: one scale and zero point per Linear) and W̃ = W · diag(m)
≈ diag(w) · Q:   y = x̃ W̃ᵀ + b = s · w ⊙ (q Qᵀ − z Σ_k Q_k) + b, one int8 GEMM (`int8.dequantize`).

What is stored (`StaticScales`) is data: each input channel's min and max over the calibration
text, fp32, in a safetensors file. Smoothing, scales and int8 weights are derived at load, so a
calibrated directory runs on any CPU, and the original weights are never changed.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from bertkit.backend import int8
from bertkit.backend.int8 import Int8Linear, dequantize
from bertkit.encoder.model import EncoderLayer, encoder_of

ALPHA = 0.8  # SmoothQuant's migration strength, measured (see the module docstring)
SCALES_FILE = "int8_static.safetensors"
MANIFEST_FILE = "int8_static.json"
NEEDS_CALIBRATION = ("precision int8-static needs activation scales: pass --calibration FILE (text to "
                     "calibrate on, one per line), or load a directory written by `bertkit calibrate "
                     "MODEL --calibration FILE --out DIR`")


@dataclass
class StaticScales:
    """What calibration measured, per Linear of the encoder (keyed by its name inside the encoder,
    e.g. "layers.0.ffn_in"): each input channel's least and greatest value, (in,) float32 each."""

    channel_min: dict[str, torch.Tensor] = field(default_factory=dict)
    channel_max: dict[str, torch.Tensor] = field(default_factory=dict)
    alpha: float = ALPHA
    tokens: int = 0  # calibration tokens seen

    def observe(self, name: str, x: torch.Tensor) -> None:
        """x (..., in): one Linear's input; the channel ranges widen to hold it."""
        rows = x.detach().reshape(-1, x.shape[-1]).float()  # (N, in)
        lo, hi = torch.aminmax(rows, dim=0)  # (in,) each
        if name in self.channel_min:
            lo, hi = torch.minimum(lo, self.channel_min[name]), torch.maximum(hi, self.channel_max[name])
        self.channel_min[name], self.channel_max[name] = lo.cpu(), hi.cpu()

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `SCALES_FILE` into `directory` (safetensors: tensors only, no code)."""
        from safetensors.torch import save_file

        from bertkit.util.fileio import atomic_path

        tensors = {f"{name}.channel_min": t.contiguous() for name, t in self.channel_min.items()}
        tensors |= {f"{name}.channel_max": t.contiguous() for name, t in self.channel_max.items()}
        path = Path(directory) / SCALES_FILE
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"alpha": repr(self.alpha), "tokens": str(self.tokens)})
        return path

    @classmethod
    def read(cls, directory: str | os.PathLike) -> "StaticScales | None":
        """The scales saved in `directory`, or None when it has none."""
        from safetensors import safe_open

        path = Path(directory) / SCALES_FILE
        if not path.is_file():
            return None
        scales = cls()
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            for key in f.keys():
                name, kind = key.rsplit(".", 1)
                if kind not in ("channel_min", "channel_max"):
                    raise ValueError(f"{path}: unexpected tensor {key!r}; write the file again with "
                                     "`bertkit calibrate`")
                getattr(scales, kind)[name] = f.get_tensor(key).float()
        scales.alpha = float(meta.get("alpha", ALPHA))
        scales.tokens = int(meta.get("tokens", 0))
        return scales


def calibration_texts(source: "str | os.PathLike | Sequence[str]") -> tuple[list[str], int]:
    """(the texts to calibrate on, how many bad rows were skipped): `source` as is when it is
    texts, else read from the file it names — one text a line (.txt), or a `text` field a line
    (.jsonl). Bad rows (not UTF-8, JSON that does not parse, no text field, absurdly long) are
    named by file and line in a warning and skipped, as every corpus reader does (`data.corpus`)."""
    from bertkit.data.corpus import load_corpus

    if not isinstance(source, (str, os.PathLike)):
        texts = [t for t in source if isinstance(t, str) and t.strip()]
        if not texts:
            raise ValueError("no calibration text given; pass --calibration FILE with text in it")
        return texts, 0
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"--calibration {source} does not exist; pass a text file (one text a line) "
                                "or a .jsonl file with a text field")
    if path.is_dir():
        raise IsADirectoryError(f"--calibration {source} is a directory; pass a text file (one text a line)")
    corpus = load_corpus(path, split=False)
    return list(corpus.iter_sentences()), corpus.stats.num_skipped


class _ObservedLinear(nn.Linear):
    """An nn.Linear that records its input first. Being a subclass, not nn.Linear itself, it also
    keeps the encoder off the fused oneDNN path (`fused.usable`), which would bypass `forward`."""

    observer: "tuple[StaticScales, str]"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scales, name = self.observer
        scales.observe(name, x)
        return super().forward(x)


@contextmanager
def observing(model: nn.Module, scales: StaticScales) -> Iterator[StaticScales]:
    """While open, every nn.Linear inside `model`'s encoder records its inputs into `scales`
    (the modules are given back their own class on exit)."""
    encoder = encoder_of(model)
    linears = [(name, m) for name, m in encoder.named_modules() if type(m) is nn.Linear]
    for name, module in linears:
        module.__class__ = _ObservedLinear
        module.observer = (scales, name)
    try:
        yield scales
    finally:
        for _, module in linears:
            module.__class__ = nn.Linear
            del module.observer


def smoothing(absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """absmax (in,) the inputs' largest magnitudes, weight (out, in) → m (in,) > 0 (SmoothQuant)."""
    w = weight.abs().amax(0).clamp(min=1e-5)  # (in,)
    m = absmax.clamp(min=1e-5).pow(alpha) / w.pow(1 - alpha)  # (in,)
    return m.clamp(min=1e-5)


def static_linear_rows(x: torch.Tensor, multiplier: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                       qweight_t: torch.Tensor, weight_scale: torch.Tensor, column_sums: torch.Tensor,
                       bias: torch.Tensor) -> torch.Tensor:
    """x (N, in) float → (N, out) float32: q = round(x / (m s)) + z in int8, one int8 GEMM, dequantized.

    multiplier (in,) = 1 / (m s); scale, zero (1,): the input's fixed range; the rest is
    `Int8Linear.terms()` of the smoothed weights."""
    q = (x * multiplier).round_().add_(zero).clamp_(-128, 127).to(torch.int8)  # (N, in)
    return dequantize(torch._int_mm(q, qweight_t), scale, zero, weight_scale, column_sums, bias)


class _Kernel:
    """`static_linear_rows` compiled by torch.compile (quantize, GEMM and dequantize in two fused
    loops) unless BERTKIT_INT8_KERNELS=eager or the compiler fails here; eager gives the same values."""

    def __init__(self) -> None:
        self.fn = None

    def get(self):
        if self.fn is None:
            self.fn = static_linear_rows
            if os.environ.get("BERTKIT_INT8_KERNELS", "aot") != "eager" and os.environ.get("BERTKIT_INT8_EAGER") != "1":
                try:
                    compiled = torch.compile(static_linear_rows, dynamic=True)
                    probe = nn.Linear(8, 8)
                    layer = StaticInt8Linear(probe, -torch.ones(8), torch.ones(8), ALPHA)
                    compiled(torch.randn(17, 8), *layer.static_terms())
                    self.fn = compiled
                except Exception:  # no C++ compiler, or an inductor limitation: stay eager
                    self.fn = static_linear_rows
        return self.fn


_KERNEL = _Kernel()


class StaticInt8Linear(Int8Linear):
    """A frozen nn.Linear with int8 weights (per output channel, smoothed) and an int8 input of
    fixed, calibrated scale and zero point (per tensor); int32 accumulation, fp32 output."""

    def __init__(self, linear: nn.Linear, channel_min: torch.Tensor, channel_max: torch.Tensor, alpha: float):
        if channel_min.shape != (linear.in_features,) or channel_max.shape != (linear.in_features,):
            raise ValueError(f"calibrated ranges of shape {tuple(channel_min.shape)} for a Linear of "
                             f"{linear.in_features} inputs; calibrate this model again (`bertkit calibrate`)")
        weight = linear.weight.detach().float()  # (out, in)
        m = smoothing(torch.maximum(channel_min.abs(), channel_max.abs()), weight, alpha)  # (in,)
        smoothed = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            smoothed.weight.copy_(weight * m[None, :])  # W̃ = W diag(m): x̃ W̃ᵀ = x Wᵀ
            if linear.bias is not None:
                smoothed.bias.copy_(linear.bias.detach().float())
        super().__init__(smoothed)
        lo = (channel_min / m).min().clamp(max=0.0)  # the smoothed input's range, holding 0
        hi = (channel_max / m).max().clamp(min=0.0)
        scale = (hi - lo).clamp(min=1e-12) / 255
        zero = -128 - torch.round(lo / scale)  # in [-128, 127]
        self.register_buffer("smooth", m)  # (in,)
        self.register_buffer("input_scale", scale.reshape(1))  # (1,)
        self.register_buffer("input_zero", zero.reshape(1))  # (1,)
        self.register_buffer("input_multiplier", 1.0 / (m * scale))  # (in,): x → x̃ / s in one multiply
        self.input_zero_value = float(zero)  # what the native kernels take, read once

    def static_terms(self) -> tuple[torch.Tensor, ...]:
        """What `static_linear_rows` takes after x."""
        return self.input_multiplier, self.input_scale, self.input_zero, *self.terms()

    def input_range(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """(multiplier (in,), scale (1,), zero point (1,), the zero point as a float): the
        calibrated range the native kernels quantize the input with."""
        return self.input_multiplier, self.input_scale, self.input_zero, self.input_zero_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) float → (..., out) float32."""
        if int8.native_kernels() is not None:
            return super().forward(x)  # Int8Linear's native path, with this input range
        shape = x.shape[:-1]
        y = _KERNEL.get()(x.reshape(-1, self.in_features).float(), *self.static_terms())  # (N, out)
        return y.view(*shape, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 static"


def quantize_static(model: nn.Module, scales: StaticScales) -> nn.Module:
    """Replace, in place, every nn.Linear of `model`'s encoder that `scales` has ranges for by a
    StaticInt8Linear; returns `model`. Scales that fit none of its Linears are an error."""
    encoder = encoder_of(model)
    linears = {name: module for name, module in encoder.named_modules() if isinstance(module, nn.Linear)}
    found = [name for name in linears if name in scales.channel_min]
    if not found:
        some = next(iter(scales.channel_min), "none")
        raise ValueError(f"the int8-static scales (e.g. {some!r}) fit none of this model's Linear layers; "
                         "calibrate this model (`bertkit calibrate MODEL --calibration FILE --out DIR`)")
    for name in found:
        parent_name, _, attr = name.rpartition(".")
        parent = encoder.get_submodule(parent_name) if parent_name else encoder
        setattr(parent, attr, StaticInt8Linear(linears[name], scales.channel_min[name],
                                               scales.channel_max[name], scales.alpha))
    for layer in encoder.modules():  # the layer after attention in the native kernels' blocks
        if type(layer) is EncoderLayer and all(isinstance(getattr(layer, name), Int8Linear)
                                               for name in ("attn_out", "ffn_in", "ffn_out")):
            layer.__class__ = int8.Int8EncoderLayer
    return model


__all__ = ["ALPHA", "MANIFEST_FILE", "NEEDS_CALIBRATION", "SCALES_FILE", "StaticInt8Linear", "StaticScales",
           "observing", "quantize_static", "smoothing", "static_linear_rows"]
