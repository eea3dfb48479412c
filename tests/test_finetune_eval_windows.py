"""`eval_windows`: classify evaluation over every window of a long text, or its first window only."""

from __future__ import annotations

import pytest
import torch

from bertkit.data.tasks import classify
from bertkit.train import finetune as finetune_module
from bertkit.train.finetune import ClassifyTask, FinetuneConfig

LONG = " ".join(["market"] * 60 + ["football"] * 60)  # 120 pieces: several 16-piece windows


def make_task(pieces, eval_windows: bool) -> ClassifyTask:
    config = FinetuneConfig(task="classify", model="tiny", train="unused.jsonl", out_dir="unused",
                            max_length=16, eval_windows=eval_windows)
    task = ClassifyTask(config, pieces)
    task.space = classify.LabelSpace(["business", "sport"])
    return task


@pytest.fixture
def windows_seen(monkeypatch):
    """Replaces the model pass: records each feature's ids; window logits favour 'sport' when the
    window holds 'football', so the answer depends on which windows were scored."""
    seen: list[list[list[int]]] = []

    def fake_forward(model, features, **_):
        seen.append([f["input_ids"] for f in features])
        sport = model  # the piece id of "football", passed in the model's place
        return {"logits": [torch.tensor([0.0, 4.0]) if sport in f["input_ids"] else torch.tensor([4.0, 0.0])
                           for f in features]}

    monkeypatch.setattr(finetune_module, "forward_batches", fake_forward)
    return seen


def test_first_window_only_when_eval_windows_is_false(pieces, windows_seen):
    football = pieces.encode(["football"])[0].ids[0]
    examples = [classify.ClassifyExample(LONG, None, "sport", "t:1"),
                classify.ClassifyExample("market", None, "business", "t:2")]
    first = make_task(pieces, eval_windows=False).evaluate(football, examples, "t")
    assert [len(ids) for ids in windows_seen[0]] == [16, 3]  # one truncated feature per text
    assert first["accuracy"] == 0.5  # the long text's first window is all "market"

    every = make_task(pieces, eval_windows=True).evaluate(football, examples, "t")
    assert len(windows_seen[1]) > 3  # the long text gave several windows
    assert every["accuracy"] == 1.0  # its later windows, averaged, say "sport"


def test_predict_reads_every_window_whatever_eval_windows_says(pieces, windows_seen):
    football = pieces.encode(["football"])[0].ids[0]
    rows = make_task(pieces, eval_windows=False).predict(football, [classify.ClassifyExample(LONG, None, None)])
    assert len(windows_seen[0]) > 1
    assert rows[0]["label"] == "sport"


def test_eval_windows_must_be_a_bool():
    with pytest.raises(ValueError, match="eval_windows must be True or False"):
        FinetuneConfig(task="classify", model="tiny", train="t.jsonl", out_dir="o", eval_windows="no")


def test_cli_flag_reaches_the_config():
    from bertkit.cli import build_parser

    base = ["finetune", "--task", "classify", "--model", "m", "--dataset", "en-news", "--out", "o"]
    assert "eval_windows" not in vars(build_parser().parse_args(base))  # the config's default: True
    assert build_parser().parse_args(base + ["--eval-first-window"]).eval_windows is False
    assert FinetuneConfig.eval_windows is True
