"""bertkit's own C++ kernels (`encoder/kernels/*.cpp`), compiled for this CPU on first use.

    kernel = native.attention()     # `Attention` over tensors, or None where it cannot be had
    native.int8()                   # `Int8`: the passes around an int8 GEMM, or None
    native.status()                 # {"attention": "loaded" | the reason it is not, ...}

A kernel is plain C++ (vector extensions and OpenMP, no PyTorch headers), so compiling it takes
about a second: `$CXX` (else `c++`) with `-O3 -march=native -fopenmp`. The library is kept under
`fileio.cache_dir()/kernels/`, named by a hash of its source and the headers beside it, the
compiler's version and this CPU's model and flags (`util.machine.cpu_identity`): a later process
loads it in milliseconds, and a copied cache on another CPU compiles anew rather than running
code built for other flags. OpenMP binds to the libgomp that PyTorch loaded (its soname is
already in the process), so the kernels share torch's threads rather than starting a second pool.

Where there is no compiler, the compilation fails, or `BERTKIT_NATIVE=0`, `attention()` and
`int8()` return None and the callers keep PyTorch's kernels; the reason is logged once and kept
in `status()`."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from bertkit.util.fileio import cache_dir
from bertkit.util.machine import cpu_identity

log = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "kernels"
ENV = "BERTKIT_NATIVE"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")

_status: dict[str, str] = {}


def status() -> dict[str, str]:
    """Each kernel asked for so far: "loaded", or why not."""
    return dict(_status)


def _compiler() -> tuple[str, str] | None:
    """(compiler path, its version line), or None where there is none."""
    found = shutil.which(os.environ.get("CXX", "c++"))
    if found is None:
        return None
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30,
                                 check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    return found, version


def _library(name: str) -> ctypes.CDLL:
    """kernels/NAME.cpp as a loaded library, compiled first where the cache has none for it."""
    found = _compiler()
    if found is None:
        raise RuntimeError(f"no C++ compiler (set CXX, or install g++); tried {os.environ.get('CXX', 'c++')!r}")
    compiler, version = found
    source = SOURCES / f"{name}.cpp"
    digest = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(SOURCES.glob("*.h"))]  # what the sources include
    for part in (source.read_bytes(), *headers, version.encode(), " ".join(FLAGS).encode(),
                 cpu_identity().encode()):
        digest.update(part)
    target = cache_dir() / "kernels" / f"{name}-{digest.hexdigest()[:24]}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run([compiler, *FLAGS, str(source), "-o", str(built)], capture_output=True,
                                  text=True, timeout=300)
            if done.returncode:
                raise RuntimeError(f"{compiler} failed on {source.name}: {done.stderr.strip()[-400:]}")
            os.replace(built, target)  # atomic: a concurrent process sees no half-written library
        log.info("compiled the %s kernel for this CPU into %s", name, target)
    return ctypes.CDLL(str(target))


def _load(name: str, configure) -> object | None:
    if os.environ.get(ENV, "1") == "0":
        _status[name] = f"{ENV}=0"
        return None
    try:
        function = configure(_library(name))
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as err:
        _status[name] = f"{type(err).__name__}: {err}"
        log.warning("the native %s kernel is unavailable (%s); using PyTorch's", name, _status[name])
        return None
    _status[name] = "loaded"
    return function


class Attention:
    """`bertkit_attention` of kernels/attention.cpp over tensors (its comment there gives the
    layout). max_length: the longest sequence it takes; head_sizes: the head sizes it takes."""

    head_sizes = frozenset(range(16, 129, 16))
    dtypes = (torch.float32, torch.bfloat16)

    def __init__(self, lib: ctypes.CDLL):
        self._function = lib.bertkit_attention
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._function.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, ctypes.c_float, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_int]
        self._function.restype = ctypes.c_int
        self.max_length = int(lib.bertkit_attention_max_length())

    def __call__(self, qkv: torch.Tensor, out: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor,
                 heads: int, head_size: int, first_only: bool = False) -> torch.Tensor:
        """qkv (N, 3H) fp32 or bf16 on the CPU, rows contiguous; out (N, H) of its dtype, or (B, H)
        with first_only; starts, lengths (B,) int64 contiguous. Writes out and returns it."""
        if qkv.dtype not in self.dtypes or out.dtype != qkv.dtype:
            raise ValueError(f"native attention takes fp32 or bf16 (in and out alike), got {qkv.dtype} → {out.dtype}")
        code = self._function(qkv.data_ptr(), qkv.stride(0), out.data_ptr(), out.stride(0), starts.data_ptr(),
                              lengths.data_ptr(), lengths.numel(), heads, head_size, head_size ** -0.5,
                              int(first_only), int(qkv.dtype == torch.bfloat16), torch.get_num_threads())
        if code:
            raise ValueError(f"native attention refused its arguments (code {code}): head size {head_size}, "
                             f"lengths {lengths.min().item()}..{lengths.max().item()}")
        return out


@functools.cache
def attention() -> Attention | None:
    """The attention kernel, or None where it cannot be had (see the module's docstring)."""
    return _load("attention", Attention)


def _pointer(t: torch.Tensor | None, dtype: torch.dtype, name: str) -> int | None:
    """t's data pointer for a kernel reading rows of `dtype` (None → NULL); refuses a tensor of
    another dtype, off the CPU, or whose rows are not contiguous."""
    if t is None:
        return None
    # is_cpu and an identity test, not t.device.type: half the cost, paid ~70 times a layer
    if t.dtype is not dtype or not t.is_cpu or (t.dim() > 0 and t.stride(-1) != 1 and t.numel() > 1):
        raise ValueError(f"{name}: a CPU tensor of {dtype} with contiguous rows, got {t.dtype} on {t.device} "
                         f"with strides {t.stride()}")
    return t.data_ptr()


class Int8:
    """kernels/int8.cpp over tensors: `quantize` a Linear's input to int8, and `epilogue`, the
    int32 accumulators of torch._int_mm back to floats with what follows the Linear, and the next
    Linear's input quantized (the arguments are those of the C functions, whose comments give the
    formulas)."""

    activations = {"none": 0, "gelu": 1, "relu": 2}

    def __init__(self, lib: ctypes.CDLL):
        i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        self._quantize = lib.bertkit_int8_quantize
        self._quantize.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, f32, i32]
        self._epilogue = lib.bertkit_int8_epilogue
        self._epilogue.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, f32, i32,
                                   ptr, i64, ptr, ptr, ptr, ptr, f32, i32]
        self._quantize.restype = self._epilogue.restype = ctypes.c_int

    def quantize(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor | None = None,
                 zero: torch.Tensor | None = None, multiplier: torch.Tensor | None = None,
                 static_zero: float = 0.0) -> None:
        """x (R, C) float → q (R, C) int8: per row into scale, zero (R,), or with multiplier (C,)
        the static range of zero point static_zero."""
        rows, cols = x.shape
        f32 = torch.float32
        self._quantize(_pointer(x, f32, "x"), rows, cols, x.stride(0), _pointer(q, torch.int8, "q"),
                       _pointer(scale, f32, "scale"), _pointer(zero, f32, "zero"),
                       _pointer(multiplier, f32, "multiplier"), static_zero, torch.get_num_threads())

    def epilogue(self, acc: torch.Tensor, row_scale: torch.Tensor, row_zero: torch.Tensor,
                 terms: tuple[torch.Tensor, ...], residual: torch.Tensor | None = None,
                 norm: tuple | None = None, act: str = "none", out: torch.Tensor | None = None,
                 q: torch.Tensor | None = None, q_scale: torch.Tensor | None = None,
                 q_zero: torch.Tensor | None = None, q_multiplier: torch.Tensor | None = None,
                 q_static_zero: float = 0.0) -> None:
        """acc (R, C) int32; row_scale, row_zero (R,) or (1,) for a static input range; terms: the
        Linear's `Int8Linear.terms()` (its qweight_t is not read); norm: (weight, bias, eps) of a
        LayerNorm or None; act: a key of `activations`."""
        rows, cols = acc.shape
        f32 = torch.float32
        _, weight_scale, column_sums, bias = terms
        gamma, beta, eps = norm if norm is not None else (None, None, 0.0)
        code = self._epilogue(
            _pointer(acc, torch.int32, "acc"), rows, cols, _pointer(row_scale, f32, "row_scale"),
            _pointer(row_zero, f32, "row_zero"), 1 if row_scale.numel() == rows else 0,
            _pointer(weight_scale, f32, "weight_scale"), _pointer(column_sums, f32, "column_sums"),
            _pointer(bias, f32, "bias"), _pointer(residual, f32, "residual"),
            0 if residual is None else residual.stride(0), _pointer(gamma, f32, "gamma"),
            _pointer(beta, f32, "beta"), eps, self.activations[act], _pointer(out, f32, "out"),
            0 if out is None else out.stride(0), _pointer(q, torch.int8, "q"), _pointer(q_scale, f32, "q_scale"),
            _pointer(q_zero, f32, "q_zero"), _pointer(q_multiplier, f32, "q_multiplier"), q_static_zero,
            torch.get_num_threads())
        if code:
            raise ValueError(f"native int8 epilogue refused its arguments (code {code})")


@functools.cache
def int8() -> Int8 | None:
    """The int8 kernels, or None where they cannot be had (see the module's docstring)."""
    return _load("int8", Int8)
