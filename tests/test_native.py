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
@pytest.mark.parametrize("head_size,dtype", [(16, torch.float32), (32, torch.float32), (64, torch.float32),
                                             (128, torch.float32), (32, torch.bfloat16), (64, torch.bfloat16)])
def test_native_attention_is_as_exact_as_sdpa_over_each_sequence_alone(head_size, dtype):
    """Against attention in float64, off by no more than a few times SDPA's own float32 error
    (the scores' rounding, which depends on the order of the sums, dominates both). Lengths around
    the kernel's blocks (4 keys, 16 queries) and past its 512-token limit (those go to SDPA in the
    same call); every query, and the first token only. bf16: fp32 arithmetic on the widened inputs,
    the outputs rounded to bf16, as SDPA's CPU kernel."""
    kernel = native.attention()
    assert kernel is not None, native.status()
    torch.manual_seed(head_size)
    layer = Layer(3, head_size)
    lengths = [kernel.max_length + 9, kernel.max_length, 33, 33, 17, 16, 15, 5, 4, 3, 1]
    packed = Packed.from_lengths(lengths)
    qkv = (torch.randn(sum(lengths), 3 * layer.num_heads * head_size) * 2).to(dtype)
    with torch.inference_mode():
        assert packing.native_attention(layer, qkv, None) is kernel
        every, first = packed.attend(layer, qkv), packed.attend_first(layer, qkv)
        sdpa, exact = alone(qkv, packed, layer), alone(qkv.double(), packed, layer)
    for b, (start, n) in enumerate(zip(packed.starts.tolist(), packed.lengths)):
        bound = (sdpa[b].double() - exact[b]).abs().max().item() * 3 + 1e-6
        assert every.dtype == first.dtype == dtype
        assert (every[start:start + n].double() - exact[b]).abs().max() <= bound, (b, n)
        assert (first[b].double() - exact[b][0]).abs().max() <= bound, (b, n)


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
    """Training, autograd, fp16, a scores bias (MPNet) and head sizes it has no code for take SDPA."""
    qkv = torch.randn(10, 3 * 64)
    assert packing.native_attention(Layer(2, 10), torch.randn(10, 60), None) is None  # head size 10
    assert packing.native_attention(Layer(2, 32), qkv.half(), None) is None
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


# ---------------------------------------------------------------------------------------------
# int8: the passes around torch._int_mm (encoder/kernels/int8.cpp)
# ---------------------------------------------------------------------------------------------
def int8_kernels():
    kernels = native.int8()
    assert kernels is not None, native.status()
    return kernels


def rows_to_quantize(cols: int) -> torch.Tensor:
    """Rows of every sign: mixed, all positive, all negative, all zero, one outlier."""
    torch.manual_seed(cols)
    x = torch.randn(6, cols) * 3
    x[1] = x[1].abs()
    x[2] = -x[2].abs()
    x[3] = 0.0
    x[4, 5] = 400.0
    return x


@needs_compiler
@pytest.mark.parametrize("cols", [37, 384])
def test_int8_quantization_is_the_reference_formula_bit_for_bit(cols):
    """Per row as `int8.quantize_rows`, and static as `int8_static.static_linear_rows` (row
    widths that are and are not a multiple of the vector width)."""
    from bertkit.backend import int8

    kernels = int8_kernels()
    x = rows_to_quantize(cols)
    q, scale, zero = torch.empty(6, cols, dtype=torch.int8), torch.empty(6), torch.empty(6)
    kernels.quantize(x, q, scale, zero)
    want_q, want_scale, want_zero = int8.quantize_rows(x)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale) and torch.equal(zero, want_zero)

    multiplier, static_zero = torch.rand(cols) * 20, -3.0
    kernels.quantize(x, q, multiplier=multiplier, static_zero=static_zero)
    assert torch.equal(q, (x * multiplier).round_().add_(static_zero).clamp_(-128, 127).to(torch.int8))


@needs_compiler
@pytest.mark.parametrize("act", ["none", "gelu", "relu"])
def test_int8_epilogue_equals_dequantize_residual_norm_activation_and_requantize(act):
    from bertkit.backend import int8

    kernels = int8_kernels()
    torch.manual_seed(3)
    rows, cols = 9, 40
    acc = torch.randint(-20000, 20000, (rows, cols), dtype=torch.int32)
    scale, zero = torch.rand(rows) / 50, torch.randint(-128, 127, (rows,)).float()
    terms = (None, torch.rand(cols) / 100, torch.randn(cols), torch.randn(cols))
    residual = torch.randn(rows, cols)
    norm = (torch.rand(cols) + 0.5, torch.randn(cols), 1e-12)
    y = int8.dequantize(acc, scale, zero, *terms[1:])
    with_norm = torch.nn.functional.layer_norm(residual + y, (cols,), norm[0], norm[1], norm[2])
    activate = {"none": lambda t: t, "gelu": torch.nn.functional.gelu, "relu": torch.nn.functional.relu}[act]
    out = torch.empty(rows, cols)

    kernels.epilogue(acc, scale, zero, terms, act=act, out=out)
    assert (out - activate(y)).abs().max() <= 1e-5 * y.abs().max()
    q, q_scale, q_zero = torch.empty(rows, cols, dtype=torch.int8), torch.empty(rows), torch.empty(rows)
    kernels.epilogue(acc, scale, zero, terms, residual=residual, norm=norm, act=act, out=out, q=q,
                     q_scale=q_scale, q_zero=q_zero)
    assert (out - activate(with_norm)).abs().max() <= 1e-5
    assert all(torch.equal(a, b) for a, b in zip((q, q_scale, q_zero), int8.quantize_rows(out)))
    # a static input range (one scale and zero point for every row) reads element 0 for each row
    kernels.epilogue(acc, scale[:1], zero[:1], terms, out=out)
    assert (out - int8.dequantize(acc, scale[:1].expand(rows), zero[:1].expand(rows), *terms[1:])).abs().max() <= 1e-4


@needs_compiler
def test_int8_epilogue_gelu_is_within_two_millionths_of_exact_gelu():
    """GELU's erf in the epilogue is a rational function of its own, not PyTorch's formula: held
    against GELU in float64 over [-6, 6] in steps of 1e-4, where erf bends and where it saturates."""
    kernels = int8_kernels()
    cols = 40
    acc = torch.arange(-60_000, 60_000, dtype=torch.int32).view(-1, cols)  # (3000, 40)
    scale, weight_scale = torch.full((1,), 1e-4), torch.ones(cols)
    out = torch.empty(acc.shape)
    kernels.epilogue(acc, scale, torch.zeros(1), (None, weight_scale, torch.zeros(cols), torch.zeros(cols)),
                     act="gelu", out=out)
    y = acc.float() * (scale * weight_scale)  # the epilogue's own dequantization, in float32
    assert (out.double() - torch.nn.functional.gelu(y.double())).abs().max() <= 2e-6


@needs_compiler
@pytest.mark.parametrize("static", [False, True])
def test_native_int8_layers_agree_with_pytorchs_kernels(static, monkeypatch):
    """A whole int8 (dynamic, and static with its calibrated ranges) MiniLM-shaped encoder through
    the native kernels against PyTorch's (eager) kernels: the same within int8's own noise, and
    each text's vector independent of its batch."""
    from bertkit.backend import int8, int8_static
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.model import BertModel

    torch.manual_seed(5)
    config = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=64)
    fp32 = BertModel(config).eval()
    ids = [torch.randint(5, 300, (n,)) for n in (20, 7, 33, 7, 12)]

    def encode(model, mode, which):
        kernels = int8._Kernels()
        kernels.mode = mode
        monkeypatch.setattr(int8, "_KERNELS", kernels)
        lengths = [len(ids[i]) for i in which]
        packed = Packed.from_lengths(lengths)
        with torch.inference_mode():
            flat = torch.cat([ids[i] for i in which])
            states = model.forward_packed(flat, torch.zeros_like(flat), packed).hidden
        return [states[s:s + n] for s, n in zip(packed.starts.tolist(), lengths)]

    model = int8.quantize_linears(BertModel(config).eval()) if not static else None
    if static:
        model = BertModel(config).eval()
        model.load_state_dict(fp32.state_dict())
        scales = int8_static.StaticScales()
        with int8_static.observing(model, scales), torch.inference_mode():
            for t in ids:
                model.forward_packed(t, torch.zeros_like(t), Packed.from_lengths([len(t)]))
        int8_static.quantize_static(model, scales)
        assert all(type(layer) is int8.Int8EncoderLayer for layer in model.layers)
    else:
        model.load_state_dict(fp32.state_dict(), strict=False)
    everything = range(len(ids))
    native_out, eager_out = encode(model, "native", everything), encode(model, "eager", everything)
    for a, b in zip(native_out, eager_out):
        assert torch.nn.functional.cosine_similarity(a, b).min() >= 0.999
    alone = encode(model, "native", [2])[0]
    assert torch.equal(alone, native_out[2])


@needs_compiler
@pytest.mark.parametrize("static", [False, True])
def test_the_one_call_feed_forward_gives_the_step_by_steps_bits(static, monkeypatch):
    """Where PyTorch's C shim is there, a layer's feed-forward is one C++ call (its GEMMs through
    the shim's _int_mm); it equals the same kernels called step by step from Python, bit for bit,
    for a dynamic and a static int8 encoder, in blocks of rows as in one."""
    from bertkit.backend import int8, int8_static
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.model import BertModel

    kernels = native.int8()
    if kernels is None or not kernels.fused:
        pytest.skip("PyTorch's C shim (aoti_torch_cpu__int_mm_out) is not in this torch")
    torch.manual_seed(9)
    config = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=64)
    ids = [torch.randint(5, 300, (n,)) for n in (20, 7, 33, 12)]
    model = BertModel(config).eval()
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):  # no two alike
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
        torch.nn.init.uniform_(norm.bias, -0.2, 0.2)
    if static:
        scales = int8_static.StaticScales()
        with int8_static.observing(model, scales), torch.inference_mode():
            for t in ids:
                model.forward_packed(t, torch.zeros_like(t), Packed.from_lengths([len(t)]))
        int8_static.quantize_static(model, scales)
    else:
        int8.quantize_linears(model)
    flat = torch.cat(ids)
    packed = Packed.from_lengths([len(t) for t in ids])

    calls = []
    one_call = kernels._feed_forward
    monkeypatch.setattr(kernels, "_feed_forward", lambda *args: calls.append(1) or one_call(*args))

    def hidden(fused: bool, chunk: int) -> torch.Tensor:
        monkeypatch.setattr(kernels, "fused", fused)
        monkeypatch.setattr(int8, "CHUNK_ELEMENTS", chunk)
        with torch.inference_mode():
            return model.forward_packed(flat, torch.zeros_like(flat), packed).hidden

    one_block = hidden(False, int8.CHUNK_ELEMENTS)
    assert torch.equal(hidden(True, int8.CHUNK_ELEMENTS), one_block)
    # blocks of 256 rows over 72 rows is one block; force several with more rows
    many = [torch.randint(5, 300, (60,)) for _ in range(6)]
    flat, packed = torch.cat(many), Packed.from_lengths([60] * 6)
    assert torch.equal(hidden(True, 1), hidden(False, 1))
    assert len(calls) == 2 * 1 + 2 * 2  # a call per layer and block, for the fused runs only
