"""Which precision to compute in: decided by measuring the machine, never by its CPU flags.

    resolve_precision("auto", "cpu")    # → "fp32" or "bf16", whichever multiplies faster here
    peak_rate("bf16", "cpu")            # GFLOP/s of a bf16 matmul here, the denominator of an MFU

Why measure: a CPU's flags do not say how fast bf16 is. On one Intel Xeon with AVX-512 BF16 but
no AMX exposed, bf16 matmuls ran at half the fp32 rate while a flag check chose bf16; on a Xeon
with AMX bf16 is 8× faster; on an AMD EPYC with AVX-512 BF16, 2.4× (docs/benchmarks.md). A
matmul probe in nn.Linear's layout takes a fraction of a second and gives the answer for the
machine, the torch build and the thread count at hand.

On CUDA, "auto" is bf16 wherever the GPU supports it (tensor cores make it the faster one on
every GPU that has it), without a probe.

Measurements are cached per (device type, torch thread count, precision): a process that starts
several runs probes once, and changing `torch.set_num_threads` measures again. A CPU's rates are
also kept on disk, in `probes.json` under `fileio.cache_dir()`, keyed by `machine_key()` (torch's
version, the CPU, the thread count), so that a CLI call or a service restart does not probe again;
delete the file to measure anew.
"""

from __future__ import annotations

import json
import logging
import time

import torch

from bertkit.constants import TRAINING_PRECISIONS
from bertkit.util.fileio import atomic_write_json, cache_dir
from bertkit.util.machine import cpu_identity

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# (device type, threads, precision) → GFLOP/s; None = the precision does not run there.
_rates: dict[tuple[str, int, str], float | None] = {}
# (device type, threads, candidates) → the precision chosen.
_choices: dict[tuple[str, int, tuple[str, ...]], str] = {}


PROBE_FILE = "probes.json"


def machine_key() -> str:
    """What a measured rate or a compiled CPU kernel holds for: this torch, this CPU, this thread
    count."""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"torch {torch.__version__}|{capability}|threads {torch.get_num_threads()}|{cpu_identity()}"


def _probe_file() -> dict:
    """probes.json as a dict; {} where it is absent, damaged or not bertkit's (it is probed again)."""
    try:
        stored = json.loads((cache_dir() / PROBE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _stored_rates() -> dict:
    """The rates kept on disk for this machine key ({precision: GFLOP/s or None}); {} if none."""
    rates = _probe_file().get(machine_key(), {})
    return rates if isinstance(rates, dict) else {}


def _store_rate(precision: str, rate: float | None) -> None:
    """Keep a CPU rate on disk (best effort: a read-only home only costs the next process a probe)."""
    stored = _probe_file()
    if not isinstance(stored.get(machine_key()), dict):
        stored[machine_key()] = {}
    stored[machine_key()][precision] = rate
    try:
        atomic_write_json(cache_dir() / PROBE_FILE, stored)
    except OSError as err:
        logger.info("could not keep the %s probe in %s (%s)", precision, cache_dir(), err)


def _device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(dtype: torch.dtype, device: torch.device | str = "cpu", size: int = 1024,
                calls: int = 8, *, rows: int | None = None) -> float:
    """GFLOP/s of `x @ W.T` (nn.Linear's layout) in `dtype` on `device`, at torch's thread count.

    x: (rows, size), rows = size unless given; W: (size, size). The rate is that of the fastest of
    `calls` timed calls after two warm-up calls: the first calls of a shape pay for the library's
    set-up, and a mean over a few calls moved by 40% between two runs a minute apart. A peak set
    too low would flatter an MFU.
    Raises RuntimeError where the device cannot multiply in `dtype`.
    """
    if size < 1 or calls < 1:
        raise ValueError(f"size and calls must be >= 1, got size={size}, calls={calls}")
    device = _device(device)
    rows = size if rows is None else rows
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, size, generator=generator).to(device=device, dtype=dtype)  # (rows, size)
    w = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)  # (out, in)
    with torch.no_grad():
        for _ in range(2):  # warm-up
            x @ w.T
        _synchronize(device)
        best = float("inf")
        for _ in range(calls):
            start = time.perf_counter()
            x @ w.T  # (rows, size)
            _synchronize(device)
            best = min(best, time.perf_counter() - start)
    return 2 * rows * size * size / max(best, 1e-9) / 1e9


def _supported(precision: str, device: torch.device) -> bool:
    if precision == "bf16" and device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True


def _measured(precision: str, device: torch.device) -> float | None:
    """The cached rate of `precision` on `device` (GFLOP/s), measured on first use; None where it
    does not run."""
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(DTYPES)}")
    key = (device.type, torch.get_num_threads(), precision)
    if key not in _rates and device.type == "cpu" and precision in (stored := _stored_rates()):
        _rates[key] = stored[precision]
    if key not in _rates:
        rate = None
        if _supported(precision, device):
            try:
                rate = matmul_rate(DTYPES[precision], device)
            except RuntimeError as err:  # a build or device without kernels for the dtype
                logger.info("precision %s does not run on %s (%s); leaving it out", precision,
                            device.type, err)
        _rates[key] = rate
        if device.type == "cpu":
            _store_rate(precision, rate)
    return _rates[key]


def peak_rate(precision: str, device: torch.device | str = "cpu") -> float:
    """Measured matmul rate (GFLOP/s) of `precision` ("fp32" / "bf16") on `device`, cached.

    For an MFU that does not flatter, divide by the peak of the *fastest* precision:
    `peak_rate(fastest_precision(device), device)`.
    Raises ValueError when the precision does not run on the device.
    """
    device = _device(device)
    rate = _measured(precision, device)
    if rate is None:
        raise ValueError(f"precision {precision} does not run on {device}; use fp32")
    return rate


def fastest_precision(device: torch.device | str = "cpu",
                      candidates: tuple[str, ...] = ("fp32", "bf16")) -> str:
    """The candidate whose matmul runs fastest here (ties go to the earlier candidate).

    Cached per (device type, torch thread count, candidates); logs the choice with the rates once.
    """
    device = _device(device)
    candidates = tuple(candidates)
    if not candidates:
        raise ValueError("fastest_precision needs at least one candidate precision")
    key = (device.type, torch.get_num_threads(), candidates)
    if key in _choices:
        return _choices[key]
    rates = {p: r for p in candidates if (r := _measured(p, device)) is not None}
    if not rates:
        raise ValueError(f"none of the precisions {', '.join(candidates)} runs on {device}")
    ranked = sorted(rates, key=lambda p: (-rates[p], candidates.index(p)))
    best = ranked[0]
    others = ", ".join(f"{p} ({rates[p]:,.0f})" for p in ranked[1:])
    logger.info("precision auto: %s (%s GFLOP/s)%s on %s, %d thread%s", best, f"{rates[best]:,.0f}",
                f" over {others}" if others else "", device.type, torch.get_num_threads(),
                "" if torch.get_num_threads() == 1 else "s")
    _choices[key] = best
    return best


def resolve_precision(requested: str, device: torch.device | str = "cpu") -> str:
    """"fp32" / "bf16" as given; "auto" → bf16 on a CUDA GPU that supports it, else the precision
    measured fastest here (`fastest_precision`)."""
    if requested not in TRAINING_PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; choose one of {', '.join(TRAINING_PRECISIONS)}")
    if requested != "auto":
        return requested
    device = _device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return fastest_precision(device)


def autocast(device: torch.device | str, precision: str):
    """bf16 autocast context (a no-op for fp32). Weights and optimizer state stay fp32."""
    device = torch.device(device)
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
