"""The one run of every retrieval trainer: the bi-encoder and the cross-encoder (embed, rerank:
`loop.py`), SPLADE (`train.sparse`) and ColBERT (`train.colbert`). Each trainer plugs its parts
into it (`Parts`); output checks, resume, torchrun sharding, training states, the step records,
saving, evaluation and the health checks are this module's, so a fix to any of them lands once.

    read the pairs → the trainer's model; its epochs drawn from the pairs (`Parts.epochs`: mined
      negatives, a teacher's scores, each epoch's order)
    → epochs of AdamW steps over batches of batch_size examples, the trainer's loss of each
    → the trainer saves the model and scores it on `eval`; steps.jsonl, eval.json, the health checks

Exact resume (every trainer: `Parts.resumable`): the epochs are drawn again in order, from the
start, whenever a run starts (SPLADE and ColBERT from `random.Random(f"{seed}:{epoch}")`,
`pair_epochs`; the bi-encoder and the cross-encoder from one generator seeded once, `loop.py`),
so a resumed run holds the epoch it was killed in as the whole run held it, and a teacher's
scores cached in OUT_DIR are read back, not computed again. A training state (weights, LoRA
adapters apart from their frozen base, optimizer, schedule, every rank's generators, the steps
so far, a digest of the epoch in progress) is written every `save_every` steps (`train.state`),
so `resume=True` continues with the batches, negatives and dropout draws the whole run would
have made. A resumed run may change only `RESUMABLE_CHANGES`; a finished run, or an epoch drawn
otherwise than the state's (other data), is refused.

Under torchrun (`train.parallel`, for a trainer with `Parts.torchrun`) each rank runs its slice of
every batch and rank 0 writes OUT_DIR and scores it; a trainer with `torchrun=False` runs as one
process wherever it is started.

What SPLADE's and ColBERT's settings share (`ResumableTrainConfig`, `check_settings`) and their
negatives (the row's own, then BM25's look-alikes: `mine_bm25`, `pair_epochs`) are here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from bertkit.constants import FINETUNE_CONFIG
from bertkit.train import health, parallel
from bertkit.train import state as train_state
from bertkit.train.card import drop_stale, finetune_card
from bertkit.train.optim import default_lr
from bertkit.train.retrieval.common import (
    BUILTIN_PREFIX,
    Pair,
    draw_negatives,
    optimizer_step,
    positive_int_problems,
    read_pairs,
    run_problems,
)
from bertkit.util import distributed
from bertkit.util.distributed import DistInfo
from bertkit.util.fileio import atomic_write_json, atomic_write_text, check_writable_output, model_directory

log = logging.getLogger(__name__)

OUTPUTS = ("config.json", "model.safetensors", FINETUNE_CONFIG, "eval.json", "steps.jsonl", "modules.json",
           train_state.CHECKPOINTS)
# Settings a resumed run may change: they do not alter the sequence of updates.
# out_dir: the run read back is the directory's, however its path is spelled.
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "save_every", "eval", "out_dir"}
MINERS = ("bm25", "none")  # where a row without its own negatives gets one (SPLADE, ColBERT)


@dataclass
class ResumableTrainConfig:
    """The settings SPLADE's and ColBERT's runs share, which their settings extend with their own
    (their fields follow these in OUT_DIR/finetune_config.json)."""

    model: str  # the directory to train from (which ones suit: the trainer's `Parts.load`)
    train: str  # JSONL {query, positive, negatives?} / TSV, or builtin:NAME[:SPLIT]
    out_dir: str
    task: str = ""  # the trainer's name; each trainer's settings set their own
    eval: str | None = None  # MRR@10 / nDCG@10 at the end (default: a builtin's dev split)
    epochs: int = 1
    batch_size: int = 16  # in-batch negatives grow with it (SPLADE v2: 128 on GPUs)
    # None: by the model's width (`optim.default_lr`): 3e-5 for base, near SPLADE v2's 2e-5;
    # 1e-3 for the demo's tiny model, whose 94 steps at 2e-5 left SPLADE's loss where it started (75 → 76).
    lr: float | None = None
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_train_examples: int | None = None
    seed: int = 42
    hard_negatives: int = 1  # negatives per row among the batch's candidates: its own, then mined
    mine: str = "bm25"  # bm25 | none: where a row without its own negatives gets one
    mine_depth: int = 30  # mined negatives are drawn from this many top BM25 passages
    device: str = "cpu"
    progress: bool = True
    overwrite: bool = False
    resume: bool = False
    save_every: int = 200  # a training state every this many steps


@dataclass(frozen=True)
class Step:
    """What one update's loss reads."""

    rows: list[Any]  # this rank's examples of the global batch (all of them in one process)
    group: DistInfo | None  # the ranks to gather a whole-batch loss from; None: this rank holds it all
    number: int  # updates done before this one
    total: int  # updates in the whole run


def _always(config: Any) -> bool:
    return True


def _nothing(config: Any) -> dict[str, Any]:
    return {}


def _keep(model: nn.Module, config: Any) -> None:
    return None


def _examples(examples: list[Any], config: Any) -> int:
    return len(examples)


def _save_pretrained(model: nn.Module, directory: Path) -> None:
    model.save_pretrained(directory)


def width_lr(directory: Path, config: Any) -> float:
    """The learning rate by the model's width (`optim.default_lr`)."""
    from bertkit.encoder.config import BertConfig

    return default_lr(BertConfig.from_json(directory).hidden_size)


@dataclass(frozen=True)
class Parts:
    """What a trainer brings to `run`; `config` is its settings (a ResumableTrainConfig, or
    `common.RetrievalTrainConfig` for embed and rerank)."""

    task: str  # "sparse"
    # (model directory, config) → what the loss reads beside the model (a tokenizer, a teacher, None),
    # once the directory is checked to suit the task
    load: Callable[[Path, Any], Any]
    build: Callable[[Path, Any], nn.Module]  # (a model or training-state directory, config) → the model
    # (the training pairs, config) → a function of the epoch (1, 2, ..., called once each, in order)
    # giving that epoch's examples in batch order, as the loss reads them in `Step.rows`
    epochs: Callable[[list[Pair], Any], Callable[[int], list[Any]]]
    # (engine, what `load` gave, step, config, device) → the loss, () float, and the step record's
    # fields beside "loss"; `engine(f)` runs f(model), under DDP on several ranks
    loss: Callable[[Callable, Any, Step, Any, torch.device], tuple[torch.Tensor, dict[str, Any]]]
    save: Callable[[nn.Module, Any, Path, Any], None]  # (model, what `load` gave, OUT_DIR, config)
    evaluate: Callable[[Path, str, Any], dict[str, Any]]  # (OUT_DIR, eval spec, config) → scores
    chance_loss: Callable[[Any], float | None]  # the loss of a uniform guess (`train.health`)
    lr: Callable[[Path, Any], float] = width_lr  # (model directory, config) → the default learning rate
    # (eval scores, metric, split) → the warning for a score no better than a trivial predictor's
    baseline: Callable[[dict[str, Any], str, str], str | None] = health.no_baseline
    count: Callable[[list[Any], Any], int] = _examples  # (an epoch's examples, config) → eval.json's train_examples
    adapt: Callable[[nn.Module, Any], None] = _keep  # (model on its device, config): LoRA adapters, in place
    # The other rows of a batch are the only negatives: fewer than 2 training pairs are refused.
    in_batch: Callable[[Any], bool] = _always
    describe: Callable[[Any], dict[str, Any]] = _nothing  # eval.json's fields after "steps"
    # The loss is the global batch's (gathered across ranks, the same on every rank); False: a
    # mean over this rank's rows, weighed by them.
    whole_batch: bool = True
    torchrun: bool = True  # False: one process wherever it starts
    # Writes training states and takes config.resume / config.save_every; False: an existing
    # OUT_DIR is only replaced (--overwrite), never continued.
    resumable: bool = True
    card: bool = True  # writes a model card (README.md, `train.card`)
    # (model, a training state's directory): the weights a state holds (a LoRA model: its base
    # and its adapters apart, `lora.save_weights`)
    write_state: Callable[[nn.Module, Path], None] = _save_pretrained
    # (model, a training state's directory, config): those weights loaded into the model; None:
    # `build` reads the state's directory and the model takes that model's weights
    restore: Callable[[nn.Module, Path, Any], None] | None = None
    outputs: tuple[str, ...] = OUTPUTS  # the files that make OUT_DIR a run's


# ---------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------
def check_settings(config: ResumableTrainConfig, task: str, *, paths: Sequence[str], positive: Sequence[str],
                   in_batch: bool, sizes: Sequence[str] = (), more: Sequence[str] = ()) -> None:
    """`paths` made strings, then every problem of the settings in one ValueError: the positive
    integers, the trainer's `sizes` problems, batch_size ≥ 2 when the batch's rows are the
    negatives (`in_batch`), hard_negatives, the trainer's `more` problems, mine, lr, resume
    with overwrite."""
    for name in paths:
        if getattr(config, name) is not None:
            setattr(config, name, str(getattr(config, name)))
    problems = positive_int_problems(config, positive)
    problems += sizes
    if config.batch_size < 2 and in_batch:
        problems.append(f"{task} needs batch_size ≥ 2: the other rows of a batch are the negatives")
    if not isinstance(config.hard_negatives, int) or config.hard_negatives < 0:
        problems.append(f"hard_negatives must be an integer ≥ 0, got {config.hard_negatives!r}")
    problems += more
    if config.mine not in MINERS:
        problems.append(f"{task} mines with bm25 or none, got {config.mine!r}")
    problems += run_problems(config)
    if problems:
        raise ValueError(f"invalid {task} training settings: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# negatives
# ---------------------------------------------------------------------------------------------
def mine_bm25(pairs: Sequence[Pair], config: ResumableTrainConfig) -> list[list[str]]:
    """Each pair's BM25 look-alikes among the training passages (not its positive nor its own
    negatives), the top `mine_depth`; [] each with mine="none" or hard_negatives 0."""
    if config.mine == "none" or config.hard_negatives == 0:
        return [[] for _ in pairs]
    from bertkit.retrieval.bm25 import BM25

    pool = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    if len(pool) < 2:
        return [[] for _ in pairs]
    bm25 = BM25.fit(pool)
    depth = min(config.mine_depth, len(pool))
    return [[pool[i] for i in bm25.top_k(p.query, depth) if pool[i] != p.positive and pool[i] not in p.negatives]
            for p in pairs]


def pair_epochs(pairs: list[Pair], config: ResumableTrainConfig) -> Callable[[int], list[tuple[Pair, list[str]]]]:
    """SPLADE's and ColBERT's `Parts.epochs`: every pair each epoch, as (pair, its hard negatives
    this epoch), in an order shuffled by `random.Random(f"{seed}:{epoch}")`, which then draws the
    negatives, so an epoch is the same however often it is drawn (exact resume)."""
    mined = mine_bm25(pairs, config)

    def epoch(number: int) -> list[tuple[Pair, list[str]]]:
        rng = random.Random(f"{config.seed}:{number}")  # the epoch's order and draws, the same on resume
        order = list(range(len(pairs)))
        rng.shuffle(order)
        negatives = [draw_negatives(p.negatives, m, config.hard_negatives, rng) for p, m in zip(pairs, mined)]
        return [(pairs[i], negatives[i]) for i in order]

    return epoch


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def run(config: Any, parts: Parts) -> dict[str, Any]:
    """Train as `config` says with the trainer's `parts`; returns eval.json's content."""
    started = time.time()
    out = _check_out(config, parts)
    directory = model_directory(config.model, "--model")
    aid = parts.load(directory, config)
    pairs, report = read_pairs(config.train)
    if config.max_train_examples:
        pairs = pairs[:config.max_train_examples]
    if len(pairs) < 2 and parts.in_batch(config):
        raise ValueError(f"{config.train}: {len(pairs)} training pair; in-batch negatives need at least 2")
    if config.eval is None and config.train.startswith(BUILTIN_PREFIX):
        config.eval = BUILTIN_PREFIX + config.train[len(BUILTIN_PREFIX):].split(":")[0] + ":dev"
    info = (distributed.init_distributed(config.device) if parts.torchrun
            else DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device(config.device), backend=None))
    parallel.check_batch_size(config.batch_size, info)
    config.lr = config.lr or parts.lr(directory, config)
    resume_from = None
    if parts.resumable and config.resume:
        resume_from = _resume_point(config, out)
    distributed.barrier(info)  # every rank has read OUT before rank 0 changes it
    if config.overwrite and info.is_main:
        for name in parts.outputs:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    torch.manual_seed(config.seed)
    model = parts.build(directory, config).to(info.device)
    parts.adapt(model, config)
    steps, step, examples = _train(model, aid, pairs, config, parts, info, out, resume_from)
    model.eval()
    if not info.is_main:  # rank 0 writes the model and scores it
        return {"status": "done", "task": parts.task, "model": config.model, "steps": step}
    parts.save(model, aid, out, config)
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in steps))
    if parts.resumable:
        shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)
    losses = [s["loss"] for s in steps]
    summary: dict[str, Any] = {
        "status": "done", "task": parts.task, "model": config.model, "steps": step, **parts.describe(config),
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
        "train": report.to_dict(), "train_examples": parts.count(examples, config)}
    if info.enabled:
        summary["processes"] = info.world_size
    if config.eval:
        summary["eval"] = parts.evaluate(out, config.eval, config)
    summary["warnings"] = health.collect(
        health.step_warning(step, examples=len(examples), batch_size=config.batch_size, epochs=config.epochs),
        health.loss_warning(summary["last_loss"], parts.chance_loss(config)),
        parts.baseline(summary.get("eval") or {}, "mrr@10", "eval"))
    return finish(out, summary, started, card=parts.card)


def _resume_point(config: Any, out: Path) -> Path | None:
    """The training state to continue from, once the settings are found to be the run's; None
    when the run was killed before its first one (it starts again from step 0). A finished run
    (eval.json written, its states removed) is refused: there is nothing to continue."""
    if train_state.latest_checkpoint(out) is None and (out / "eval.json").is_file():
        raise ValueError(f"{out} holds a finished run (eval.json); nothing to resume. Pass --overwrite "
                         "to train it again, or choose another --out")
    return train_state.resume_checkpoint(out, dataclasses.asdict(config), out / FINETUNE_CONFIG,
                                         RESUMABLE_CHANGES)


def epoch_digest(examples: list[Any]) -> str:
    """A fingerprint of an epoch's examples in batch order (their texts, negatives and scores),
    kept in a training state: a resumed run must draw the epoch it continues as the run did."""
    return hashlib.sha256(repr(examples).encode("utf-8")).hexdigest()[:16]


def _check_out(config: Any, parts: Parts) -> Path:
    """OUT_DIR checked before any work: a resumable run's may be continued (`resume`) or replaced
    (`overwrite`); another run's only replaced."""
    if parts.resumable:
        return train_state.check_run_outputs(config.out_dir, parts.outputs, overwrite=config.overwrite,
                                             resume=config.resume)
    return check_writable_output(config.out_dir, overwrite=bool(config.overwrite), kind="dir", outputs=parts.outputs)


def _train(model: nn.Module, aid: Any, pairs: list[Pair], config: Any, parts: Parts, info: DistInfo,
           out: Path, resume_from: Path | None) -> tuple[list[dict[str, Any]], int, list[Any]]:
    """The epochs (from `resume_from`'s step when given): the step records, the steps done and
    the first epoch's examples."""
    from tqdm.auto import tqdm

    from bertkit.train import optim

    draw = parts.epochs(pairs, config)
    # Drawn before OUT is written: a trainer that finds nothing to train on leaves it as it was.
    first = draw(1)
    steps_per_epoch = math.ceil(len(first) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    step = 0
    saved: dict[str, Any] = {}
    if resume_from is not None:
        saved = train_state.load_trainer_state(resume_from)
        if parts.restore is not None:
            parts.restore(model, resume_from, config)
        else:
            model.load_state_dict(parts.build(resume_from, config).state_dict())
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["scheduler"])
        parallel.restore_rank_rng(saved, info)
        step, steps = int(saved["step"]), list(saved["steps"])
        log.info("resuming from %s (step %d of %d)", resume_from, step, total)
    else:
        parallel.seed_dropout(config.seed, info)
        if info.is_main:
            if parts.card:
                drop_stale(out)  # an earlier run's card would describe that run until this one ends
            atomic_write_json(out / FINETUNE_CONFIG, dataclasses.asdict(config))
    engine = parallel.data_parallel(model, info)
    model.train()
    for epoch in range(1, config.epochs + 1):
        # Every epoch is drawn, those already trained too: a trainer whose epochs come from one
        # generator (embed, rerank) reaches the epoch in progress with that generator's state.
        examples = first if epoch == 1 else draw(epoch)
        batches = [examples[i:i + config.batch_size] for i in range(0, len(examples), config.batch_size)]
        done = max(0, step - (epoch - 1) * steps_per_epoch)
        resumed_in = epoch == saved.get("epoch")  # the epoch a training state was written in
        digest = epoch_digest(examples) if parts.resumable and (done < len(batches) or resumed_in) else ""
        if resumed_in and digest != saved["epoch_digest"]:
            raise ValueError(f"{resume_from} was trained on another epoch {epoch} than {config.train} gives "
                             "now (the rows or the teacher changed); resume with the original data, or start "
                             "over with --overwrite")
        for batch in tqdm(batches[done:], desc=f"epoch {epoch}/{config.epochs}",
                          disable=not (config.progress and info.is_main)):
            part = parallel.shard(batch, info)
            loss, fields = parts.loss(engine, aid, Step(part.rows, part.group, step, total), config, info.device)
            part_loss = (parallel.share(loss, part) if parts.whole_batch
                         else parallel.share(loss, part, len(part.rows), len(batch)))
            value = parallel.global_loss(part_loss, info)
            if not math.isfinite(value):  # every rank sees the same value, so all stop together
                raise FloatingPointError(f"the loss became {value} at step {step + 1}; lower --lr")
            optimizer_step(parallel.for_backward(part_loss, info), model, optimizer, schedule, config.max_grad_norm,
                           step)
            step += 1
            steps.append({"step": step, "epoch": epoch, "loss": value, **fields, "lr": schedule.get_last_lr()[0]})
            if parts.resumable and step % config.save_every == 0 and step < total:
                _save_state(model, optimizer, schedule, info, out, parts, {
                    "step": step, "steps": steps, "epoch": epoch, "epoch_digest": digest})
    return steps, step, first


def _save_state(model: nn.Module, optimizer, schedule, info: DistInfo, out: Path, parts: Parts,
                progress: dict[str, Any]) -> None:
    """The training state after `progress["step"]` updates (with the step records, the epoch in
    progress and its digest), in OUT/checkpoints (the newest only)."""
    rngs = parallel.rank_rng_states(info)  # every rank calls: dropout streams are per rank
    if info.is_main:
        train_state.save_checkpoint(out, progress["step"], model, None, {
            "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
            "rng": rngs[0], "rank_rngs": rngs, **progress}, keep=1, write_model=parts.write_state, publish=False)


def finish(out: Path, summary: dict[str, Any], started: float, *, card: bool = True) -> dict[str, Any]:
    """The end of a retrieval run: its warnings logged, its time, eval.json and (with `card`) the
    model card written; returns `summary`."""
    for warning in summary["warnings"]:
        log.warning("warning: %s", warning)
    summary["seconds"] = round(time.time() - started, 2)
    atomic_write_json(out / "eval.json", summary)
    if card:
        finetune_card(out)
    return summary
