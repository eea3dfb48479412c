"""Exact resume of fine-tuning: a run killed with SIGKILL mid-epoch and resumed with --resume repeats
an uninterrupted run's per-step losses bit for bit (CPU, one thread, fixed seed, dropout on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertForPreTraining
from bertkit.train import finetune as ft
from bertkit.train import state
from bertkit.train.finetune import loop

from finetune_fixtures import sentiment_file
from pretrain_fixtures import call_cli, cli_command, cli_env, one_thread  # noqa: F401
from sigkill import kill_when

pytestmark = pytest.mark.usefixtures("one_thread")

EPOCHS, ROWS, BATCH, SAVE_EVERY = 3, 160, 8, 7  # 20 steps an epoch, 60 in all
@pytest.fixture(scope="module")
def inputs(tmp_path_factory, minilm_dir) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("finetune-resume")
    base = root / "base"
    torch.manual_seed(0)
    # Dropout stays on (BERT's 0.1): resuming must restore the RNG, not just the weights.
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522)).save_pretrained(base)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(base)
    return base, sentiment_file(root / "train.jsonl", ROWS, 1), sentiment_file(root / "dev.jsonl", 40, 2)


def run_args(inputs, out: Path) -> list[str]:
    base, train, dev = inputs
    return ["finetune", "--task", "classify", "--model", str(base), "--train", str(train),
            "--eval", str(dev), "--out", str(out), "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
            "--lr", "1e-3", "--max-length", "16", "--save-every", str(SAVE_EVERY), "--seed", "3",
            "--precision", "fp32", "--no-progress"]


def steps_of(out: Path) -> dict[int, dict]:
    lines = (out / ft.STEPS_FILE).read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def last_step(out: Path) -> int:
    path = out / ft.STEPS_FILE
    if not path.exists():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")),
               default=0)


def epochs_of(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / ft.METRICS_FILE).read_text().splitlines()]
    for record in records:
        record.pop("train_seconds")  # wall time: the only field allowed to differ
    return records


def test_sigkill_then_resume_repeats_the_uninterrupted_losses(inputs, tmp_path):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    # Every run but the killed one in this process (one thread, as the killed one): only the kill
    # needs a process of its own, and what it leaves on disk is all the resume can read.
    call_cli(*run_args(inputs, reference))
    assert not (reference / "checkpoints").exists()  # a finished run leaves no training state

    # Kill the same run mid-epoch 2, past the training states at steps 7, 14, 20 (epoch end), 21.
    kill_when(cli_command(*run_args(inputs, interrupted)), cli_env(),
              lambda: last_step(interrupted) >= 3 * SAVE_EVERY + 3, poll=0.002)
    killed_at = last_step(interrupted)
    assert killed_at < EPOCHS * ROWS // BATCH, "the kill came too late to test anything"
    saved = [step for step, _ in state.list_checkpoints(interrupted)]
    assert len(saved) == 1 and saved[0] < killed_at  # only the newest state is kept
    eval_json = json.loads((interrupted / "eval.json").read_text()) if (interrupted / "eval.json").exists() else {}
    assert eval_json.get("status") != "done"

    # Without --resume the directory is refused; with it the run continues.
    refused = call_cli(*run_args(inputs, interrupted), check=False)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    result = call_cli(*run_args(inputs, interrupted), "--resume")
    assert f"resuming from {interrupted / 'checkpoints' / f'step-{saved[0]}'}" in result.stderr

    expected, got = steps_of(reference), steps_of(interrupted)
    assert sorted(got) == list(range(1, EPOCHS * ROWS // BATCH + 1))  # every step once
    for step, record in expected.items():
        assert got[step] == record, step
    assert epochs_of(interrupted) == epochs_of(reference)
    assert (interrupted / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()
    assert json.loads((interrupted / "eval.json").read_text())["status"] == "done"
    assert not (interrupted / "checkpoints").exists()


def test_resume_refuses_other_settings_and_a_finished_run(inputs, tmp_path):
    base, train, dev = inputs
    out = tmp_path / "out"
    settings = dict(epochs=1, batch_size=BATCH, lr=1e-3, max_length=16, save_every=5, seed=3,
                    precision="fp32", progress=False)
    # A crash after step 10's training state, emulated: the run stops at step 12.
    calls = []

    def stop_after_12(*args, **kwargs):
        calls.append(1)
        if len(calls) > 12:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    original = loop.pad_batch
    loop.pad_batch = stop_after_12
    try:
        with pytest.raises(KeyboardInterrupt):
            ft.finetune("classify", base, train, out, eval_file=dev, **settings)
    finally:
        loop.pad_batch = original
    assert [s for s, _ in state.list_checkpoints(out)] == [10]
    crashed = json.loads((out / "eval.json").read_text())
    assert crashed["status"] == "interrupted" and "--resume" in crashed["resume"]
    with pytest.raises(ValueError, match=r"cannot resume .* \(lr: 0.001 → 0.002"):
        ft.finetune("classify", base, train, out, eval_file=dev, resume=True, **{**settings, "lr": 2e-3})
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        ft.finetune("classify", base, train, out, eval_file=dev, resume=True, overwrite=True, **settings)
    done = ft.finetune("classify", base, train, out, eval_file=dev, resume=True, **settings)
    assert done["status"] == "done" and sorted(steps_of(out)) == list(range(1, ROWS // BATCH + 1))
    with pytest.raises(ValueError, match="finished run .* nothing to resume"):
        ft.finetune("classify", base, train, out, eval_file=dev, resume=True, **settings)
