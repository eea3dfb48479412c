"""bench/infer.py's verdicts: which peer row each goal is held against (no peer runs here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "bench" / "infer.py"


@pytest.fixture(scope="module")
def infer():
    spec = importlib.util.spec_from_file_location("infer_bench", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def rows(infer, rates: dict[str, tuple[str, float, float]]):
    """Rows of workload (a) at `rates`: name → (precision, items/s, min cosine to bertkit fp32)."""
    out = []
    for name, (precision, rate, cosine) in rates.items():
        row = infer.Row("a", name, precision, not name.startswith("bertkit"), [1.0 / rate], 1, 1, 1.0)
        row.finish({"fp32": 1.0, "bf16": 1.0, "int8": 1.0})
        row.vs_ours_fp32 = {"max_abs": 0.0, "min_cos": cosine}
        out.append(row)
    return out


def test_each_goal_is_held_against_the_peers_faster_row_streams_or_not(infer):
    verdicts = infer.goals(rows(infer, {
        "bertkit fp32": ("fp32", 330.0, 1.0), "bertkit bf16": ("bf16", 560.0, 0.9999),
        "bertkit int8": ("int8", 800.0, 0.995), "bertkit int8-static": ("int8", 870.0, 0.995),
        "ctranslate2 float32": ("fp32", 260.0, 1.0), "ctranslate2 float32, 2 streams": ("fp32", 295.0, 1.0),
        "openvino bf16": ("bf16", 380.0, 0.9999), "openvino bf16, 2 streams": ("bf16", 480.0, 0.9999),
        "ctranslate2 int8": ("int8", 600.0, 0.989), "ctranslate2 int8, 2 streams": ("int8", 700.0, 0.989),
        "openvino int8 static (NNCF)": ("int8", 700.0, 0.985),
        "openvino int8 static (NNCF), 2 streams": ("int8", 650.0, 0.985)}))
    fp32, bf16, int8, static = verdicts
    assert fp32 == "fp32 1.12× ctranslate2 float32, 2 streams: not met"
    assert bf16 == "bf16 1.17× openvino bf16, 2 streams: not met"
    assert int8 == "int8 1.14× ctranslate2 int8, 2 streams, min cosine 0.99500: not met"
    # the one-stream row is the faster one here
    assert static == "int8-static 1.24× openvino int8 static (NNCF), min cosine 0.99500 vs 0.98500: met"


def test_without_streams_rows_the_one_stream_peer_counts(infer):
    verdicts = infer.goals(rows(infer, {
        "bertkit fp32": ("fp32", 330.0, 1.0), "bertkit bf16": ("bf16", 560.0, 0.9999),
        "ctranslate2 float32": ("fp32", 260.0, 1.0), "openvino bf16": ("bf16", 380.0, 0.9999)}))
    assert verdicts == ["fp32 1.27× ctranslate2 float32: met", "bf16 1.47× openvino bf16: met"]
