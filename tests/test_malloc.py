"""bertkit.backend.malloc: an engine's batch buffers come back without new page faults, and a
server's model thread gives its freed heap back (glibc only)."""

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


# A thread of its own (as a server's model thread) touches and frees 40 MiB, which glibc serves
# from that thread's arena; then malloc_trim(0), as the server's trims. Prints whether the
# server's threshold is in effect and what stayed resident, in MiB. ORDER: "engine" (the engine's
# thresholds alone), "served" (the server's after them), "served-first" (the server's before any
# engine: the first engine takes it).
THREAD_PROBE = """
import ctypes, sys, threading
from bertkit.backend import malloc
order = sys.argv[1]
served = malloc.bound_thread_heaps() if order == "served-first" else False
assert malloc.keep_freed_memory()
if order == "served":
    served = malloc.bound_thread_heaps()
assert malloc.keep_freed_memory()  # another engine loaded later keeps the threshold in effect
libc = malloc.glibc()
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

def rss_mib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) / 1024

def work(size=40 << 20):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)

before = rss_mib()
thread = threading.Thread(target=work)
thread.start()
thread.join()
libc.malloc_trim(0)
print(served, malloc._trim_threshold, round(rss_mib() - before))
"""


@pytest.mark.parametrize("order", ["served", "served-first"])
def test_a_server_gives_back_what_its_model_thread_freed(order):
    """With the engine's thresholds alone, a block freed on a thread stays resident even after
    malloc_trim (the top of a thread arena's heap, which only `free` returns, past a 1 GiB
    threshold: the control); with the server's, it goes back, whichever was set first."""
    def run(which: str) -> tuple[str, int, int]:
        out = subprocess.run([sys.executable, "-c", THREAD_PROBE, which], capture_output=True, text=True,
                             env={**os.environ, "BERTKIT_MALLOC": ""}, check=True, timeout=60)
        applied, threshold, kept = out.stdout.split()
        return applied, int(threshold), int(kept)

    from bertkit.backend.malloc import SERVED_TRIM_THRESHOLD, TRIM_THRESHOLD

    applied, threshold, kept = run("engine")
    assert (applied, threshold) == ("False", TRIM_THRESHOLD)
    assert kept >= 32, f"only {kept} MiB of 40 stayed with the engine's thresholds: the probe measures nothing"
    applied, threshold, kept = run(order)
    assert threshold == SERVED_TRIM_THRESHOLD and applied == str(order == "served")
    assert kept <= 8, f"{kept} MiB of the 40 freed on a thread stayed resident with the server's threshold"
