"""Data-parallel pre-training: `torchrun --nproc_per_node=2` (gloo on CPU) follows the same losses as
one process with the same global batch, and resumes the same way."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.train import state

from pretrain_fixtures import cli_command, cli_env, make_data, one_thread, train_losses, write_model_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 5
# Per-step loss tolerance between 2 × 8 rows and 1 × 16 rows, in fp32. The loss is normalised over
# the whole global batch, so both compute the same function; only the float summation order differs
# (gradient all-reduce, matmuls over 8 vs 16 rows): measured ≤ 5e-7 over 5 AdamW steps. (In bf16
# the same comparison drifts by ~1e-4: rounding to 8 bits of mantissa amplifies the order effects.)
TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ddp")
    # Dropout off: two ranks draw their own dropout masks, which cannot match one process's.
    model_json = write_model_config(root / "config.json", hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)
    return make_data(root), model_json


def args(data_dir: Path, model_json: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--data", str(data_dir), "--out", str(out), "--model", str(model_json),
            "--max-steps", str(STEPS), "--batch-size", "16", "--lr", "3e-3", "--log-every", "1",
            "--eval-every", str(STEPS), "--eval-batches", "2", "--save-every", "3",
            "--precision", "fp32", "--num-workers", "0", "--no-progress", *extra]


def torchrun(*cli_args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "bertkit.cli", *cli_args]
    result = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_two_processes_match_one(inputs, tmp_path):
    data_dir, model_json = inputs
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    subprocess.run(cli_command(*args(data_dir, model_json, single)), env=cli_env(), check=True,
                   capture_output=True, timeout=120)
    result = torchrun(*args(data_dir, model_json, ddp))
    assert "(2 processes × 1 micro-batches)" in result.stderr

    one, two = train_losses(single), train_losses(ddp)
    assert sorted(two) == list(range(1, STEPS + 1))  # rank 0 alone wrote, once per step
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=TOLERANCE), (step, one, two)
    # Both processes read their own half: the tokens counted are the whole global batch.
    single_records = {r["step"]: r for r in state.read_metrics(single)}
    ddp_records = {r["step"]: r for r in state.read_metrics(ddp)}
    assert ddp_records[STEPS]["tokens_seen"] == single_records[STEPS]["tokens_seen"]
    held_out = [r for r in state.read_metrics(ddp) if r["split"] == "eval"]
    assert len(held_out) == 1
    ckpt = state.load_trainer_state(state.latest_checkpoint(ddp))
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2

    # Resume under DDP works the same: drop the last checkpoint and continue from step 3.
    shutil.rmtree(ddp / "checkpoints" / f"step-{STEPS}")
    result = torchrun(*args(data_dir, model_json, ddp, "--resume"))
    assert "resuming from" in result.stderr
    resumed = train_losses(ddp)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in resumed:
        assert resumed[step] == pytest.approx(two[step], abs=1e-6), step
