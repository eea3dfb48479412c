"""bertkit export over every family: the written ONNX file, run in ONNX Runtime, answers as
transformers' model of the same checkpoint does, and as bertkit's engine does.

One tiny random checkpoint per family, made by transformers with its family's tokenizer (odd sizes,
nothing downloads): BERT, RoBERTa, XLM-R, ALBERT, DistilBERT, ELECTRA, ERNIE, MPNet (its
relative-position bias), DeBERTa-v2 and -v3 (disentangled attention; v2's convolution and
segments) and ModernBERT (rotary positions, sliding windows). Each is fed a padded batch of pairs of
another size than the one traced: every output at real tokens within 1e-4 of transformers' (fp32,
eager attention); an encoder's mean-pooled sentence_embedding within 1e-4 of
`bertkit.inference.embed` (the engine's packed path). OpenVINO runs the same checks where it is
installed (the `export` extra; not the `test` one).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.export import export, run_exported
from bertkit.inference import embed

from family_fixtures import make_bert, make_checkpoint
from modern_fixtures import make_modernbert

pytest.importorskip("onnxruntime", reason="bertkit export to onnx needs onnxruntime: pip install 'bertkit[export]'")
pytest.importorskip("onnxscript", reason="bertkit export to onnx needs onnxscript: pip install 'bertkit[export]'")
transformers = pytest.importorskip("transformers")
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
TOL = 1e-4
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello"]
PAIRS = ["paris is the capital of france", "the quick brown fox", "world"]
# One export per family, a head for some: MPNet's bias and DeBERTa-v3's shared position projections
# under the bare encoder; RoBERTa's own classifier head (no segments: no token_type_ids input) and
# ALBERT's shared layers and embedding projection under a classifier; DeBERTa-v2's convolution,
# segments and context pooler under a classifier; ModernBERT's classifier over its final norm.
FAMILIES = [("bert", "Model"), ("roberta", "ForSequenceClassification"), ("xlm-roberta", "Model"),
            ("albert", "ForSequenceClassification"),
            ("distilbert", "ForTokenClassification"), ("electra", "Model"), ("ernie", "ForSequenceClassification"),
            ("mpnet", "Model"), ("deberta-v2", "ForSequenceClassification"), ("deberta-v3", "Model"),
            ("modernbert", "ForSequenceClassification")]
OPENVINO = pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed: pip install 'bertkit[export]'")


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> Path:
    """DeBERTa's spm.model tokenizer, trained once for the module."""
    pytest.importorskip("sentencepiece")
    from test_family_deberta import spm_dir

    return spm_dir(tmp_path_factory.mktemp("spm"))


def checkpoint(family: str, out: Path, spm: Path, kind: str = "Model") -> Path:
    """A transformers-made <Family><kind> directory with its tokenizer files."""
    labels = {"num_labels": 3} if kind in ("ForSequenceClassification", "ForTokenClassification") else {}
    if family == "bert":
        return make_bert(out, kind, **labels)
    if family == "modernbert":
        return make_modernbert(out, kind, **labels)
    if family.startswith("deberta"):
        from test_family_deberta import hf_config

        vocab = len(transformers.AutoTokenizer.from_pretrained(spm))
        torch.manual_seed(0)
        config = hf_config(family.removeprefix("deberta-"), vocab_size=vocab, **labels)
        getattr(transformers, "DebertaV2" + kind)(config).eval().save_pretrained(out)
        for name in ("spm.model", "tokenizer_config.json"):
            (out / name).write_bytes((spm / name).read_bytes())
        return out
    return make_checkpoint(family, out, kind=kind, **labels)


def transformers_outputs(directory: Path, kind: str, inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """transformers' answer (eager attention, fp32) on the same padded batch, under the export's names."""
    model = getattr(transformers, "AutoModel" if kind == "Model" else "AutoModel" + kind).from_pretrained(
        directory, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**{name: torch.from_numpy(value) for name, value in inputs.items()})
    return {"last_hidden_state": out.last_hidden_state} if kind == "Model" else {"logits": out.logits}


def padded_pairs(directory: Path, names: list[str]) -> dict[str, np.ndarray]:
    """TEXTS with PAIRS, right-padded by the checkpoint's own tokenizer: 3 rows, where the export traced 2."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer(TEXTS, PAIRS, padding=True, return_tensors="np", return_token_type_ids=True)
    lengths = encoded["attention_mask"].sum(1)
    assert lengths.min() < lengths.max() <= 62  # padding, and within the tiny models' 64 positions
    return {name: encoded[name].astype(np.int64) for name in names}


def max_diff(got: np.ndarray, want: torch.Tensor, mask: np.ndarray) -> float:
    """Largest |got - want|, at real tokens for per-token outputs."""
    got = torch.from_numpy(got)
    assert got.shape == want.shape, f"{tuple(got.shape)} vs {tuple(want.shape)}"
    if want.dim() >= 2 and want.shape[:2] == mask.shape:
        real = torch.from_numpy(mask).bool()
        got, want = got[real], want[real]
    return float((got - want).abs().max())


@pytest.mark.parametrize("format", ["onnx", pytest.param("openvino", marks=OPENVINO)])
@pytest.mark.parametrize("family, kind", FAMILIES)
def test_export_equals_transformers_and_the_engine(family, kind, format, spm, tmp_path):
    """Encoders with a mean-pooled sentence_embedding (against the engine's `embed`), heads with
    their logits; every output against transformers' on a padded batch of pairs."""
    directory = checkpoint(family, tmp_path / "model", spm, kind)
    pooled = {"pooling": "mean", "normalize": False} if kind == "Model" else {}
    report = export(directory, tmp_path / "out", format=format, **pooled)
    assert report.max_abs_diff <= TOL  # the export's own check, against bertkit's padded forward
    if family in ("roberta", "albert"):  # RoBERTa reads no segments, ALBERT does
        assert report.inputs == ["input_ids", "attention_mask"] + (["token_type_ids"] if family == "albert" else [])
    batch = padded_pairs(directory, report.inputs)
    got = run_exported(tmp_path / "out", format, batch)
    for name, want in transformers_outputs(directory, kind, batch).items():
        assert max_diff(got[name], want, batch["attention_mask"]) <= TOL, name
    if kind != "Model":
        return
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    single = tokenizer(TEXTS, padding=True, return_tensors="np", return_token_type_ids=True)
    vectors = run_exported(tmp_path / "out", format, {n: single[n].astype(np.int64) for n in report.inputs})
    engine = embed(directory, TEXTS, pooling="mean", normalize=False)
    assert float((torch.from_numpy(vectors["sentence_embedding"]) - engine).abs().max()) <= TOL


def test_modernbert_export_keeps_the_window_past_the_traced_length(tmp_path):
    """A 128-token window, as released ModernBERTs have, is wider than the batch the export traces
    (64 tokens at most): the band must still be in the graph for a longer input."""
    directory = make_modernbert(tmp_path / "model", "Model", local_attention=128)
    report = export(directory, tmp_path / "out", format="onnx")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer([" ".join(TEXTS * 12), TEXTS[0]], padding=True, return_tensors="np")
    assert encoded["input_ids"].shape[1] > 2 * 64 + 1  # past the window's reach, and the trace's length
    batch = {name: encoded[name].astype(np.int64) for name in report.inputs}
    want = transformers_outputs(directory, "Model", batch)["last_hidden_state"]
    got = run_exported(tmp_path / "out", "onnx", batch)["last_hidden_state"]
    assert max_diff(got, want, batch["attention_mask"]) <= TOL
