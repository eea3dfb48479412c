"""bertkit's own attention kernel (`encoder/kernels/attention.cpp` through `encoder.native`): equal
to SDPA over each sequence alone at every head size and length it takes, the same bits whatever
the neighbours, compiled once per machine, sharing torch's OpenMP runtime, and a clean fall back to
SDPA where it cannot be had."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from bertkit.encoder import native, packing
from bertkit.encoder.packing import Packed
from bertkit.util import fileio

HAS_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler here")


class Layer:
    """What Packed.attend reads of an encoder layer."""
    attention_dropout, training = 0.0, False

    def __init__(self, heads: int, head_size: int):
        self.num_heads, self.head_dim = heads, head_size


def alone(qkv: torch.Tensor, packed: Packed, layer: Layer) -> list[torch.Tensor]:
    """SDPA over each sequence by itself, (L, H) each."""
    nh, hs = layer.num_heads, layer.head_dim
    outs = []
    for start, n in zip(packed.starts.tolist(), packed.lengths):
        q, k, v = qkv[start:start + n].view(1, n, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)
        outs.append(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, nh * hs))
    return outs


@needs_compiler
@pytest.mark.parametrize("head_size", [16, 32, 64, 128])
def test_native_attention_is_as_exact_as_sdpa_over_each_sequence_alone(head_size):
    """Against attention in float64, off by no more than a few times SDPA's own float32 error
    (the scores' rounding, which depends on the order of the sums, dominates both). Lengths around
    the kernel's blocks (4 keys, 16 queries) and past its 512-token limit (those go to SDPA in the
    same call); every query, and the first token only."""
    kernel = native.attention()
    assert kernel is not None, native.status()
    torch.manual_seed(head_size)
    layer = Layer(3, head_size)
    lengths = [kernel.max_length + 9, kernel.max_length, 33, 33, 17, 16, 15, 5, 4, 3, 1]
    packed = Packed.from_lengths(lengths)
    qkv = torch.randn(sum(lengths), 3 * layer.num_heads * head_size) * 2
    with torch.inference_mode():
        assert packing.native_attention(layer, qkv, None) is kernel
        every, first = packed.attend(layer, qkv), packed.attend_first(layer, qkv)
        sdpa, exact = alone(qkv, packed, layer), alone(qkv.double(), packed, layer)
    for b, (start, n) in enumerate(zip(packed.starts.tolist(), packed.lengths)):
        bound = (sdpa[b] - exact[b]).abs().max().item() * 3 + 1e-6
        assert (every[start:start + n] - exact[b]).abs().max() <= bound, (b, n)
        assert (first[b] - exact[b][0]).abs().max() <= bound, (b, n)


@needs_compiler
def test_a_sequence_gets_the_same_bits_whatever_its_neighbours_and_threads():
    torch.manual_seed(1)
    layer = Layer(4, 32)
    mine = torch.randn(27, 3 * 128)
    results = []
    for neighbours, threads in (([], 1), ([40, 27, 3], 2), ([27] * 9, 2), ([5], 1)):
        rows = torch.cat([mine, torch.randn(sum(neighbours), 3 * 128) * 100])
        torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                results.append(Packed.from_lengths([27, *neighbours]).attend(layer, rows)[:27].clone())
        finally:
            torch.set_num_threads(2)
    assert all(torch.equal(r, results[0]) for r in results[1:])


def test_the_kernel_is_left_where_it_does_not_apply():
    """Training, autograd, bf16, a scores bias (MPNet) and head sizes it has no code for take SDPA."""
    qkv = torch.randn(10, 3 * 64)
    assert packing.native_attention(Layer(2, 10), torch.randn(10, 60), None) is None  # head size 10
    assert packing.native_attention(Layer(2, 32), qkv.bfloat16(), None) is None
    assert packing.native_attention(Layer(2, 32), qkv, torch.zeros(1, 2, 10, 10)) is None
    training = Layer(2, 32)
    training.training = True
    assert packing.native_attention(training, qkv, None) is None
    with torch.enable_grad():
        assert packing.native_attention(Layer(2, 32), qkv.requires_grad_(), None) is None


@needs_compiler
def test_compiled_once_into_the_cache_and_torch_openmp_shared(tmp_path):
    """A fresh process compiles the library into the cache; the next loads it as it is (same file,
    same mtime); both run with one libgomp in the process, torch's."""
    code = ("import torch, os\n"
            "from bertkit.encoder import native\n"
            "kernel = native.attention(); assert kernel is not None, native.status()\n"
            "maps = open(f'/proc/{os.getpid()}/maps').read().splitlines()\n"
            "print(len({line.split()[-1] for line in maps if 'libgomp' in line}))\n")
    env = {**os.environ, fileio.CACHE_ENV: str(tmp_path)}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        libraries = sorted((tmp_path / "kernels").glob("attention-*.so"))
        assert len(libraries) == 1
        runs.append((done.stdout.strip(), libraries[0].stat().st_mtime_ns))
    assert runs[0] == runs[1] and runs[0][0] == "1"


def test_without_a_compiler_or_when_turned_off_attention_falls_back_to_sdpa(tmp_path, monkeypatch):
    monkeypatch.setenv(fileio.CACHE_ENV, str(tmp_path))
    torch.manual_seed(2)
    layer = Layer(2, 32)
    packed = Packed.from_lengths([30, 9, 9])
    qkv = torch.randn(48, 3 * 64)
    for setting, reason in ((("CXX", str(tmp_path / "no-such-compiler")), "no C++ compiler"),
                            ((native.ENV, "0"), f"{native.ENV}=0")):
        monkeypatch.setenv(*setting)
        native.attention.cache_clear()
        try:
            with torch.inference_mode():
                out = packed.attend(layer, qkv)
            assert reason in native.status()["attention"]
        finally:
            monkeypatch.delenv(setting[0])
            native.attention.cache_clear()
        for b, (start, n) in enumerate(zip(packed.starts.tolist(), packed.lengths)):
            assert (out[start:start + n] - alone(qkv, packed, layer)[b]).abs().max() <= 1e-6
