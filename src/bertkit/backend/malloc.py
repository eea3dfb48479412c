"""Freed memory kept for reuse: glibc's malloc set up for batched inference on the CPU.

Why: glibc serves every allocation above its mmap threshold (128 KiB, rising by itself to at most
32 MiB) with a fresh `mmap` and hands it back to the kernel on `free`. A token-budget batch
allocates tens of MiB per layer (8,192 tokens × 1,152 fused Q/K/V floats is 37.7 MB), so every
layer of every batch paid first-touch page faults again. With the mmap and trim thresholds raised,
those pages stay in the heap for the next batch: 25 times fewer page faults and a quarter more
sentences per second (docs/design.md). The cost: after a batch the
process keeps its peak working set instead of returning it, which the next batch needs anyway.
Allocators such as jemalloc or tcmalloc, preloaded, do the same; this needs no preload.

The setting is process-wide, so the engine applies it once, on the CPU, where the C library is
glibc; BERTKIT_MALLOC=default leaves malloc as it is. A long-lived server still gives memory
back: its model thread calls malloc_trim under load (every few seconds, or sooner once resident
memory has grown by a tenth) and once when it falls idle (`serve/scheduler.py`), which frees what
the thresholds keep, so resident memory follows the load rather than its peak. malloc_trim
cannot reach one part: the free top of the heaps of a thread's own arena (glibc gives every new
thread an arena; a server's model runs on such a thread), which only `free` returns, past the
trim threshold. So a server lowers that threshold (`bound_thread_heaps`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>
MMAP_THRESHOLD = 256 << 20  # allocations above this still get their own mapping (e.g. a huge logits tensor)
TRIM_THRESHOLD = 1 << 30  # free memory at the top of the heap beyond this goes back to the kernel
SERVED_TRIM_THRESHOLD = 16 << 20  # the same for a server's process (see `bound_thread_heaps`)

_applied: bool | None = None  # None: not tried yet
_trim_threshold = TRIM_THRESHOLD  # what keep_freed_memory gives mallopt: bound_thread_heaps lowers it


def glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (mallopt, malloc_trim), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError as err:
        log.debug("glibc could not be opened: %s", err)
        return None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process); True if they are in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    libc = None if os.environ.get("BERTKIT_MALLOC", "").lower() == "default" else glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    _applied = libc.mallopt(M_TRIM_THRESHOLD, _trim_threshold) == 1 and ok
    return _applied


def bound_thread_heaps() -> bool:
    """Keep freed memory as `keep_freed_memory` does, but give back the free top of any heap past
    SERVED_TRIM_THRESHOLD (16 MiB) when a block is freed; for a process whose model runs on a thread
    of its own (a server). True if in effect now; where no engine on the CPU has set the
    thresholds yet, the first to do so (`keep_freed_memory`) takes this one.

    Why: glibc serves each new thread from an arena of its own, in heaps of up to 64 MiB, and
    returns the free memory at the top of such a heap only from `free`, once it passes the trim
    threshold; malloc_trim, which the server calls every few seconds, returns the free blocks
    inside every heap but that top only in the main arena's. With the threshold at 1 GiB, above
    any such heap, whatever the model thread's batches touched there stayed resident:
    40 MiB freed on a thread was still resident after malloc_trim, and gone at 16 MiB
    (`tests/test_malloc.py`). The cost is page faults where a freed top is touched again: a
    served MiniLM at 64 clients faulted about as often per request as with 1 GiB (249 and 230
    pages, docs/serving.md), its runs' largest tensors being tens of MiB at most.
    """
    global _applied, _trim_threshold
    _trim_threshold = SERVED_TRIM_THRESHOLD
    if not _applied:  # not set (yet), or BERTKIT_MALLOC=default: glibc's own thresholds trim already
        return False
    _applied = None
    return keep_freed_memory()


# oneDNN's cache of compiled primitives and PyTorch's cache of the ops built on them (both keyed by
# shape) are read from the environment when first used; 64 entries each (see `bound_op_caches`).
OP_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bound_op_caches() -> dict[str, str]:
    """Cap the two shape-keyed caches behind the fused oneDNN Linear path (`encoder/fused.py`)
    at 64 entries each, unless the environment sets them; returns what is in effect.

    Why: every batch of another token count builds new primitives for each Linear shape, and
    with the defaults (1,024 oneDNN primitives; PyTorch's LRU cache likewise) a server fed
    requests of every length kept them all: MiniLM fp32 grew from 353 to 1,059 MiB resident over
    300 batches of 1–64 texts (829 MiB after malloc_trim, so not freed memory). Capped at 64 each
    it stayed at 541–573 MiB (377 after trim), and the 300 batches took 54.9 s against 55.6 s
    uncapped: building a primitive again costs nothing next to its GEMMs (docs/design.md). Read
    once, at first use, so this takes effect only before the process's first oneDNN call.
    """
    for name, value in OP_CACHE_CAPACITY.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in OP_CACHE_CAPACITY}


def resident_bytes() -> int | None:
    """This process's resident memory (VmRSS) in bytes, from /proc/self/statm (one small read);
    None where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
