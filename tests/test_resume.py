"""Exact resume: a run killed with SIGKILL mid-training and resumed repeats an uninterrupted run's
per-step losses bit for bit (CPU, fixed seed, dropout on)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertkit.train import state
from bertkit.train.pretrain import PretrainConfig, pretrain

from pretrain_fixtures import call_cli, cli_command, cli_env, make_data, one_thread, write_model_config  # noqa: F401
from sigkill import kill_when

STEPS, SAVE_EVERY = 40, 10


pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("resume")
    return make_data(root), write_model_config(root / "config.json")


def run_args(data_dir: Path, model_json: Path, out: Path) -> list[str]:
    # Dropout stays on (config default 0.1): resuming must restore the RNG, not just the weights.
    return ["pretrain", "--data", str(data_dir), "--out", str(out), "--model", str(model_json),
            "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--log-every", "1",
            "--eval-every", "20", "--eval-batches", "1", "--batch-size", "16", "--lr", "3e-3",
            "--num-workers", "1", "--seed", "7", "--no-progress",
            # Fixed: "auto" measures the machine, and two runs of a busy one may rank close rates
            # differently; the comparison is about data order and RNG, not precision.
            "--precision", "fp32"]


def records(run_dir: Path, split: str) -> dict[int, dict]:
    return {r["step"]: r for r in state.read_metrics(run_dir) if r["split"] == split}


def last_logged_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)


def test_sigkill_then_resume_repeats_the_uninterrupted_losses(inputs, tmp_path):
    data_dir, model_json = inputs
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    # The reference and the resumed run in this process (one thread, as the killed one): only the
    # kill needs a process of its own, and what it leaves on disk is all the resume can read.
    call_cli(*run_args(data_dir, model_json, reference))

    # Start the same run and SIGKILL it (its whole process group: the DataLoader worker too) once
    # it is past its first checkpoint.
    kill_when(cli_command(*run_args(data_dir, model_json, interrupted)), cli_env(),
              lambda: last_logged_step(interrupted) >= SAVE_EVERY + 2)
    killed_at = last_logged_step(interrupted)
    assert killed_at < STEPS, "the kill came too late to test anything"
    saved = [step for step, _ in state.list_checkpoints(interrupted)]
    assert saved and max(saved) < killed_at
    # A kill during a save leaves a partial directory; resume must ignore and remove it.
    partial = interrupted / "checkpoints" / f".tmp-step-{max(saved) + SAVE_EVERY}"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes(b"torn")

    result = call_cli(*run_args(data_dir, model_json, interrupted), "--resume")
    assert f"resuming from {interrupted / 'checkpoints' / f'step-{max(saved)}'}" in result.stderr
    assert not partial.exists()

    expected, got = records(reference, "train"), records(interrupted, "train")
    assert sorted(got) == list(range(1, STEPS + 1))  # every step exactly once, none duplicated
    for step in range(1, STEPS + 1):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm", "lr"):
            assert got[step][key] == expected[step][key], (step, key)
    assert records(interrupted, "eval").keys() == records(reference, "eval").keys()
    for step, record in records(reference, "eval").items():
        assert records(interrupted, "eval")[step]["loss"] == record["loss"]
    ref_weights = (reference / "model" / "model.safetensors").read_bytes()
    assert (interrupted / "model" / "model.safetensors").read_bytes() == ref_weights


def settings(data_dir, model_json, out, **kw) -> PretrainConfig:
    base = dict(data=str(data_dir), out=str(out), model=str(model_json), max_steps=6, save_every=3,
                batch_size=16, log_every=1, eval_every=100, progress=False, num_workers=0)
    return PretrainConfig(**{**base, **kw})


def test_resume_in_process_and_when_complete(inputs, tmp_path):
    data_dir, model_json = inputs
    full = pretrain(settings(data_dir, model_json, tmp_path / "full"))
    # A crash after step 3's checkpoint, emulated: a finished run loses its newest checkpoint; its
    # metrics still list steps 4-6, which the resumed run must replace, not duplicate.
    pretrain(settings(data_dir, model_json, tmp_path / "cut"))
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-6")
    resumed = pretrain(settings(data_dir, model_json, tmp_path / "cut", resume=True))
    assert resumed["steps"] == 6 and resumed["tokens_seen"] == full["tokens_seen"]
    assert records(tmp_path / "cut", "train").keys() == set(range(1, 7))
    for step, record in records(tmp_path / "full", "train").items():
        assert records(tmp_path / "cut", "train")[step]["loss"] == record["loss"], step
    # Resuming a finished run does nothing and says so.
    again = pretrain(settings(data_dir, model_json, tmp_path / "cut", resume=True))
    assert again["steps"] == 6
    assert len(records(tmp_path / "cut", "train")) == 6


def test_resume_refuses_changed_settings(inputs, tmp_path):
    data_dir, model_json = inputs
    pretrain(settings(data_dir, model_json, tmp_path / "run", max_steps=3))
    with pytest.raises(ValueError, match=r"cannot resume .*lr: 0.0005 → 0.001"):
        pretrain(settings(data_dir, model_json, tmp_path / "run", max_steps=3, lr=1e-3, resume=True))
    # Operational settings may change.
    pretrain(settings(data_dir, model_json, tmp_path / "run", max_steps=3, log_every=2, resume=True))


def test_resume_without_checkpoint_starts_fresh(inputs, tmp_path):
    data_dir, model_json = inputs
    summary = pretrain(settings(data_dir, model_json, tmp_path / "new", max_steps=2, resume=True))
    assert summary["steps"] == 2


def test_time_limit_stops_cleanly_and_resume_finishes(inputs, tmp_path):
    data_dir, model_json = inputs
    first = pretrain(settings(data_dir, model_json, tmp_path / "run", time_limit=1e-6))
    assert first["stopped"] == "time_limit" and first["steps"] == 1
    assert [step for step, _ in state.list_checkpoints(tmp_path / "run")] == [1]
    rest = pretrain(settings(data_dir, model_json, tmp_path / "run", resume=True))
    assert rest["stopped"] is None and rest["steps"] == 6
    pretrain(settings(data_dir, model_json, tmp_path / "full"))
    assert records(tmp_path / "run", "train")[6]["loss"] == records(tmp_path / "full", "train")[6]["loss"]


def test_resume_keeps_the_precision_auto_chose(inputs, tmp_path, monkeypatch):
    """"auto" is measured; a resumed run measuring the other way must keep the checkpoint's."""
    from bertkit.train.pretrain import trainer as module

    data_dir, model_json = inputs
    monkeypatch.setattr(module, "resolve_precision", lambda requested, device: "fp32")
    first = pretrain(settings(data_dir, model_json, tmp_path / "run"))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-6")
    monkeypatch.setattr(module, "resolve_precision", lambda requested, device: "bf16")
    resumed = pretrain(settings(data_dir, model_json, tmp_path / "run", resume=True))
    assert first["precision"] == resumed["precision"] == "fp32"
