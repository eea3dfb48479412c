"""The pre-training loop: it learns, it overfits one batch, its checkpoints load elsewhere, it fails
clearly on bad input, and it never saves a diverged model."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from bertkit.train import state
from bertkit.train.pretrain import PretrainConfig, Trainer, TrainingDiverged, pretrain
from bertkit.util.distributed import DistInfo

from pretrain_fixtures import make_data, one_thread, run_cli, train_losses, write_model_config  # noqa: F401

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("pretrain-data"))


@pytest.fixture(scope="module")
def model_json(tmp_path_factory) -> Path:
    return write_model_config(tmp_path_factory.mktemp("model") / "config.json")


def settings(data_dir, out, model_json, **kw) -> PretrainConfig:
    base = dict(data=str(data_dir), out=str(out), model=str(model_json), batch_size=16, lr=3e-3,
                log_every=5, eval_every=10, eval_batches=2, save_every=10, progress=False,
                num_workers=0, seed=3)
    base.update(kw)
    return PretrainConfig(**base)


@pytest.fixture(scope="module")
def trained_run(data_dir, model_json, tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    summary = pretrain(settings(data_dir, run_dir, model_json, max_steps=40, num_workers=1))
    return run_dir, summary


def test_a_few_steps_lower_the_loss(trained_run):
    run_dir, summary = trained_run
    losses = train_losses(run_dir)
    assert sorted(losses) == [5, 10, 15, 20, 25, 30, 35, 40]
    # ln(120) + ln(2) ≈ 5.5 at the start; seeded, so the 0.5 margin is not luck (drop seen ≈ 0.76).
    assert losses[40] < losses[5] - 0.5, losses
    records = state.read_metrics(run_dir)
    held_out = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in held_out] == [10, 20, 30, 40]
    assert held_out[-1]["mlm_loss"] < held_out[0]["mlm_loss"] - 0.2, held_out
    first = records[0]
    for key in ("step", "loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "lr",
                "grad_norm", "tokens_per_s", "elapsed"):
        assert first[key] is not None, key
    assert summary["steps"] == 40 and summary["tokens_seen"] > 0
    assert summary["eval"]["mlm_accuracy"] == held_out[-1]["mlm_accuracy"]


def test_run_directory_layout(trained_run, data_dir):
    run_dir, _ = trained_run
    saved = json.loads((run_dir / "pretrain_config.json").read_text())
    assert set(saved) == set(PretrainConfig.__dataclass_fields__)
    assert [step for step, _ in state.list_checkpoints(run_dir)] == [30, 40]  # keep=2
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    model_dir = run_dir / "model"
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (model_dir / name).is_file(), name
    assert not (model_dir / "trainer_state.pt").exists()
    config = json.loads((model_dir / "config.json").read_text())
    assert config["vocab_size"] == json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    trainer_state = state.load_trainer_state(run_dir / "checkpoints" / "step-40")  # weights_only
    assert trainer_state["step"] == 40 and len(trainer_state["rng"]) == 1
    assert trainer_state["epoch"] * 1000 + trainer_state["batch_in_epoch"] >= 0


def test_checkpoint_gives_transformers_the_same_mlm_logits(trained_run, data_dir):
    transformers = pytest.importorskip("transformers")
    from bertkit.data.shards import PretrainingBatches, PretrainingData
    from bertkit.encoder.model import BertForPreTraining

    run_dir, _ = trained_run
    ours = BertForPreTraining.from_pretrained(run_dir / "model").eval()
    theirs = transformers.BertForPreTraining.from_pretrained(run_dir / "model").eval()
    batch = PretrainingBatches(PretrainingData(data_dir, "eval"), 8, seed=0, epoch=0)[0]
    with torch.no_grad():
        dense = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        ref = theirs(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"])
    real = batch["attention_mask"].bool()  # padding positions carry no meaning in either model
    torch.testing.assert_close(dense.mlm_logits[real], ref.prediction_logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dense.nsp_logits, ref.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    tok = transformers.BertTokenizerFast.from_pretrained(run_dir / "model")
    assert tok.mask_token == "[MASK]" and len(tok) == ours.config.vocab_size


def test_one_batch_can_be_overfit(data_dir, model_json, tmp_path):
    from bertkit.data.shards import PretrainingBatches

    config = settings(data_dir, tmp_path / "run", model_json, max_steps=80, lr=1e-2,
                      schedule="constant", warmup_steps=0,
                      model_overrides={"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    trainer = Trainer(config, SINGLE)
    batch = PretrainingBatches(trainer.data, 8, seed=0, epoch=0)[0]
    for _ in range(80):
        stats, grad_norm, _ = trainer._train_step(trainer.model, [batch])
        assert math.isfinite(grad_norm)
    mlm_loss, mlm_correct, mlm_count = stats[:3].tolist()
    assert mlm_loss / mlm_count < 0.05 and mlm_correct == mlm_count


def test_gradient_accumulation_matches_one_big_batch(data_dir, model_json, tmp_path):
    # The loss is normalised over the whole step, so 2 × 8 accumulated equals 16 at once.
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    runs = {}
    for accum in (1, 2):
        out = tmp_path / f"accum{accum}"
        pretrain(settings(data_dir, out, model_json, max_steps=4, log_every=1, grad_accum=accum,
                          precision="fp32", model_overrides=no_dropout))
        runs[accum] = train_losses(out)
    assert list(runs[1]) == [1, 2, 3, 4]
    for step in runs[1]:
        assert runs[2][step] == pytest.approx(runs[1][step], abs=2e-5), step


def test_no_nsp_data_trains_mlm_only(tmp_path, model_json):
    data = make_data(tmp_path / "mlm-only", nsp=False, n_docs=120)
    summary = pretrain(settings(data, tmp_path / "run", model_json, max_steps=3, log_every=1))
    assert summary["train"]["nsp_loss"] is None and summary["train"]["nsp_accuracy"] is None
    record = state.read_metrics(tmp_path / "run")[0]
    assert record["nsp_loss"] is None and record["loss"] == pytest.approx(record["mlm_loss"])


def test_non_finite_steps_are_skipped_then_stop_without_saving(data_dir, model_json, tmp_path,
                                                               monkeypatch, caplog):
    from safetensors.torch import load_file

    from bertkit.encoder.model import BertForPreTraining

    original = BertForPreTraining.forward
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        # Training steps 2 and 6, 7, 8, ... produce a non-finite loss.
        out = original(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 2 or calls["n"] >= 6:
                out.mlm_loss = out.mlm_loss * float("nan")
        return out

    monkeypatch.setattr(BertForPreTraining, "forward", poisoned)
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="3 non-finite steps in a row"):
        pretrain(settings(data_dir, run_dir, model_json, max_steps=12, save_every=4, log_every=1,
                          eval_every=100, max_bad_steps=3))
    assert "step 2: non-finite loss or gradient" in caplog.text
    # Step 2 was skipped and training went on; it stopped at step 8, before saving step 8.
    assert set(train_losses(run_dir)) == {1, 3, 4, 5}
    assert [step for step, _ in state.list_checkpoints(run_dir)] == [4]
    weights = load_file(run_dir / "model" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert (run_dir / "model" / "model.safetensors").read_bytes() == (
        run_dir / "checkpoints" / "step-4" / "model.safetensors").read_bytes()


def test_save_refuses_a_non_finite_model(trained_run, tmp_path):
    from bertkit.encoder.model import BertForPreTraining

    run_dir, _ = trained_run
    model = BertForPreTraining.from_pretrained(run_dir / "model")
    with torch.no_grad():
        model.bert.layers[0].qkv.weight[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        state.save_checkpoint(tmp_path, 1, model, run_dir / "model", {"step": 1}, keep=1)
    assert state.list_checkpoints(tmp_path) == [] and not (tmp_path / "model").exists()


# ------------------------------------------------------------------------------ bad input
def test_existing_run_dir_needs_resume_or_overwrite(trained_run, data_dir, model_json):
    run_dir, _ = trained_run
    with pytest.raises(FileExistsError, match="--resume .* --overwrite"):
        pretrain(settings(data_dir, run_dir, model_json, max_steps=40))


def test_unknown_model_name(data_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown model 'minnie'"):
        pretrain(settings(data_dir, tmp_path / "run", "minnie", max_steps=1))


def test_missing_or_damaged_data(tmp_path, model_json, data_dir):
    with pytest.raises(FileNotFoundError, match="does not exist; make it with `bertkit prepare`"):
        pretrain(settings(tmp_path / "nowhere", tmp_path / "run", model_json, max_steps=1))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        pretrain(settings(tmp_path / "empty", tmp_path / "run", model_json, max_steps=1))


def test_init_checkpoint_with_another_tokenizer(trained_run, tmp_path, model_json):
    # Data prepared with a different vocabulary than the --init checkpoint's tokenizer.
    other = make_data(tmp_path / "other", vocab_size=150, seed=5)
    run_dir, _ = trained_run
    with pytest.raises(ValueError, match="prepared with"):
        pretrain(settings(other, tmp_path / "run", model_json, max_steps=1, init=str(run_dir / "model")))


def test_init_continues_from_a_checkpoint(trained_run, data_dir, model_json, tmp_path):
    run_dir, _ = trained_run
    summary = pretrain(settings(data_dir, tmp_path / "run", model_json, max_steps=5, log_every=5,
                                init=str(run_dir / "model")))
    # Starts where the first run ended, far below a fresh model's ~5.3.
    assert summary["train"]["loss"] < train_losses(run_dir)[5]


def test_unwritable_output_fails_before_training(data_dir, model_json, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError):
        pretrain(settings(data_dir, blocker / "run", model_json, max_steps=1))

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # Running as root, chmod cannot make a directory unwritable; simulate the refused write.
    monkeypatch.setattr(state, "atomic_path", denied)
    with pytest.raises(ValueError, match="not writable"):
        pretrain(settings(data_dir, tmp_path / "run", model_json, max_steps=1))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_too_little_disk_fails_before_training(data_dir, model_json, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(ValueError, match="free at .* checkpoints need about"):
        pretrain(settings(data_dir, tmp_path / "run", model_json, max_steps=1))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("change, message", [
    (dict(batch_size=15, grad_accum=2), "divisible by grad_accum 2"),
    (dict(max_steps=0), "max_steps must be an integer >= 1"),
    (dict(precision="fp16"), "precision must be one of"),
    (dict(max_steps=3, epochs=1.0), "either max_steps or epochs"),
    (dict(batch_size=4096), "fewer than one global batch"),
])
def test_bad_settings(data_dir, model_json, tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        pretrain(settings(data_dir, tmp_path / "run", model_json, **{"max_steps": 2, **change}))


# ------------------------------------------------------------------------------ command line
def test_cli_pretrain_and_plot(data_dir, model_json, tmp_path, capsys):
    run_dir = tmp_path / "cli-run"
    result = run_cli("pretrain", "--data", str(data_dir), "--out", str(run_dir), "--model",
                     str(model_json), "--max-steps", "4", "--batch-size", "8", "--log-every", "2",
                     "--eval-every", "4", "--eval-batches", "1", "--no-progress",
                     "--model-arg", "hidden_dropout_prob=0.05")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4
    assert json.loads((run_dir / "pretrain_config.json").read_text())["model_overrides"] == {
        "hidden_dropout_prob": 0.05}
    assert json.loads((run_dir / "model" / "config.json").read_text())["hidden_dropout_prob"] == 0.05
    # The other commands in-process: same parser and error handling, no interpreter start-up.
    from bertkit.cli import main

    assert main(["plot", str(run_dir)]) == 0
    png = run_dir / "curves.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main(["pretrain", "--data", str(data_dir), "--out", str(run_dir), "--max-steps", "4"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["pretrain", "--data", str(data_dir), "--out", str(tmp_path / "x"), "--model",
                 "huge"]) == 2
    assert "unknown model 'huge'" in capsys.readouterr().err
    assert main(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.skipif(not shutil.which("c++") and not shutil.which("g++"),
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_layers_train_like_eager(data_dir, model_json, tmp_path):
    # Dropout on: the compiled layers draw the same random words, in the same order, as eager
    # (a version whose compiled graph merged two same-sized draws into one failed here).
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    from safetensors import safe_open

    losses, names = {}, {}
    for compiled in (False, True):
        out = tmp_path / f"compile-{compiled}"
        pretrain(settings(data_dir, out, model_json, max_steps=4, log_every=1, precision="fp32",
                          compile=compiled))
        losses[compiled] = train_losses(out)
        with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
            names[compiled] = sorted(f.keys())
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    for step in losses[False]:
        assert losses[True][step] == pytest.approx(losses[False][step], abs=1e-5), step
    assert names[True] == names[False]  # compiling in place leaves the checkpoint's names alone
