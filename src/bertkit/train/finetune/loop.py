"""The fine-tuning run: epochs of AdamW steps, evaluation after each, the best epoch saved, exact resume.

Every `save_every` steps and after every epoch a training state (weights, optimizer, schedule, the
batch order's generator, every rank's torch / Python / NumPy RNG states, the epoch's running
loss, the epoch records) is written atomically to OUT_DIR/checkpoints/step-N by `train.state.save_checkpoint`
(only the newest is kept). `resume=True` continues from it: a run killed at any moment, even by
SIGKILL, and resumed repeats the uninterrupted run's per-step losses. The state is removed once
the run has finished.

Under `torchrun` every rank runs this loop on its slice of each batch (`train.parallel`: the
same updates as one process with the whole batch); rank 0 alone evaluates and writes OUT_DIR.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from bertkit.backend.precision import autocast, resolve_precision
from bertkit.constants import FINETUNE_CONFIG as CONFIG_FILE
from bertkit.constants import IGNORE_INDEX
from bertkit.data import labelled
from bertkit.data.formats.common import pad_batch
from bertkit.encoder.config import PRESETS, BertConfig
from bertkit.train import health, lora, optim, parallel
from bertkit.train import state as train_state
from bertkit.train.card import finetune_card
from bertkit.train.finetune.config import FinetuneConfig
from bertkit.train.finetune.setup import (
    EVAL_FILE,
    METRICS_FILE,
    STEPS_FILE,
    build_model,
    load_best,
    load_tokenizer,
    save_model,
    start_out_dir,
)
from bertkit.train.finetune.task import Task
from bertkit.train.optim import default_lr
from bertkit.util import distributed
from bertkit.util.distributed import DistInfo
from bertkit.util.fileio import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)

# Files a run writes into OUT_DIR; an existing one is only replaced with `overwrite`.
RUN_OUTPUTS = ("config.json", "model.safetensors", CONFIG_FILE, METRICS_FILE, EVAL_FILE, STEPS_FILE,
               train_state.CHECKPOINTS)
# Settings that may change when a run is resumed: they do not alter the sequence of updates.
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "eval_batch_size", "save_every",
                     "out_dir"}


def train_labelled(config: FinetuneConfig, task_class: type[Task]) -> dict[str, Any]:
    """Run one fine-tuning on labelled data (see the module docstring), `task_class` reading,
    labelling and scoring them; returns eval.json's content."""
    # Fail before any work; create OUT only once the inputs are good.
    out = train_state.check_run_outputs(config.out_dir, RUN_OUTPUTS, overwrite=config.overwrite, resume=config.resume)
    # Under torchrun: joining the group waits for every rank, so all have checked OUT before rank 0 writes.
    info = distributed.init_distributed(config.device)
    parallel.check_batch_size(config.batch_size, info)
    tokenizer = load_tokenizer(config)
    task = task_class(config, tokenizer)

    builtin = labelled.resolve_builtin(config.train)
    if builtin and builtin[1] == "train":  # a built-in set brings its own dev and test splits
        config.eval = config.eval or f"{labelled.BUILTIN_PREFIX}{builtin[0]}:dev"
        config.test = config.test or f"{labelled.BUILTIN_PREFIX}{builtin[0]}:test"
    train, train_report = task.read(config.train, training=True)
    if config.max_train_examples:
        train = train[:config.max_train_examples]
    evaluation = task.read(config.eval, training=False) if config.eval else None
    test = task.read(config.test, training=False) if config.test else None

    known = None
    if config.model not in PRESETS and (Path(config.model) / "config.json").is_file():
        known = BertConfig.from_json(config.model).label2id
    label_overrides = task.setup_labels(train, known)
    model = build_model(config.task, config.model, task.pieces.vocab_size, label_overrides, config.seed)
    if config.lr is None:  # stored resolved in finetune_config.json: a resume compares it
        config.lr = default_lr(model.config.hidden_size)
        log.info("lr %g: the default for hidden size %d (pass --lr to choose)", config.lr,
                 model.config.hidden_size)
    limit = model.config.max_sequence_length  # RoBERTa: 514 positions hold 512 tokens
    if config.max_length > limit:
        raise ValueError(f"max_length {config.max_length} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings {model.config.max_position_embeddings}); pass "
                         f"--max-length {limit} (longer inputs go through windows)")
    features = task.train_features(train, config.train)
    if not features:
        raise ValueError(f"{config.train}: no training features could be made")
    for name, data in ((config.eval, evaluation), (config.test, test)):
        if data is not None:  # unknown labels fail now, not after an epoch of training
            task.check_labels(data[0], name)

    total_steps = math.ceil(len(features) / config.batch_size) * config.epochs
    early = health.step_warning(total_steps, examples=len(features), batch_size=config.batch_size,
                                epochs=config.epochs)
    if early:
        log.warning("warning: %s", early)

    device = info.device
    # "auto" measures the machine; every rank must compute alike, so rank 0's choice is the run's.
    precision = distributed.broadcast_object(resolve_precision(config.precision, device), info)
    model.to(device)
    if config.freeze_encoder:
        for param in model.bert.parameters():
            param.requires_grad_(False)
    lora_report = None
    if config.lora:
        lora_report = lora.apply_lora(model, lora.LoraSpec.parse(config.lora))
        log.info("%s", lora_report.summary())

    resume_from = resume_point(config, out)
    distributed.barrier(info)  # every rank has read OUT's training state before rank 0 writes
    if info.is_main:
        if resume_from is None:
            start_out_dir(out)
            save_model(model, out, config)  # config and initial weights first, so the directory is complete
            tokenizer.save_pretrained(out)
        atomic_write_json(out / CONFIG_FILE, config.to_dict())
    reports = {"precision": precision, "train": train_report.to_dict(), "train_examples": len(train),
               "train_features": len(features), **task.notes}
    if evaluation is not None:
        reports["eval"] = evaluation[1].to_dict()
    if test is not None:
        reports["test"] = test[1].to_dict()
    if lora_report is not None:
        reports["lora"] = lora_report.to_dict()
    for report in (train_report, evaluation and evaluation[1], test and test[1]):
        if report and report.n_skipped:
            log.warning("%s", report.summary())

    state = RunState()
    metric, higher = task.main_metric()
    started = time.time()
    try:
        reports["precision"] = train_epochs(config, task, model, features, evaluation, out, state, metric,
                                      higher, info, precision, resume_from)
        precision = reports["precision"]
    except BaseException as err:
        if not info.is_main:
            raise
        failure = summary_of(config, state, metric, reports, started,
                           status="interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                           error=f"{type(err).__name__}: {err}")
        latest = train_state.latest_checkpoint(out)
        if latest is not None:  # say how to continue, not only what was lost
            failure["resume"] = (f"a training state is saved in {latest}; run the same command "
                                 "with --resume to continue from it")
        atomic_write_json(out / EVAL_FILE, failure)
        raise
    summary = summary_of(config, state, metric, reports, started, status="done")
    if info.world_size > 1:
        summary["processes"] = info.world_size
    if not info.is_main:  # rank 0 scores the test set and writes the results
        return summary
    if test is not None:
        best = load_best(model, out, config, label_overrides).to(device)
        with autocast(device, precision):
            summary["test"] = task.evaluate(best, test[0], config.test)
    summary["warnings"] = run_warnings(config, task, model.config, summary, early)
    for warning in summary["warnings"][1 if early else 0:]:
        log.warning("warning: %s", warning)
    atomic_write_json(out / EVAL_FILE, summary)
    finetune_card(out)  # README.md, from the files just written
    # Finished: the training state (weights + optimizer, 3× the model) is no longer needed.
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)
    return summary


def resume_point(config: FinetuneConfig, out: Path) -> Path | None:
    """The training state to continue from (with `resume`), after checking the settings match."""
    if not config.resume:
        return None
    eval_file = out / EVAL_FILE
    if train_state.latest_checkpoint(out) is None and eval_file.is_file():
        if json.loads(eval_file.read_text(encoding="utf-8")).get("status") == "done":
            raise ValueError(f"{out} holds a finished run (eval.json status done); nothing to resume. "
                             "Pass --overwrite to train it again, or choose another --out")
    return train_state.resume_checkpoint(out, config.to_dict(), out / CONFIG_FILE, RESUMABLE_CHANGES)


def features_digest(features: Sequence[dict]) -> str:
    """Fingerprint of the training features, stored in a training state: a resume must train on
    exactly the same inputs (the data file or the tokenizer may have changed since)."""
    digest = hashlib.sha256()
    for feature in features:
        digest.update(json.dumps(feature, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def train_epochs(config: FinetuneConfig, task: Task, model: nn.Module, features: list[dict], evaluation,
           out: Path, state: RunState, metric: str, higher: bool, info: DistInfo,
           precision: str, resume_from: Path | None = None) -> str:
    """The epochs of a run (continued from `resume_from`'s training state if given); returns the
    precision trained in (a resumed run keeps its state's). Under torchrun each rank runs its
    slice of every batch (`train.parallel`); rank 0 alone writes and evaluates."""
    from tqdm.auto import tqdm

    device, main = info.device, info.is_main

    rng = random.Random(config.seed)  # the batch order; dropout draws from torch's generator
    steps_per_epoch = math.ceil(len(features) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    trainable = [p for p in model.parameters() if p.requires_grad]
    digest = features_digest(features)
    steps_log = train_state.MetricsLog(out, STEPS_FILE)
    step, first_epoch, skip, loss_sum, n_batches, seconds = 0, 1, 0, 0.0, 0, 0.0
    if resume_from is not None:
        saved = train_state.load_trainer_state(resume_from)
        if saved.get("features_digest") != digest:
            raise ValueError(f"{resume_from} was trained on other inputs than {config.train} gives now "
                             "(the file or the tokenizer changed); resume with the original data, "
                             "or start over with --overwrite")
        lora.load_weights(model, resume_from)
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["scheduler"])
        step, first_epoch, skip = int(saved["step"]), int(saved["epoch"]), int(saved["batch_in_epoch"])
        loss_sum, n_batches, seconds = float(saved["loss_sum"]), int(saved["n_batches"]), float(saved["seconds"])
        version, internal, gauss = saved["order_rng"]
        rng.setstate((version, tuple(internal), gauss))
        run = json.loads(saved["run"])
        state.records, state.best, state.best_epoch = run["records"], run["best"], run["best_epoch"]
        state.best_eval, state.stopped_early = run["best_eval"], run["stopped_early"]
        precision = saved.get("precision", precision)
        parallel.restore_rank_rng(saved, info)
        if main:
            steps_log.truncate_after(step)  # a killed run wrote some after its last state
            log.info("resuming from %s (step %d of %d, epoch %d)", resume_from, step, total, first_epoch)
    else:
        parallel.seed_dropout(config.seed, info)
    engine = parallel.data_parallel(model, info)

    def save(epoch: int, position: int, order_rng) -> None:
        """The training state before micro-step `position` of `epoch` (whose batch order
        `order_rng` regenerates)."""
        run = {"records": state.records, "best": state.best, "best_epoch": state.best_epoch,
               "best_eval": state.best_eval, "stopped_early": state.stopped_early}
        rngs = parallel.rank_rng_states(info)  # every rank calls: dropout streams are per rank
        if not main:
            return
        train_state.save_checkpoint(out, step, model, None, {
            "format": 1, "step": step, "epoch": epoch, "batch_in_epoch": position,
            "loss_sum": loss_sum, "n_batches": n_batches, "seconds": seconds,
            "order_rng": order_rng, "optimizer": optimizer.state_dict(),
            "scheduler": schedule.state_dict(), "rng": rngs[0], "rank_rngs": rngs,
            "precision": precision, "features_digest": digest,
            "run": json.dumps(run)},  # plain JSON text: loads with weights_only=True
            keep=1, write_model=lora.save_weights, publish=False)  # a LoRA model: base and adapters apart

    if state.stopped_early:
        first_epoch = config.epochs + 1
    for epoch in range(first_epoch, config.epochs + 1):
        model.train()
        tick = time.time()
        if epoch != first_epoch or resume_from is None:
            loss_sum, n_batches, seconds, skip = 0.0, 0, 0.0, 0
        epoch_rng = rng.getstate()  # regenerates this epoch's order on resume
        batches = shuffled_batches(features, config.batch_size, rng)
        bar = tqdm(batches[skip:], desc=f"epoch {epoch}/{config.epochs}", initial=skip,
                   total=len(batches), unit="batch", disable=not (config.progress and main), dynamic_ncols=True)
        for position, batch_index in enumerate(bar, start=skip):
            part = parallel.shard(batch_index, info)
            batch = rank_batch(features, batch_index, part, task.pieces.pad_id)
            lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
            with autocast(device, precision):
                loss = engine(partial(head_loss, batch={k: v.to(device) for k, v in batch.items()}))
            loss = parallel.share(loss, part, loss_terms(features, part.rows), loss_terms(features, batch_index))
            loss_value = parallel.global_loss(loss, info)
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"the loss became {loss_value} at step {step + 1} (epoch "
                                         f"{epoch}); lower --lr. The best model so far is in {out}")
            parallel.for_backward(loss, info).backward()
            if config.max_grad_norm:
                nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum += loss_value
            n_batches += 1
            if main:
                steps_log.write({"step": step, "epoch": epoch, "loss": loss_value, "lr": lr})
            bar.set_postfix(loss=f"{loss_sum / n_batches:.4f}")
            if step % config.save_every == 0 and position + 1 < len(batches):
                seconds += time.time() - tick  # this session's share of the epoch so far
                tick = time.time()
                save(epoch, position + 1, epoch_rng)
        bar.close()
        seconds += time.time() - tick
        record = {"epoch": epoch, "step": step, "train_loss": loss_sum / max(1, n_batches),
                  "lr": schedule.get_last_lr()[0], "train_seconds": round(seconds, 2)}
        if evaluation is not None:
            scores = None
            if main:
                with autocast(device, precision):
                    scores = task.evaluate(model, evaluation[0], config.eval)
            scores = distributed.broadcast_object(scores, info)  # every rank picks the same best epoch
            record["eval"] = scores
            value = scores.get(metric)
        else:
            value = -record["train_loss"] if higher else record["train_loss"]  # no eval set: latest
        if evaluation is None or improved(value, state.best, higher):
            state.best, state.best_epoch = value, epoch
            state.best_eval = record.get("eval")
            if main:
                save_model(model, out, config)  # atomic per file; the config does not change between epochs
            record["saved"] = True
        state.records.append(record)
        if main:
            atomic_write_text(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in state.records))
            log.info("epoch %d: %s", epoch, json.dumps(record))
        if config.patience and state.best_epoch is not None and epoch - state.best_epoch >= config.patience:
            state.stopped_early = True
        loss_sum, n_batches, seconds = 0.0, 0, 0.0
        save(epoch + 1, 0, rng.getstate())  # after the epoch's record and best model
        if state.stopped_early:
            break
    return precision


def rank_batch(features: Sequence[dict], batch_index: Sequence[int], part: parallel.Shard, pad_id: int
               ) -> dict[str, torch.Tensor]:
    """This rank's rows of the global batch `batch_index`, padded (B_r, T) to the whole batch's
    width T as one process pads it: QA's loss is a softmax over every position, padding included
    (as the reference's), so its value depends on the width."""
    width = max(len(features[i]["input_ids"]) for i in batch_index)
    return pad_batch([features[i] for i in part.rows], pad_id, width)


def head_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The head's own loss of a padded batch, () float: a mean over the batch's terms."""
    return model(**batch).loss


def loss_terms(features: Sequence[dict], rows: Sequence[int]) -> int:
    """The terms a head's loss averages over in `rows`: the labelled tokens of a token task (NER;
    -100 = ignored), the label entries of a multi-label row, else one per row (classify, pair,
    regression, qa)."""
    count = 0
    for i in rows:
        labels = features[i].get("labels")
        count += sum(1 for x in labels if x != IGNORE_INDEX) if isinstance(labels, (list, tuple)) else 1
    return count


def summary_of(config: FinetuneConfig, state: RunState, metric: str, reports: dict, started: float,
             *, status: str, error: str | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": status,
        "task": config.task,
        "model": config.model,
        "metric": metric,
        "best_epoch": state.best_epoch,
        "eval": state.best_eval,
        "epochs_run": len(state.records),
        "train_loss": state.records[-1]["train_loss"] if state.records else None,  # the last epoch's mean
        "stopped_early": state.stopped_early,
        "seconds": round(time.time() - started, 2),
        "data": reports,
    }
    if error:
        summary["error"] = error
        summary["saved_model"] = (f"epoch {state.best_epoch}" if state.best_epoch
                                  else "initial weights only (no epoch finished)")
    return summary


def run_warnings(config: FinetuneConfig, task: Task, model_config: BertConfig, summary: dict[str, Any],
                 early: str | None) -> list[str]:
    """What `train.health` finds in a finished run: too few steps, a loss still at the task's
    chance, a score no better than its trivial predictor's (the majority label; no entity found)."""
    found = [early, health.loss_warning(summary.get("train_loss"), task.chance_loss(config, model_config))]
    for split in ("eval", "test"):
        found.append(task.baseline(summary.get(split) or {}, summary.get("metric"), split))
    return health.collect(*found)


def shuffled_batches(features: Sequence[dict], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of feature indices, similar lengths together.

    Features are shuffled, cut into pools of 50 batches, sorted by length within a pool and the
    batches shuffled again: padding shrinks while every epoch still sees a new order.
    """
    order = list(range(len(features)))
    rng.shuffle(order)
    pool = batch_size * 50
    batches = []
    for lo in range(0, len(order), pool):
        chunk = sorted(order[lo:lo + pool], key=lambda i: len(features[i]["input_ids"]))
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def improved(value: float | None, best: float | None, higher_is_better: bool) -> bool:
    if value is None or math.isnan(value):
        return False
    if best is None:
        return True
    return value > best if higher_is_better else value < best


@dataclass
class RunState:
    records: list[dict] = field(default_factory=list)
    best: float | None = None
    best_epoch: int | None = None
    best_eval: dict | None = None
    stopped_early: bool = False
