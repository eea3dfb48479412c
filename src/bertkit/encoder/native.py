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

int8's feed-forward calls `torch._int_mm` from the C++ through PyTorch's C shim (`aoti_torch_*`,
the C interface of libtorch_cpu that AOTInductor's compiled libraries call), found once here;
where a torch lacks it, the feed-forward runs as the same kernels called step by step.

Where there is no compiler, the compilation fails, or `BERTKIT_NATIVE=0`, `attention()` and
`int8()` return None and the callers keep PyTorch's kernels; the reason is logged once and kept
in `status()`."""

from __future__ import annotations

import ctypes
import dataclasses
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


class _Int8LinearArgs(ctypes.Structure):
    _fields_ = [("weight_t", ctypes.c_void_p), ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64),
                ("s0", ctypes.c_int64), ("s1", ctypes.c_int64), ("weight_scale", ctypes.c_void_p),
                ("column_sums", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("multiplier", ctypes.c_void_p),
                ("scale", ctypes.c_void_p), ("zero", ctypes.c_void_p), ("static_zero", ctypes.c_float)]


class _Int8FeedForwardArgs(ctypes.Structure):
    _fields_ = [("attn_out", _Int8LinearArgs), ("ffn_in", _Int8LinearArgs), ("ffn_out", _Int8LinearArgs),
                ("gamma1", ctypes.c_void_p), ("beta1", ctypes.c_void_p), ("eps1", ctypes.c_float),
                ("gamma2", ctypes.c_void_p), ("beta2", ctypes.c_void_p), ("eps2", ctypes.c_float),
                ("act", ctypes.c_int)]


@dataclasses.dataclass(frozen=True)
class FeedForwardArgs:
    """What `Int8.feed_forward` reads of a layer, made once (`Int8.feed_forward_args`): the C
    struct of its pointers and the tensors they point into, kept alive with it."""
    struct: _Int8FeedForwardArgs
    tensors: tuple


def _shim() -> tuple | None:
    """(from_blob, delete, _int_mm_out, int8, int32, cpu) of PyTorch's C shim in libtorch_cpu, or
    None where this torch lacks them."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        names = ("aoti_torch_create_tensor_from_blob", "aoti_torch_delete_tensor_object", "aoti_torch_cpu__int_mm_out")
        functions = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in names]
        codes = []
        for name in ("aoti_torch_dtype_int8", "aoti_torch_dtype_int32", "aoti_torch_device_type_cpu"):
            getattr(lib, name).restype = ctypes.c_int32
            codes.append(getattr(lib, name)())
    except (OSError, AttributeError) as err:
        log.info("PyTorch's C shim is not there (%s): the int8 feed-forward runs step by step", err)
        return None
    return (*functions, *codes)


class Int8:
    """kernels/int8.cpp over tensors: `quantize` a Linear's input to int8, and `epilogue`, the
    int32 accumulators of torch._int_mm back to floats with what follows the Linear, and the next
    Linear's input quantized (the arguments are those of the C functions, whose comments give the
    formulas). `feed_forward`, where `fused`: a layer's whole feed-forward in one call, its GEMMs
    torch._int_mm through PyTorch's C shim, so Python and the GIL are left out between the steps."""

    activations = {"none": 0, "gelu": 1, "relu": 2}

    def __init__(self, lib: ctypes.CDLL):
        i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        self._quantize = lib.bertkit_int8_quantize
        self._quantize.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, f32, i32]
        self._epilogue = lib.bertkit_int8_epilogue
        self._epilogue.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, f32, i32,
                                   ptr, i64, ptr, ptr, ptr, ptr, f32, i32]
        self._quantize.restype = self._epilogue.restype = ctypes.c_int
        self._feed_forward = lib.bertkit_int8_feed_forward
        self._feed_forward.argtypes = [ctypes.POINTER(_Int8FeedForwardArgs), ptr, i64, ptr, i64, ptr, i64, i64, ptr,
                                       ptr, ptr, ptr, ptr, i32]
        self._feed_forward.restype = ctypes.c_int
        shim = _shim()
        self.fused = shim is not None
        if self.fused:
            lib.bertkit_int8_set_gemm.argtypes = [ptr, ptr, ptr, i32, i32, i32]
            lib.bertkit_int8_set_gemm(*shim)

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

    @staticmethod
    def feed_forward_args(linears: tuple, ranges: tuple, norms: tuple, act: str) -> FeedForwardArgs:
        """The struct `feed_forward` reads: linears, the terms() of attn_out, ffn_in and ffn_out;
        ranges, each one's input_range() (None: per row); norms, (weight, bias, eps) of the
        LayerNorm after attention and of the one after the FFN; act: a key of `activations`."""
        f32 = torch.float32
        kept: list[torch.Tensor] = []

        def linear(terms: tuple, static: tuple | None) -> _Int8LinearArgs:
            weight_t, weight_scale, column_sums, bias = terms
            if weight_t.dtype is not torch.int8 or not weight_t.is_cpu:
                raise ValueError(f"qweight_t: a CPU int8 tensor, got {weight_t.dtype} on {weight_t.device}")
            multiplier, scale, zero, zero_value = static if static is not None else (None, None, None, 0.0)
            kept.extend(t for t in (weight_t, weight_scale, column_sums, bias, multiplier, scale, zero)
                        if t is not None)
            return _Int8LinearArgs(weight_t.data_ptr(), weight_t.shape[0], weight_t.shape[1], weight_t.stride(0),
                                   weight_t.stride(1), _pointer(weight_scale, f32, "weight_scale"),
                                   _pointer(column_sums, f32, "column_sums"), _pointer(bias, f32, "bias"),
                                   _pointer(multiplier, f32, "multiplier"), _pointer(scale, f32, "scale"),
                                   _pointer(zero, f32, "zero"), float(zero_value))

        (g1, b1, eps1), (g2, b2, eps2) = norms
        kept.extend((g1, b1, g2, b2))
        struct = _Int8FeedForwardArgs(*(linear(t, r) for t, r in zip(linears, ranges)), _pointer(g1, f32, "gamma"),
                                      _pointer(b1, f32, "beta"), eps1, _pointer(g2, f32, "gamma"),
                                      _pointer(b2, f32, "beta"), eps2, Int8.activations[act])
        return FeedForwardArgs(struct, tuple(kept))

    def feed_forward(self, args: FeedForwardArgs, y: torch.Tensor, x: torch.Tensor, out: torch.Tensor,
                     buffers: tuple[torch.Tensor, ...]) -> None:
        """out (R, H) = the layer's feed-forward of y (R, H), the attention's output before
        attn_out, over the residual x (R, H); buffers: q0, q1 (R·max(H, I),) int8, scales (4R,),
        acc (R·max(H, I),) int32, a (R·H,) float (`feed_forward_buffers`)."""
        q0, q1, scales, acc, a = buffers
        f32 = torch.float32
        code = self._feed_forward(
            ctypes.byref(args.struct), _pointer(y, f32, "y"), y.stride(0), _pointer(x, f32, "x"), x.stride(0),
            _pointer(out, f32, "out"), out.stride(0), y.shape[0], _pointer(q0, torch.int8, "q0"),
            _pointer(q1, torch.int8, "q1"), _pointer(scales, f32, "scales"), _pointer(acc, torch.int32, "acc"),
            _pointer(a, f32, "a"), torch.get_num_threads())
        if code:
            raise ValueError(f"native int8 feed-forward failed (code {code})")

    @staticmethod
    def feed_forward_buffers(rows: int, hidden: int, inner: int) -> tuple[torch.Tensor, ...]:
        widest = max(hidden, inner)
        return (torch.empty(rows * widest, dtype=torch.int8), torch.empty(rows * widest, dtype=torch.int8),
                torch.empty(4 * rows), torch.empty(rows * widest, dtype=torch.int32), torch.empty(rows * hidden))


@functools.cache
def int8() -> Int8 | None:
    """The int8 kernels, or None where they cannot be had (see the module's docstring)."""
    return _load("int8", Int8)
