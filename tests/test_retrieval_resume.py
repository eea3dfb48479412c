"""Exact resume of the bi-encoder (embed) and the cross-encoder (rerank): a run stopped after a
few steps of its second epoch and resumed gives the losses (steps.jsonl) and the weights of the
run that was never stopped — with dropout on, with GradCache, LoRA and Matryoshka, with a
teacher whose cached scores are read back, with negatives the cross-encoder draws afresh each
epoch — and a resume that cannot continue the run is refused with one line saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bertkit.train.retrieval import biencoder, crossencoder, loop

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_cross_encoder, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")

# 16 rows in batches of 4: 4 steps an epoch, 8 in two; training states after steps 3 and 6.
ROWS, STOP_AT = 16, 7  # the 7th loss call raises: the run stops in epoch 2, its state of step 6 on disk


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval-resume")
    texts = sentences(4 * ROWS, seed=5)
    rows = [{"query": texts[4 * i], "positive": texts[4 * i + 1], "negatives": texts[4 * i + 2:4 * i + 2 + 1 + i % 2]}
            for i in range(ROWS)]
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {"train": train, "encoder": tiny_encoder(root / "encoder"),
            "cross": tiny_cross_encoder(root / "cross"), "root": root}


def settings(data, out: Path, task: str, **more) -> dict:
    return {"task": task, "model": str(data["cross" if task == "rerank" else "encoder"]), "train": str(data["train"]),
            "out_dir": str(out), "epochs": 2, "batch_size": 4, "lr": 1e-3, "max_length": 16, "progress": False,
            "save_every": 3, **more}


def stopped(trainer, monkeypatch, run: dict) -> None:
    """`run` trained until its STOP_AT-th loss, which raises as a kill would stop it."""
    real, calls = trainer.loss, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == STOP_AT:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "loss", dies)
    with pytest.raises(KeyboardInterrupt):
        loop.finetune_retrieval(**run)
    monkeypatch.setattr(trainer, "loss", real)
    assert [p.name for p in (Path(run["out_dir"]) / "checkpoints").iterdir()] == ["step-6"]


def assert_same_run(whole: Path, cut: Path) -> None:
    """The same loss at every step and the same weights, to 1e-6 (one process: in fact equal)."""
    losses = [[json.loads(line)["loss"] for line in (d / "steps.jsonl").read_text().splitlines()] for d in (whole, cut)]
    assert len(losses[0]) == 8 and losses[1] == pytest.approx(losses[0], abs=1e-6, rel=0)
    a, b = load_file(whole / "model.safetensors"), load_file(cut / "model.safetensors")
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert not (cut / "checkpoints").exists()


EMBED_CASES = {
    "mnrl": {},
    # GradCache replays each mini-batch's dropout; LoRA's adapters are saved apart from the base.
    "cached-mnrl+lora+matryoshka": {"loss": "cached-mnrl", "mini_batch_size": 3, "matryoshka_dims": [32, 16],
                                    "lora": "r=2,alpha=4,dropout=0.1,targets=query,value"},
}


@pytest.mark.parametrize("case", EMBED_CASES)
def test_embed_stopped_and_resumed_is_the_whole_run(data, tmp_path, monkeypatch, case, caplog):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    loop.finetune_retrieval(**settings(data, whole, "embed", **EMBED_CASES[case]))
    stopped(biencoder, monkeypatch, settings(data, cut, "embed", **EMBED_CASES[case]))
    with pytest.raises(FileExistsError, match="--resume"):
        loop.finetune_retrieval(**settings(data, cut, "embed", **EMBED_CASES[case]))
    caplog.set_level("INFO")
    loop.finetune_retrieval(**settings(data, cut, "embed", resume=True, **EMBED_CASES[case]))
    assert "resuming from" in caplog.text and "(step 6 of 8)" in caplog.text
    assert "newly initialised" not in caplog.text  # a resumed LoRA run's adapters come from its state
    assert_same_run(whole, cut)


def test_margin_mse_resumes_on_the_teacher_scores_it_cached(data, tmp_path, monkeypatch):
    """A teacher's scores are computed once, by the stopped run; the resumed one reads them back."""
    import importlib

    classify = importlib.import_module("bertkit.inference.classify")  # the module, not its namesake function
    teacher = {"loss": "margin-mse", "teacher": str(data["cross"])}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    loop.finetune_retrieval(**settings(data, whole, "embed", **teacher))
    stopped(biencoder, monkeypatch, settings(data, cut, "embed", **teacher))
    assert (cut / "teacher_scores.json").is_file()

    def scores_again(*args, **kwargs):
        raise AssertionError("the teacher scored the rows again")

    monkeypatch.setattr(classify, "logits", scores_again)
    loop.finetune_retrieval(**settings(data, cut, "embed", resume=True, **teacher))
    assert_same_run(whole, cut)


def test_rerank_stopped_and_resumed_draws_the_same_negatives(data, tmp_path, monkeypatch):
    """Each epoch draws 2 negatives a query from its own and BM25's: the resumed run draws epoch 2's
    as the whole run did (its generator replayed through epoch 1)."""
    mined = {"negatives": 2, "mine": "bm25", "mine_depth": 8}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    loop.finetune_retrieval(**settings(data, whole, "rerank", **mined))
    stopped(crossencoder, monkeypatch, settings(data, cut, "rerank", **mined))
    loop.finetune_retrieval(**settings(data, cut, "rerank", resume=True, **mined))
    assert_same_run(whole, cut)


def test_a_resume_that_cannot_continue_the_run_is_refused(data, tmp_path, monkeypatch):
    train = tmp_path / "train.jsonl"
    train.write_text(data["train"].read_text(encoding="utf-8"), encoding="utf-8")
    cut = tmp_path / "cut"
    stopped(biencoder, monkeypatch, {**settings(data, cut, "embed"), "train": str(train)})
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0.001 → 0.002.*--overwrite"):
        loop.finetune_retrieval(**{**settings(data, cut, "embed", resume=True), "train": str(train), "lr": 2e-3})
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        loop.finetune_retrieval(**settings(data, cut, "embed", resume=True, overwrite=True))
    # The same file, one row changed since: epoch 2 is not the one the state was written in.
    train.write_text(train.read_text(encoding="utf-8").replace('"query": "', '"query": "big ', 1), encoding="utf-8")
    with pytest.raises(ValueError, match=r"trained on another epoch 2 than .* gives now.*--overwrite"):
        loop.finetune_retrieval(**{**settings(data, cut, "embed", resume=True), "train": str(train)})
    done = tmp_path / "done"
    loop.finetune_retrieval(**settings(data, done, "embed", epochs=1))
    with pytest.raises(ValueError, match="finished run .* nothing to resume. Pass --overwrite"):
        loop.finetune_retrieval(**settings(data, done, "embed", epochs=1, resume=True))
