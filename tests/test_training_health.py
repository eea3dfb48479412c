"""A run that cannot have learned says so: too few steps, a loss still at chance, a score no
better than a predictor that ignores its input (`bertkit.train.health`), and a reranker's dev score
comes with its first stage's on the same candidates."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from bertkit.encoder.config import BertConfig
from bertkit.train import finetune as ft
from bertkit.train import health
from bertkit.train import retrieval as rt

from pretrain_fixtures import one_thread, tiny_pretrained  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def test_checks_against_the_runs_own_numbers():
    assert "only 10 optimizer steps (300 training examples at batch 32, 1 epoch)" in \
        health.step_warning(10, examples=300, batch_size=32, epochs=1)
    assert health.step_warning(health.MIN_STEPS, examples=3200, batch_size=32, epochs=1) is None
    rows = ft.TASK_ROWS  # each task's chance loss: (its settings, the model's config)
    assert rows["classify"].chance_loss(None, BertConfig.preset("tiny", num_labels=5)) == pytest.approx(math.log(5))
    assert rows["classify"].chance_loss(None, BertConfig.preset("tiny", num_labels=1,
                                                                problem_type="regression")) is None
    rerank = rt.RetrievalTrainConfig(task="rerank", model="m", train="t", out_dir="o", negatives=3)
    assert rows["rerank"].chance_loss(rerank) == pytest.approx(math.log(4))
    assert rows["rerank"].chance_loss(dataclasses.replace(rerank, loss="bce")) == pytest.approx(math.log(2))
    embed = rt.RetrievalTrainConfig(task="embed", model="m", train="t", out_dir="o", batch_size=32)
    assert rows["embed"].chance_loss(embed) == pytest.approx(math.log(32))
    assert "near chance (1.386" in health.loss_warning(1.35, math.log(4))
    assert health.loss_warning(0.5, math.log(4)) is None
    assert "no better than always" in health.baseline_warning("accuracy", 0.313, 0.313, "always X", "test")
    assert health.baseline_warning("accuracy", 0.9, 0.313, "always X", "test") is None


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, minilm_dir):
    return tiny_pretrained(tmp_path_factory.mktemp("base"), minilm_dir)


def _rows(n: int, seed: int, positive_share: float = 0.5) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        positive = rng.random() < positive_share
        words = [rng.choice(["great", "good"] if positive else ["bad", "awful"])] + rng.choices(
            ["the", "movie", "was", "very", "a", "plot"], k=5)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": "pos" if positive else "neg"})
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_a_run_too_short_to_learn_says_so(tmp_path, base_dir, caplog):
    """4 steps at a learning rate too small to move: every check fires, in eval.json and the log."""
    summary = ft.finetune("classify", str(base_dir), _write(tmp_path / "train.jsonl", _rows(64, 0)),
                          str(tmp_path / "short"), eval_file=_write(tmp_path / "dev.jsonl", _rows(60, 1, 0.75)),
                          epochs=1, batch_size=16, lr=1e-9, max_length=32, progress=False, precision="fp32")
    warnings = summary["warnings"]
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith("only 4 optimizer steps (64 training examples at batch 16, 1 epoch)")
    assert "near chance (0.693" in warnings[1]
    dev = _rows(60, 1, 0.75)
    share = max(sum(r["label"] == label for r in dev) for label in ("pos", "neg")) / len(dev)
    assert summary["eval"]["majority_accuracy"] == pytest.approx(share) and share > 0.5
    assert "no better than always answering the most frequent label" in warnings[2]
    assert json.loads((tmp_path / "short" / "eval.json").read_text())["warnings"] == warnings
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum(any(w in line for line in logged) for w in warnings) == 3


def test_a_run_that_learns_has_no_warnings(tmp_path, base_dir):
    summary = ft.finetune("classify", str(base_dir), _write(tmp_path / "train.jsonl", _rows(200, 0)),
                          str(tmp_path / "ok"), eval_file=_write(tmp_path / "dev.jsonl", _rows(60, 1, 0.75)),
                          epochs=4, batch_size=8, lr=2e-3, warmup_ratio=0.0, max_length=32, progress=False,
                          precision="fp32", seed=0)
    assert summary["eval"]["accuracy"] > summary["eval"]["majority_accuracy"]
    assert summary["warnings"] == []


def test_reranker_eval_carries_its_first_stage(tmp_path, capsys):
    from bertkit import cli

    base = tiny_encoder(tmp_path / "base")
    texts = sentences(24, seed=11)
    pairs = tmp_path / "p.jsonl"
    pairs.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t}) + "\n"
                             for t in texts), encoding="utf-8")
    status = cli.main(["finetune", "--task", "rerank", "--model", str(base), "--train", str(pairs),
                       "--eval", str(pairs), "--out", str(tmp_path / "ce"), "--no-progress", "--loss", "bce",
                       "--negatives", "1", "--max-length", "20", "--epochs", "1", "--lr", "1e-9"])
    out = capsys.readouterr().out
    assert status == 0
    summary = json.loads(out.strip().splitlines()[-1])
    first = summary["eval"]["first_stage"]
    assert first["name"] == "BM25 top 20" and 0 <= first["mrr@10"] <= 1
    # The same candidates in BM25's order, scored directly: the baseline is what BM25 alone gets.
    assert first["mrr@10"] == rt.evaluate(tmp_path / "ce", "rerank", str(pairs))["first_stage"]["mrr@10"]
    assert f"first stage (BM25 top 20) mrr@10 {first['mrr@10']}, reranked {summary['eval']['mrr@10']}" in out
    assert summary["warnings"][0].startswith("only ")  # 1 epoch of 24 pairs at batch 32
    assert any("near chance (0.693" in w for w in summary["warnings"])
