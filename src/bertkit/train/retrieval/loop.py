"""The run both retrieval trainers share: read the pairs, build the model, epochs of AdamW steps
with the trainer's loss, save (with LoRA merged or as adapters), evaluate, check the run's health."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.constants import FINETUNE_CONFIG
from bertkit.train import health, lora, parallel
from bertkit.train.card import drop_stale
from bertkit.train.retrieval import biencoder, crossencoder
from bertkit.train.retrieval.common import (
    BUILTIN_PREFIX,
    OUTPUTS,
    RetrievalTrainConfig,
    optimizer_step,
    read_pairs,
)
from bertkit.train.retrieval.evaluate import evaluate
from bertkit.train.retrieval.resumable import finish
from bertkit.util import distributed
from bertkit.util.fileio import atomic_write_json, atomic_write_text, check_writable_output, model_directory

log = logging.getLogger(__name__)


def finetune_retrieval(**settings: Any) -> dict[str, Any]:
    """`RetrievalTrainConfig(**settings)` trained; returns eval.json's content."""
    return run(RetrievalTrainConfig(**settings))


def run(config: RetrievalTrainConfig) -> dict[str, Any]:
    """Train a bi-encoder (embed) or a cross-encoder (rerank) as `config` says; returns eval.json's
    content (written to OUT_DIR/eval.json). Under torchrun each rank runs its slice of every
    batch, the bi-encoder's in-batch negatives gathered from all ranks (`train.parallel`); rank 0
    writes OUT_DIR and evaluates."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.train import optim

    started = time.time()
    out = check_writable_output(config.out_dir, overwrite=True if config.overwrite else False,
                                kind="dir", outputs=OUTPUTS)
    model_directory(config.model, "--model")
    pairs, report = read_pairs(config.train)
    if config.max_train_examples:
        pairs = pairs[:config.max_train_examples]
    if config.eval is None and config.train.startswith(BUILTIN_PREFIX):
        config.eval = config.train.split(":")[0] + ":" + config.train.split(":")[1] + ":dev"
    info = distributed.init_distributed(config.device)
    parallel.check_batch_size(config.batch_size, info)
    tokenizer = BertTokenizer.from_pretrained(config.model)
    device = info.device
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    trainer = _trainer(config)
    model = trainer.build(config).to(device)
    if config.lora:
        log.info("%s", lora.apply_lora(model, lora.LoraSpec.parse(config.lora)).summary())
    config.lr = config.lr or trainer.DEFAULT_LR
    pool = trainer.prepare(pairs, config)
    examples = trainer.epoch_examples(pool, config, rng)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    distributed.barrier(info)  # every rank has checked OUT before rank 0 writes to it
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        drop_stale(out)  # an earlier run's card would describe that run until this one ends
        atomic_write_json(out / FINETUNE_CONFIG, dataclasses.asdict(config))
    from tqdm.auto import tqdm

    parallel.seed_dropout(config.seed, info)

    engine = parallel.data_parallel(model, info)
    steps, step = [], 0
    model.train()
    n_pairs = trainer.count_pairs(examples, config)
    for epoch in range(1, config.epochs + 1):
        if epoch > 1:  # a cross-encoder draws fresh negatives from each query's pool
            examples = trainer.epoch_examples(pool, config, rng)
        order = list(range(len(examples)))
        rng.shuffle(order)
        batches = [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        for batch in tqdm(batches, desc=f"epoch {epoch}/{config.epochs}",
                          disable=not (config.progress and info.is_main)):
            part = parallel.shard([examples[i] for i in batch], info)
            # In-batch negatives (GATHERS): the embeddings of every rank's rows join the loss.
            group = {"group": part.group} if trainer.GATHERS else {}
            loss = engine(partial(trainer.loss, tokenizer=tokenizer, rows=part.rows, config=config,
                                  device=device, **group))
            # A gathered loss is the whole batch's; a cross-encoder's is a mean over its rows.
            loss = (parallel.share(loss, part) if trainer.GATHERS
                    else parallel.share(loss, part, len(part.rows), len(batch)))
            value = parallel.global_loss(loss, info)
            if not math.isfinite(value):  # every rank sees the same value, so all stop together
                raise FloatingPointError(f"the loss became {value} at step {step + 1}; lower --lr")
            optimizer_step(parallel.for_backward(loss, info), model, optimizer, schedule, config.max_grad_norm,
                           step)
            step += 1
            steps.append({"step": step, "epoch": epoch, "loss": value, "lr": schedule.get_last_lr()[0]})
    model.eval()
    if not info.is_main:  # rank 0 writes the model and scores it
        return {"status": "done", "task": config.task, "model": config.model, "steps": step}
    adapters = bool(config.lora) and config.lora_save == "adapters"
    if config.lora:
        lora.save_lora(model, out, config.lora_save, str(Path(config.model).resolve()), use=config.task,
                       max_length=config.max_length, pooling=trainer.pooling(config))
    else:
        model.save_pretrained(out)
    trainer.save_extras(model, tokenizer, out, config, adapters)
    tokenizer.save_pretrained(out)
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in steps))
    losses = [s["loss"] for s in steps]
    summary: dict[str, Any] = {
        "status": "done", "task": config.task, "model": config.model, "steps": step,
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
        "train": report.to_dict(), "train_examples": n_pairs}
    if info.enabled:
        summary["processes"] = info.world_size
    if config.eval:
        from bertkit.adapters import load_engine

        summary["eval"] = evaluate(load_engine(config.model, out) if adapters else out, config.task, config.eval,
                                   dims=config.matryoshka_dims, scored=config.loss in ("cosent", "angle"))
    summary["warnings"] = run_warnings(config, trainer, summary, len(examples))
    return finish(out, summary, started)


def _trainer(config: RetrievalTrainConfig):
    """The module of `config.task`'s trainer (`biencoder`, `crossencoder`), which this run calls
    for what differs: `build` the model, `DEFAULT_LR`, `prepare` the pairs and draw an epoch's
    `epoch_examples` from them, `count_pairs`, the batch `loss` (with `GATHERS`, a loss over the
    whole batch that takes the ranks to gather embeddings from under torchrun), the `pooling` a
    LoRA side file records, the files it `save_extras` beside the model, its `chance_loss` and
    `baseline`."""
    return biencoder if config.task == "embed" else crossencoder


def run_warnings(config: RetrievalTrainConfig, trainer, summary: dict[str, Any], examples: int) -> list[str]:
    """`train.health`'s checks: too few steps, a loss still at the trainer's chance, a score no
    better than its baseline (a reranker's own first stage)."""
    found = [health.step_warning(summary["steps"], examples=examples, batch_size=config.batch_size,
                                 epochs=config.epochs),
             health.loss_warning(summary["last_loss"], trainer.chance_loss(config)),
             trainer.baseline(summary.get("eval") or {}, "mrr@10", "eval")]
    return health.collect(*found)
