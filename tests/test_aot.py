"""Int8 kernels compiled ahead of time (`bertkit.backend.aot`, BERTKIT_INT8_KERNELS=aot): the
same outputs as the kernels compiled in-process, kept on disk, and loaded without compiling by the
next engine (a new process is the same: nothing in memory is reused)."""

from __future__ import annotations

import pytest
import torch

from bertkit.backend import aot, int8
from bertkit.inference import Engine, embed
from bertkit.util import fileio

from retrieval_fixtures import tiny_encoder

pytestmark = pytest.mark.skipif(int8._KERNELS.get()[0] is int8.quantize_rows,
                                reason="torch.compile is not available here (no C++ compiler)")


def test_kernels_compile_once_and_load_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(fileio.CACHE_ENV, str(tmp_path / "cache"))
    model = tiny_encoder(tmp_path / "model")
    texts = ["the cat sees a red ball", "a dog", "the big green tree by the river " * 3]
    compiled = int8._Kernels()
    compiled.mode = "compile"
    monkeypatch.setattr(int8, "_KERNELS", compiled)
    want = embed(Engine.load(model, precision="int8"), texts)  # torch.compile's kernels

    for trial in ("compiles", "loads"):
        kernels, fused = int8._Kernels(), int8._FusedKernels()  # nothing carried over in memory
        kernels.mode = "aot"
        monkeypatch.setattr(int8, "_KERNELS", kernels)
        monkeypatch.setattr(int8, "_FUSED", fused)
        if trial == "loads":
            def refuse(self):
                raise AssertionError(f"{self.name} was compiled again")
            monkeypatch.setattr(aot.AotKernel, "_compile", refuse)
        got = embed(Engine.load(model, precision="int8"), texts)
        assert kernels.mode == "aot" and kernels.aot, "the ahead-of-time kernels were not used"
        assert (got - want).abs().max() <= 1e-5, trial
    packages = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache" / "kernels").glob("*.pt2")}
    assert packages == {"int8_attention_out_ffn_in[gelu,eps=1e-12]", "int8_ffn_out_norm[eps=1e-12]",
                        "int8_linear"}


def test_a_kernels_key_holds_what_its_code_depends_on(tmp_path, monkeypatch):
    monkeypatch.setenv(fileio.CACHE_ENV, str(tmp_path))
    x, out = torch.randn(8, 16), torch.empty(8, 4)
    weights = (torch.ones(16, 4, dtype=torch.int8), torch.ones(4), torch.ones(4), torch.zeros(4))
    path = aot.AotKernel("k", int8.linear_rows, (x, out, *weights), (0, 1), int8.__file__).path
    assert path.parent == tmp_path / "kernels"
    wider = aot.AotKernel("k", int8.linear_rows, (torch.randn(8, 32), out, *weights), (0, 1), int8.__file__)
    assert wider.path != path  # another size past the rows
    assert aot.AotKernel("k", int8.linear_rows, (torch.randn(3, 16), out, *weights), (0, 1),
                         int8.__file__).path == path  # the rows vary: one kernel for every count
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:  # inductor writes the thread count into the code
        assert aot.AotKernel("k", int8.linear_rows, (x, out, *weights), (0, 1), int8.__file__).path != path
    finally:
        torch.set_num_threads(before)
    monkeypatch.delenv(fileio.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fileio.cache_dir() == tmp_path / "xdg" / "bertkit"
