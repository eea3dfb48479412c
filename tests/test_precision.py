"""bertkit.backend.precision: "auto" is decided by a measured matmul rate, never by CPU flags."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from bertkit.backend import precision
from bertkit.util import fileio


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    # Every test measures (or fakes) its own rates; the module caches per process and on disk.
    monkeypatch.setattr(precision, "_rates", {})
    monkeypatch.setattr(precision, "_choices", {})
    monkeypatch.setenv(fileio.CACHE_ENV, str(tmp_path / "cache"))


def fake_rates(monkeypatch, rates: dict[torch.dtype, float]) -> list[torch.dtype]:
    """Replace the probe with fixed rates; returns the list of dtypes it was asked for."""
    calls = []

    def rate(dtype, device="cpu", *args, **kwargs):
        calls.append(dtype)
        if rates[dtype] is None:
            raise RuntimeError(f"no kernel for {dtype}")
        return rates[dtype]

    monkeypatch.setattr(precision, "matmul_rate", rate)
    return calls


def test_matmul_rate_measures_a_positive_rate():
    for dtype in (torch.float32, torch.bfloat16):
        rate = precision.matmul_rate(dtype, "cpu", size=64, calls=2)
        assert 0 < rate < 1e6  # GFLOP/s: a 64 × 64 matmul on a CPU is far below a PFLOP/s


def test_matmul_rate_rejects_bad_sizes():
    with pytest.raises(ValueError, match="size and calls"):
        precision.matmul_rate(torch.float32, size=0)


@pytest.mark.parametrize("fp32, bf16, expected", [
    (370.0, 3010.0, "bf16"),  # AMX: bf16 8× faster
    (327.0, 169.0, "fp32"),  # AVX-512 BF16 without AMX: bf16 at half the fp32 rate
    (200.0, 200.0, "fp32"),  # a tie goes to the first candidate, the exact one
])
def test_auto_picks_the_measured_fastest(monkeypatch, caplog, fp32, bf16, expected):
    fake_rates(monkeypatch, {torch.float32: fp32, torch.bfloat16: bf16})
    with caplog.at_level(logging.INFO, logger="bertkit.backend.precision"):
        assert precision.resolve_precision("auto", "cpu") == expected
    other = "fp32" if expected == "bf16" else "bf16"
    assert f"precision auto: {expected}" in caplog.text
    assert f"over {other}" in caplog.text


def test_auto_is_measured_once_per_thread_count(monkeypatch):
    calls = fake_rates(monkeypatch, {torch.float32: 100.0, torch.bfloat16: 300.0})
    threads = torch.get_num_threads()
    try:
        assert precision.fastest_precision("cpu") == "bf16"
        assert precision.fastest_precision("cpu") == "bf16"
        assert precision.peak_rate("bf16", "cpu") == 300.0
        assert len(calls) == 2  # one probe per precision, then the cache
        torch.set_num_threads(1 if threads > 1 else 2)
        precision.fastest_precision("cpu")
        assert len(calls) == 4  # another thread count is another machine
    finally:
        torch.set_num_threads(threads)


def test_rates_are_kept_on_disk_for_the_next_process(monkeypatch, tmp_path):
    calls = fake_rates(monkeypatch, {torch.float32: 100.0, torch.bfloat16: 300.0})
    assert precision.fastest_precision("cpu") == "bf16"
    stored = json.loads((tmp_path / "cache" / precision.PROBE_FILE).read_text())
    assert stored == {precision.machine_key(): {"fp32": 100.0, "bf16": 300.0}}
    # A new process (the in-memory caches empty) reads the file instead of probing.
    monkeypatch.setattr(precision, "_rates", {})
    monkeypatch.setattr(precision, "_choices", {})
    assert precision.fastest_precision("cpu") == "bf16" and len(calls) == 2
    # Another thread count is another key; a damaged file is measured again and rewritten.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        precision.fastest_precision("cpu")
        assert len(calls) == 4
    finally:
        torch.set_num_threads(threads)
    (tmp_path / "cache" / precision.PROBE_FILE).write_text("{not json")
    monkeypatch.setattr(precision, "_rates", {})
    monkeypatch.setattr(precision, "_choices", {})
    assert precision.fastest_precision("cpu") == "bf16" and len(calls) == 6
    assert json.loads((tmp_path / "cache" / precision.PROBE_FILE).read_text())[precision.machine_key()]["fp32"] == 100.0


def test_a_precision_that_does_not_run_is_left_out(monkeypatch):
    fake_rates(monkeypatch, {torch.float32: 100.0, torch.bfloat16: None})
    assert precision.fastest_precision("cpu") == "fp32"
    with pytest.raises(ValueError, match="does not run"):
        precision.peak_rate("bf16", "cpu")


def test_explicit_precisions_are_not_measured(monkeypatch):
    calls = fake_rates(monkeypatch, {torch.float32: 1.0, torch.bfloat16: 2.0})
    assert precision.resolve_precision("fp32", "cpu") == "fp32"
    assert precision.resolve_precision("bf16", "cpu") == "bf16"
    assert calls == []


@pytest.mark.parametrize("value", ["fp16", "BF16", "", "int8"])
def test_a_bad_precision_names_the_value_and_the_choices(value):
    with pytest.raises(ValueError, match=f"unknown precision '{value}'; choose one of auto, fp32, bf16"):
        precision.resolve_precision(value, "cpu")


def test_cuda_auto_follows_bf16_support_without_measuring(monkeypatch):
    calls = fake_rates(monkeypatch, {torch.float32: 1.0, torch.bfloat16: 2.0})
    monkeypatch.setattr(precision, "_device", lambda device: torch.device(device))
    for supported, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert precision.resolve_precision("auto", "cuda") == expected
    assert calls == []


def test_real_auto_choice_is_one_of_the_candidates():
    choice = precision.resolve_precision("auto", "cpu")
    rates = {p: precision.peak_rate(p, "cpu") for p in ("fp32", "bf16")}
    assert choice == max(rates, key=lambda p: (rates[p], p == "fp32"))
