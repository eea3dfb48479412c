"""`eval_windows`: classify evaluation over every window of a long text, or its first window only."""

from __future__ import annotations

import importlib

import pytest
import torch

from bertkit.data.formats import classify
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.inference import Engine
from bertkit.inference.jobs import predict_file
from bertkit.train.finetune import ClassifyTask, FinetuneConfig

# The module, not the function of the same name that bertkit.inference exports.
inference_classify = importlib.import_module("bertkit.inference.classify")
LONG = " ".join(["market"] * 60 + ["football"] * 60)  # 120 pieces: several 16-piece windows


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny classifier over MiniLM's vocabulary; its forward is replaced by `windows_seen`."""
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=24,
                        id2label={0: "business", 1: "sport"})
    return BertForSequenceClassification(config)


def make_task(tokenizer, eval_windows: bool) -> ClassifyTask:
    config = FinetuneConfig(task="classify", model="tiny", train="unused.jsonl", out_dir="unused",
                            max_length=16, eval_windows=eval_windows)
    task = ClassifyTask(config, tokenizer)
    task.space = classify.LabelSpace(["business", "sport"])
    return task


@pytest.fixture
def windows_seen(monkeypatch, tokenizer):
    """Replaces the model pass: records each feature's ids; window logits favour 'sport' when the
    window holds 'football', so the answer depends on which windows were scored."""
    seen: list[list[list[int]]] = []
    football = tokenizer.convert_tokens_to_ids("football")

    def fake_logits(engine, ids, type_ids):
        seen.append([list(i) for i in ids])
        return torch.stack([torch.tensor([0.0, 4.0]) if football in i else torch.tensor([4.0, 0.0]) for i in ids])

    monkeypatch.setattr(inference_classify, "sequence_logits", fake_logits)
    return seen


def test_first_window_only_when_eval_windows_is_false(tokenizer, model, windows_seen):
    examples = [classify.ClassifyExample(LONG, None, "sport", "t:1"),
                classify.ClassifyExample("market", None, "business", "t:2")]
    first = make_task(tokenizer, eval_windows=False).evaluate(model, examples, "t")
    assert [len(ids) for ids in windows_seen[0]] == [16, 3]  # one truncated feature per text
    assert first["accuracy"] == 0.5  # the long text's first window is all "market"

    every = make_task(tokenizer, eval_windows=True).evaluate(model, examples, "t")
    assert len(windows_seen[1]) > 3  # the long text gave several windows
    assert every["accuracy"] == 1.0  # its later windows, averaged, say "sport"
    assert model.training  # evaluation hands the model back in training mode


def test_classify_with_windows_reads_every_window(tokenizer, model, windows_seen):
    engine = Engine(model, tokenizer, max_length=16)
    (row,) = inference_classify.classify(engine, [LONG], windows=True)
    assert len(windows_seen[0]) > 1
    assert row["label"] == "sport"
    (cut,) = inference_classify.classify(engine, [LONG])  # without windows: the first 16 pieces only
    assert [len(ids) for ids in windows_seen[1]] == [16] and cut["label"] == "business"


def test_predict_reads_every_window_whatever_eval_windows_says(tokenizer, model, windows_seen, tmp_path):
    directory = tmp_path / "clf"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "finetune_config.json").write_text('{"task": "classify", "max_length": 16, '
                                                    '"eval_windows": false}')
    (tmp_path / "in.txt").write_text(LONG + "\n")
    predict_file(directory, tmp_path / "in.txt", tmp_path / "out.jsonl", progress=False, device="cpu")
    assert len(windows_seen[-1]) > 1
    assert '"label": "sport"' in (tmp_path / "out.jsonl").read_text()


def test_eval_windows_must_be_a_bool():
    with pytest.raises(ValueError, match="eval_windows must be True or False"):
        FinetuneConfig(task="classify", model="tiny", train="t.jsonl", out_dir="o", eval_windows="no")


def test_cli_flag_reaches_the_config():
    from bertkit.cli import build_parser

    base = ["finetune", "--task", "classify", "--model", "m", "--dataset", "en-news", "--out", "o"]
    assert "eval_windows" not in vars(build_parser().parse_args(base))  # the config's default: True
    assert build_parser().parse_args(base + ["--eval-first-window"]).eval_windows is False
    assert FinetuneConfig.eval_windows is True
