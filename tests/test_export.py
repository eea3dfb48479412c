"""bertkit export: the written ONNX / OpenVINO file, run in its runtime, answers as bertkit does.

Each head of a tiny random model (odd sizes) and MiniLM's real embeddings are exported, then run
in ONNX Runtime (and OpenVINO where it is installed: it is in the `export` extra, not in `test`)
on a padded batch of other lengths than the one traced, and compared with bertkit's own answers
(`forward` at real tokens, `embed` for the pooled vectors): ≤ 1e-4 in fp32.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM, BertModel
from bertkit.export import export, need_tools, run_exported
from bertkit.inference import embed

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
TOL = 1e-4
TEXTS = ["the cat sees the ball", "a dog likes a red car in the park on a sunny day, they say", "hi"]
PAIRS = ["what does the cat see", "who likes the car", "and then"]


def tiny_dir(root: Path, minilm: Path, name: str, model: torch.nn.Module) -> Path:
    model.save_pretrained(root / name)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm / f, root / name / f)
    return root / name


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir) -> dict[str, Path]:
    """Tiny random models of every head, with MiniLM's vocabulary (so real texts tokenize)."""
    root = tmp_path_factory.mktemp("export-models")
    config = BertConfig(vocab_size=30522, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=40, type_vocab_size=3)
    torch.manual_seed(0)
    heads = {"embed": BertModel(config), "fill-mask": BertForMaskedLM(config),
             "classify": BertForSequenceClassification(config.replace(num_labels=3, id2label={0: "a", 1: "b", 2: "c"})),
             "ner": BertForTokenClassification(config.replace(num_labels=5, id2label={
                 0: "O", 1: "B-X", 2: "I-X", 3: "B-Y", 4: "I-Y"})),
             "qa": BertForQuestionAnswering(config)}
    return {task: tiny_dir(root, minilm_dir, task.replace("-", "_"), model) for task, model in heads.items()}


def feeds(model_dir: Path, segments: bool = True) -> dict[str, np.ndarray]:
    """Texts with pairs, padded to the longest: another batch and length than the export traced."""
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    encodings = tokenizer.encode_raw(TEXTS, PAIRS, max_length=40)
    length = max(len(e.ids) for e in encodings)
    pad = lambda rows: np.array([list(r) + [0] * (length - len(r)) for r in rows], dtype=np.int64)  # noqa: E731
    found = {"input_ids": pad([e.ids for e in encodings]), "attention_mask": pad([[1] * len(e.ids) for e in encodings])}
    if segments:
        found["token_type_ids"] = pad([e.type_ids for e in encodings])
    return found


def expected(model_dir: Path, task: str, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """bertkit's answers: the model class's forward over the padded batch."""
    cls = {"embed": BertModel, "fill-mask": BertForMaskedLM, "classify": BertForSequenceClassification,
           "ner": BertForTokenClassification, "qa": BertForQuestionAnswering}[task]
    model = cls.from_pretrained(model_dir).eval()
    ids, mask = torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])
    types = torch.from_numpy(batch["token_type_ids"]) if "token_type_ids" in batch else None
    with torch.inference_mode():
        out = model(ids, types, mask)
    if task == "embed":
        return {"last_hidden_state": out.last_hidden_state}
    if task == "qa":
        return {"start_logits": out.start_logits, "end_logits": out.end_logits}
    return {"logits": out.logits}


def assert_close(got: dict[str, np.ndarray], want: dict[str, torch.Tensor], mask: np.ndarray) -> None:
    real = torch.from_numpy(mask).bool()
    for name, w in want.items():
        g = torch.from_numpy(got[name])
        assert g.shape == w.shape, f"{name}: {tuple(g.shape)} vs {tuple(w.shape)}"
        if w.dim() >= 2 and w.shape[:2] == real.shape:  # per-token outputs: real positions only
            g, w = g[real], w[real]
        diff = float((g - w).abs().max())
        assert diff <= TOL, f"{name}: max |Δ| {diff:.2e}"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FORMATS = ["onnx", pytest.param("openvino", marks=pytest.mark.skipif(
    not HAS_OPENVINO, reason="openvino is not installed (bertkit[export] installs it; bertkit[test] does not)"))]


@pytest.mark.parametrize("task", ["fill-mask", "classify", "ner"])  # qa: through the CLI, below
def test_every_head_runs_in_onnx_runtime_as_in_bertkit(models, task, tmp_path, monkeypatch):
    """The classifier goes the way of a model over protobuf's 2 GB limit (the limit lowered for
    it): its weights in onnx/model.onnx_data, the name optimum reads, which ONNX Runtime finds."""
    import bertkit.export

    external = task == "classify"
    if external:
        monkeypatch.setattr(bertkit.export, "EXTERNAL_DATA_BYTES", 1000)
    report = export(models[task], tmp_path / "out", format="onnx")
    assert report.task == task and report.max_abs_diff <= TOL
    out = tmp_path / "out"
    assert (out / "onnx" / "model.onnx").is_file() and (out / "config.json").is_file()
    assert (out / "tokenizer.json").is_file() and not (out / "model.safetensors").exists()
    assert out.stat().st_mode & 0o777 == 0o777 & ~current_umask()  # not mkdtemp's 0700
    assert ("onnx/model.onnx_data" in report.files) == external
    if external:
        assert (out / "onnx" / "model.onnx").stat().st_size < 200_000  # the graph alone
    batch = feeds(models[task])
    assert_close(run_exported(out, "onnx", batch), expected(models[task], task, batch), batch["attention_mask"])


@pytest.mark.parametrize("format", FORMATS)
def test_embeddings_pooled_in_the_graph_equal_bertkit_embed(models, format, tmp_path):
    """The encoder with a sentence_embedding output (max pooling, not normalised: the options
    are honoured), in both runtimes; dynamic axes: a batch of 3 where the export traced 2."""
    report = export(models["embed"], tmp_path / "out", format=format, pooling="max", normalize=False)
    assert report.outputs == ["last_hidden_state", "sentence_embedding"]
    batch = feeds(models["embed"])
    got = run_exported(tmp_path / "out", format, batch)
    assert_close(got, expected(models["embed"], "embed", batch), batch["attention_mask"])
    want = embed(models["embed"], TEXTS, pooling="max", normalize=False)
    mine = run_exported(tmp_path / "out", format, feeds_single(models["embed"]))["sentence_embedding"]
    assert float((torch.from_numpy(mine) - want).abs().max()) <= TOL


def feeds_single(model_dir: Path) -> dict[str, np.ndarray]:
    """TEXTS alone (no pairs), padded: what `embed` receives."""
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    encodings = tokenizer.encode_raw(TEXTS, None, max_length=40)
    length = max(len(e.ids) for e in encodings)
    pad = lambda rows: np.array([list(r) + [0] * (length - len(r)) for r in rows], dtype=np.int64)  # noqa: E731
    return {"input_ids": pad([e.ids for e in encodings]), "attention_mask": pad([[1] * len(e.ids) for e in encodings]),
            "token_type_ids": pad([e.type_ids for e in encodings])}


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory, minilm_dir) -> Path:
    out = tmp_path_factory.mktemp("minilm-export") / "out"
    export(minilm_dir, out, format="onnx", pooled=True)
    return out


def test_minilm_embeddings_equal_bertkit_and_keep_the_sentence_transformers_layout(minilm_export, minilm_dir):
    """Real weights: MiniLM's own pooling (mean) and Normalize, in the graph; its
    sentence-transformers files beside onnx/model.onnx, where its ONNX backend looks."""
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "config.json", "vocab.txt"):
        assert (minilm_export / name).is_file(), name
    got = run_exported(minilm_export, "onnx", feeds_single(minilm_dir))["sentence_embedding"]
    want = embed(minilm_dir, TEXTS)  # the model's own pooling: mean, unit length
    assert float((torch.from_numpy(got) - want).abs().max()) <= TOL


def test_sentence_transformers_onnx_backend_loads_the_export(minilm_export, minilm_dir):
    """`SentenceTransformer(dir, backend="onnx")` reads the folder as it is (it needs optimum,
    which the test extra does not install: skipped without it)."""
    pytest.importorskip("optimum.onnxruntime")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_export), backend="onnx", device="cpu")
    got = torch.from_numpy(model.encode(TEXTS))
    assert float((got - embed(minilm_dir, TEXTS)).abs().max()) <= TOL


# ---------------------------------------------------------------------------------------------
# bad input: one line, nothing written
# ---------------------------------------------------------------------------------------------
def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    status = cli.main(argv)
    return status, capsys.readouterr().err.strip()


def test_unknown_format_is_one_line(models, tmp_path, capsys):
    status, err = run_cli(["export", str(models["embed"]), "--format", "tflite", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and err.splitlines() == [err]
    assert "unknown export format 'tflite'" in err and "onnx, openvino" in err
    assert not (tmp_path / "o").exists()


def test_existing_out_needs_overwrite(models, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "model.onnx").write_text("the user's file")
    status, err = run_cli(["export", str(models["embed"]), "--format", "onnx", "--out", str(out)], capsys)
    assert status == 2 and "--overwrite" in err and str(out) in err and len(err.splitlines()) == 1
    assert (out / "model.onnx").read_text() == "the user's file"


def test_pooling_is_for_embed_only(models, tmp_path, capsys):
    status, err = run_cli(["export", str(models["classify"]), "--format", "onnx", "--out", str(tmp_path / "o"),
                           "--pooled"], capsys)
    assert status == 2 and "--task embed" in err and not (tmp_path / "o").exists()


def test_missing_extra_names_it(models, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'bertkit\[export\]'"):
        need_tools("onnx")
    status, err = run_cli(["export", str(models["embed"]), "--format", "onnx", "--out", str(tmp_path / "o")], capsys)
    assert status == 2 and err.splitlines() == [err] and "bertkit[export]" in err and "onnxscript" in err
    assert not (tmp_path / "o").exists()


def test_cli_exports_the_qa_head(models, tmp_path, capsys):
    status = cli.main(["export", str(models["qa"]), "--format", "onnx", "--out", str(tmp_path / "o"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["task"] == "qa" and report["outputs"] == ["start_logits", "end_logits"]
    assert report["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert "onnx/model.onnx" in report["files"] and report["max_abs_diff"] <= TOL
    batch = feeds(models["qa"])
    assert_close(run_exported(tmp_path / "o", "onnx", batch), expected(models["qa"], "qa", batch),
                 batch["attention_mask"])
