"""bertkit.backend.malloc: an engine's batch buffers come back without new page faults (glibc only)."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the malloc thresholds are glibc's")

# Embeds one batch of 8,192 tokens with all-MiniLM-L6-v2 three times (its fused Q/K/V output,
# 8,192 × 1,152 floats, is above glibc's largest adaptive mmap threshold) and prints whether the
# setting took and the minor page faults of the last pass.
PROBE = """
import resource, sys
from bertkit.inference import Engine, embed
from bertkit.backend.malloc import keep_freed_memory
engine = Engine.load(sys.argv[1], max_batch_tokens=8192)
texts = [" ".join(["word"] * 126)] * 64  # 64 × 128 tokens
for _ in range(2):
    embed(engine, texts)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
embed(engine, texts)
print(keep_freed_memory(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)  # cached: the engine's call
"""


def probe(model_dir, setting: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(model_dir)], capture_output=True, text=True,
                         env={**os.environ, "BERTKIT_MALLOC": setting}, check=True, timeout=300)
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


def test_an_engine_reuses_its_batch_buffers(minilm_dir):
    """With the setting, a pass over a batch faults in a small share of the pages it faults in
    with glibc's defaults (which map and unmap every large buffer anew: the control)."""
    applied, tuned = probe(minilm_dir, "")
    control_applied, default = probe(minilm_dir, "default")
    assert applied and not control_applied
    assert default > 20_000, f"the control faulted only {default} pages: the probe measures nothing"
    assert tuned < default / 5, f"{tuned} page faults with the setting, {default} without"


def test_an_engine_caps_the_shape_keyed_op_caches_unless_the_environment_sets_them(minilm_dir, monkeypatch):
    """oneDNN's primitive cache and PyTorch's LRU cache keep an entry per batch shape; the engine
    caps both at 64 (a served process stays flat across request lengths), a user's value wins."""
    from bertkit.backend.malloc import OP_CACHE_CAPACITY
    from bertkit.inference import Engine

    for name in OP_CACHE_CAPACITY:
        monkeypatch.delenv(name, raising=False)
    Engine.load(minilm_dir)
    assert {name: os.environ.get(name) for name in OP_CACHE_CAPACITY} == OP_CACHE_CAPACITY
    assert set(OP_CACHE_CAPACITY.values()) == {"64"}
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "8")
    Engine.load(minilm_dir)
    assert os.environ["LRU_CACHE_CAPACITY"] == "8"
