"""bertkit's own C++ kernels (`encoder/kernels/*.cpp`), compiled for this CPU on first use.

    kernel = native.attention()     # a ctypes function, or None where it cannot be had
    native.status()                 # {"attention": "loaded" | the reason it is not}

A kernel is plain C++ (vector extensions and OpenMP, no PyTorch headers), so compiling it takes
about a second: `$CXX` (else `c++`) with `-O3 -march=native -fopenmp`. The library is kept under
`fileio.cache_dir()/kernels/`, named by a hash of its source, the compiler's version and this
CPU's model and flags (`util.machine.cpu_identity`): a later process loads it in milliseconds, and a
copied cache on another CPU compiles anew rather than running code built for other flags.
OpenMP binds to the libgomp that PyTorch loaded (its soname is already in the process), so the
kernels share torch's threads rather than starting a second pool.

Where there is no compiler, the compilation fails, or `BERTKIT_NATIVE=0`, `attention()` returns
None and the callers keep PyTorch's kernels; the reason is logged once and kept in `status()`.
"""

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
    for part in (source.read_bytes(), version.encode(), " ".join(FLAGS).encode(), cpu_identity().encode()):
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

    def __init__(self, lib: ctypes.CDLL):
        self._function = lib.bertkit_attention
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._function.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, ctypes.c_float, ctypes.c_int,
                                    ctypes.c_int]
        self._function.restype = ctypes.c_int
        self.max_length = int(lib.bertkit_attention_max_length())

    def __call__(self, qkv: torch.Tensor, out: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor,
                 heads: int, head_size: int, first_only: bool = False) -> torch.Tensor:
        """qkv (N, 3H) fp32 on the CPU, rows contiguous; out (N, H), or (B, H) with first_only;
        starts, lengths (B,) int64 contiguous. Writes out and returns it."""
        code = self._function(qkv.data_ptr(), qkv.stride(0), out.data_ptr(), out.stride(0), starts.data_ptr(),
                              lengths.data_ptr(), lengths.numel(), heads, head_size, head_size ** -0.5,
                              int(first_only), torch.get_num_threads())
        if code:
            raise ValueError(f"native attention refused its arguments (code {code}): head size {head_size}, "
                             f"lengths {lengths.min().item()}..{lengths.max().item()}")
        return out


@functools.cache
def attention() -> Attention | None:
    """The attention kernel, or None where it cannot be had (see the module's docstring)."""
    return _load("attention", Attention)
