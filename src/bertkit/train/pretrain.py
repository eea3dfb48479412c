"""Pre-training loop: MLM (+ NSP) on prepared shards, resumable exactly, one process or many.

    pretrain(PretrainConfig(data="DATA_DIR", out="RUN_DIR", model="mini", max_steps=2000))

What a step does, and why:
- The optimizer step consumes `batch_size` sequences, split into `grad_accum` micro-batches and,
  under `torchrun`, over `world_size` ranks (each reads its own slice of every global batch).
- The MLM loss is normalised by the number of selected tokens in the *whole* step (all micro-batches,
  all ranks), not per micro-batch: then 1 process × batch B, k ranks × B/k and accumulation over
  micro-batches all give the same gradient (up to float rounding). Averaging per-micro-batch means
  instead would weight a token by how many others happened to be masked beside it.
- A step whose gradient norm is not finite is skipped (no update) with a warning; `max_bad_steps`
  of them in a row stop the run. The gradient norm is computed after DDP's all-reduce, so every
  rank takes the same decision.
- Exact resume: the data order and masks are functions of (seed, epoch, batch index); the checkpoint
  adds weights, optimizer and scheduler state and every rank's RNG state (dropout), so a run killed
  at any moment and resumed from its last checkpoint repeats the same per-step losses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from bertkit.checkpoint import load_into, read_state_dict
from bertkit.config import BertConfig, check_override_keys
from bertkit.data.shards import OBJECTIVES, PretrainingBatches, PretrainingData
from bertkit.fileio import atomic_write_json, check_writable_output, remove_outputs
from bertkit.model import IGNORE_INDEX, BertForPreTraining, count_parameters
from bertkit.precision import PRECISIONS, autocast, resolve_precision
from bertkit.tokenizer import BertTokenizer
from bertkit.train import distributed, optim, state

logger = logging.getLogger(__name__)

CONFIG_FILE = "pretrain_config.json"
SUMMARY_FILE = "summary.json"
# What a run directory holds; --overwrite removes exactly these and leaves anything else alone.
RUN_OUTPUTS = (CONFIG_FILE, SUMMARY_FILE, state.METRICS, state.CHECKPOINTS, state.MODEL, "curves.png")
# Settings that may change when a run is resumed: they do not alter the sequence of updates.
RESUMABLE_CHANGES = {"resume", "overwrite", "log_every", "save_every", "keep", "eval_every",
                     "eval_batches", "num_workers", "progress", "max_bad_steps", "compile", "device",
                     "time_limit"}


class TrainingDiverged(RuntimeError):
    """Too many non-finite steps in a row, or non-finite weights: the run stopped, nothing saved."""


@dataclass
class PretrainConfig:
    """Every setting of a pre-training run; written to RUN_DIR/pretrain_config.json."""

    data: str  # DATA_DIR made by `bertkit prepare` (its tokenizer fixes the vocabulary)
    out: str  # RUN_DIR: checkpoints, metrics, final model
    # Architecture: preset (tiny mini small medium base large), config.json or model directory.
    # vocab_size always comes from the data's tokenizer.
    model: str = "mini"
    # Continue from the weights of any Hugging Face BERT directory (its tokenizer must be the data's).
    init: str | None = None
    # config.json fields to override on top of `model`, e.g. {"hidden_dropout_prob": 0.0}.
    model_overrides: dict[str, Any] = field(default_factory=dict)
    # mlm | mlm+nsp | mlm+sop; None = what the data were prepared for (`bertkit prepare
    # --objective`). mlm on pair data trains the MLM alone and ignores the pair labels.
    objective: str | None = None

    # --- length: exactly one of max_steps / epochs (neither = 1 epoch)
    max_steps: int | None = None
    epochs: float | None = None
    # --- batch: sequences per optimizer step over all ranks and micro-batches (BERT used 256)
    batch_size: int = 128
    grad_accum: int = 1  # micro-batches per optimizer step (to fit memory; same result)
    mlm_probability: float = 0.15  # share of tokens selected for MLM, as in the paper

    # --- optimizer: AdamW as BERT (β, ε from the reference implementation)
    lr: float = 5e-4  # peak; small models tolerate higher rates than base's 1e-4
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    schedule: str = "linear"  # linear | cosine | constant after warmup
    warmup_steps: int | None = None  # None = 6% of the steps (RoBERTa's ratio), at least 1
    max_grad_norm: float = 1.0  # clip the global gradient norm, as BERT

    # --- execution
    # auto = bf16 on CUDA; on CPU whichever of fp32 / bf16 a matmul probe measures faster here
    # (bertkit.precision: CPU flags mislead, bf16 ran at half the fp32 rate on one AVX-512 BF16 CPU)
    precision: str = "auto"
    compile: bool = False  # torch.compile the encoder layers (first steps are slower while it compiles)
    device: str = "auto"  # auto | cpu | cuda
    # DataLoader worker processes preparing batches ahead of the model. None = one on CUDA or
    # where a CPU core is left over by torch's threads, else none: on 2 cores with 2 threads a
    # worker competes with the compute (mini, bench/pretrain.py: 4,440 tokens/s with one worker,
    # 5,377 without).
    num_workers: int | None = None
    seed: int = 0

    # --- visibility and checkpoints
    log_every: int = 10  # steps between metrics.jsonl lines (values averaged over those steps)
    eval_every: int | None = None  # steps between held-out evaluations (None = 10 × log_every)
    eval_batches: int = 20  # held-out batches per evaluation (the same ones every time)
    save_every: int = 1000  # steps between checkpoints (one is always written at the end)
    keep: int = 2  # checkpoints kept (newest)
    max_bad_steps: int = 10  # non-finite steps in a row before the run stops
    # Seconds of training (this session) after which the run stops cleanly with a checkpoint, even
    # before max_steps; --resume continues it. None = no limit.
    time_limit: float | None = None
    progress: bool = True  # tqdm progress bar on rank 0

    resume: bool = False  # continue RUN_DIR from its newest complete checkpoint
    overwrite: bool = False  # start over in an existing RUN_DIR (removes the previous run's files)

    def validate(self) -> None:
        """Raise ValueError naming every bad value and the fix."""
        problems = []
        positive = ("batch_size", "grad_accum", "log_every", "eval_batches", "save_every", "keep",
                    "max_bad_steps")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_steps", "eval_every", "warmup_steps"):
            value = getattr(self, name)
            low = 0 if name == "warmup_steps" else 1
            if value is not None and (not isinstance(value, int) or value < low):
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        if self.max_steps is not None and self.epochs is not None:
            problems.append("give either max_steps or epochs, not both")
        if self.epochs is not None and not self.epochs > 0:
            problems.append(f"epochs must be > 0, got {self.epochs!r}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if not 0 < self.mlm_probability < 1:
            problems.append(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.schedule not in optim.SCHEDULES:
            problems.append(f"schedule must be one of {', '.join(optim.SCHEDULES)}, got {self.schedule!r}")
        if self.num_workers is not None and self.num_workers < 0:
            problems.append(f"num_workers must be >= 0, got {self.num_workers!r}")
        if self.time_limit is not None and not self.time_limit > 0:
            problems.append(f"time_limit must be > 0 seconds, got {self.time_limit!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            problems.append(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if self.objective is not None and self.objective not in OBJECTIVES:
            problems.append(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.resume and self.overwrite:
            problems.append("resume and overwrite exclude each other; pass one")
        try:  # a typo such as hiden_dropout_prob fails here, before the data are read
            check_override_keys(self.model_overrides)
        except ValueError as err:
            problems.append(f"model_overrides (--model-arg): {err}")
        if problems:
            raise ValueError("invalid pre-training settings: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PretrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown pre-training setting(s): {', '.join(unknown)}")
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Data: one DataLoader for the whole run, over (epoch, batch index) pairs
# ---------------------------------------------------------------------------------------------
class RunBatches(torch.utils.data.Dataset):
    """Item (epoch, i) = micro-batch i of that epoch for this rank.

    Indexing by (epoch, i) lets one DataLoader — and its worker processes — serve every epoch of
    the run, and lets a resumed run start in the middle of an epoch by starting its index list
    there. Each worker builds the epoch's `PretrainingBatches` (a permutation) once and caches it.
    """

    def __init__(self, data, rank_batch_size: int, *, seed: int, mlm_probability: float,
                 rank: int, world_size: int):
        self.data = data
        self.kwargs = dict(seed=seed, rank=rank, world_size=world_size, mlm_probability=mlm_probability)
        self.rank_batch_size = rank_batch_size  # rows this rank reads per micro-batch
        self._epochs: dict[int, Any] = {}
        self.batches_per_epoch = len(self._epoch(0))

    def _epoch(self, epoch: int):
        if epoch not in self._epochs:  # keep one epoch: its permutation is all there is to cache
            self._epochs = {epoch: PretrainingBatches(self.data, self.rank_batch_size, epoch=epoch,
                                                       **self.kwargs)}
        return self._epochs[epoch]

    def __getitem__(self, key: tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, i = key
        return self._epoch(epoch)[i]

    def __len__(self) -> int:
        return self.batches_per_epoch

    def positions(self, start: int, stop: int) -> list[tuple[int, int]]:
        """(epoch, i) of the run's micro-batches number start .. stop-1 (counted from step 0)."""
        return [divmod(k, self.batches_per_epoch) for k in range(start, stop)]


def _ignore_stop_signals(worker_id: int) -> None:
    # Ctrl-C reaches the whole process group. The main process turns SIGINT / SIGTERM into a
    # checkpoint at the next step boundary; a worker dying on them instead would break the batch
    # that step still needs. Workers exit with their parent regardless (DataLoader watches it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loader_workers(requested: int | None, device: torch.device) -> int:
    """DataLoader workers: `requested`, or by default 1 on CUDA or when a core is free of torch's
    threads, else 0 (batches then build in the training process)."""
    if requested is not None:
        return requested
    spare_core = (os.cpu_count() or 1) > torch.get_num_threads()
    return 1 if device.type == "cuda" or spare_core else 0


def make_loader(dataset: torch.utils.data.Dataset, keys: list, num_workers: int,
                device: torch.device) -> torch.utils.data.DataLoader:
    """Batches are made whole by the dataset (batch_size=None); workers prefetch them in order."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=keys, num_workers=num_workers,
        prefetch_factor=4 if num_workers > 0 else None,
        pin_memory=device.type == "cuda",
        worker_init_fn=_ignore_stop_signals if num_workers > 0 else None,
        # Our own generator: otherwise creating the iterator draws a seed from torch's global RNG,
        # which would shift the dropout stream of a resumed run against an uninterrupted one.
        generator=torch.Generator())


def data_digest(meta: dict) -> str:
    """Fingerprint of the prepared data, stored in checkpoints so a resume uses the same data."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Statistics of one forward pass
# ---------------------------------------------------------------------------------------------
# Order of the per-window sums kept on device (one all-reduce per log line, not per step).
_STATS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "nsp_loss_sum", "nsp_correct", "nsp_count")


def batch_stats(out, mlm_labels: torch.Tensor, nsp_labels: torch.Tensor) -> torch.Tensor:
    """(6,) float64 sums for one micro-batch: see `_STATS`. Needs `out.mlm_predictions` (M,)."""
    targets = mlm_labels[mlm_labels != IGNORE_INDEX]  # (M,)
    m = targets.numel()
    mlm_loss_sum = out.mlm_loss.detach().double() * m
    mlm_correct = (out.mlm_predictions == targets).sum().double()  # (M,) → ()
    has_nsp = nsp_labels != IGNORE_INDEX  # (B,)
    # Labels the model did not score (--objective mlm on pair data) do not count as NSP rows.
    n = int(has_nsp.sum()) if out.nsp_loss is not None else 0
    if out.nsp_loss is not None and n:
        nsp_loss_sum = out.nsp_loss.detach().double() * n
        nsp_correct = (out.nsp_logits.detach().argmax(-1)[has_nsp] == nsp_labels[has_nsp]).sum().double()
    else:
        nsp_loss_sum = nsp_correct = torch.zeros((), dtype=torch.float64, device=mlm_labels.device)
    return torch.stack([mlm_loss_sum, mlm_correct, mlm_loss_sum.new_tensor(float(m)),
                        nsp_loss_sum, nsp_correct, nsp_loss_sum.new_tensor(float(n))])


def summarise(stats: torch.Tensor) -> dict[str, float | None]:
    """Window sums → loss, mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy (None without NSP)."""
    s = dict(zip(_STATS, stats.tolist()))
    mlm_loss = s["mlm_loss_sum"] / s["mlm_count"] if s["mlm_count"] else float("nan")
    out: dict[str, float | None] = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": s["mlm_correct"] / s["mlm_count"] if s["mlm_count"] else None,
        "nsp_loss": s["nsp_loss_sum"] / s["nsp_count"] if s["nsp_count"] else None,
        "nsp_accuracy": s["nsp_correct"] / s["nsp_count"] if s["nsp_count"] else None,
    }
    out["loss"] = mlm_loss + (out["nsp_loss"] or 0.0)
    return out


@torch.no_grad()
def evaluation_sums(model: nn.Module, batches, *, device: torch.device, precision: str,
                    max_batches: int | None = None, use_nsp: bool = True) -> torch.Tensor:
    """(6,) sums (`_STATS`) of a model over the first `max_batches` of `batches` (all if None).

    batches: a sequence of PretrainingBatches items. The model is put in eval mode (no dropout) and
    returned to its previous mode. `summarise(sums)` turns the result into losses and accuracies.
    use_nsp=False scores the MLM alone even where the batches carry NSP/SOP labels.
    """
    n = len(batches) if max_batches is None else min(max_batches, len(batches))
    total = torch.zeros(len(_STATS), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        for i in range(n):
            batch = _to_device(batches[i], device)
            has_nsp = use_nsp and bool((batch["nsp_labels"] != IGNORE_INDEX).any())
            with autocast(device, precision):
                out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                            mlm_labels=batch["mlm_labels"],
                            nsp_labels=batch["nsp_labels"] if has_nsp else None)
            total += batch_stats(out, batch["mlm_labels"], batch["nsp_labels"])
    finally:
        model.train(was_training)
    return total


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# ---------------------------------------------------------------------------------------------
# Run directory
# ---------------------------------------------------------------------------------------------
def prepare_run_dir(config: PretrainConfig) -> None:
    """Refuse to mix runs: an existing non-empty RUN_DIR needs --resume or --overwrite."""
    run_dir = check_writable_output(config.out, overwrite=None, kind="dir")
    has_content = run_dir.is_dir() and any(run_dir.iterdir())
    if not has_content or config.resume:
        return
    if not config.overwrite:
        raise FileExistsError(f"run directory {run_dir} already exists and is not empty; pass --resume "
                              "to continue it, --overwrite to start over, or choose another --out")
    remove_outputs(run_dir, RUN_OUTPUTS)
    state.remove_partial_checkpoints(run_dir)


def check_resume_config(saved: dict[str, Any], config: PretrainConfig, source: Path) -> None:
    """A resumed run must make the same updates: only operational settings may differ."""
    # Neither path is compared: `runD/`, `runD` and /abs/runD are one directory, a run directory
    # may be moved, and the data are compared by their digest (see `_resume`).
    state.check_same_settings(config.out, saved, config.to_dict(), source,
                              set(RESUMABLE_CHANGES) | {"data", "out"},
                              "Resume with the original settings, or start a new run with "
                              f"--init {Path(config.out) / state.MODEL}")


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """SIGINT / SIGTERM stopped the run at a step boundary, after saving a checkpoint there."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class _StopFlag:
    """Set by SIGTERM / SIGINT so the loop stops at the next step boundary with a checkpoint."""

    def __init__(self):
        self.raised = False
        self.signum = signal.SIGINT
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.raised:  # a second signal: stop now
            raise KeyboardInterrupt
        self.raised = True
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Owns the model, optimizer, data and run directory of one `pretrain` call."""

    def __init__(self, config: PretrainConfig, dist_info: distributed.DistInfo):
        config.validate()
        self.config = config
        self.dist = dist_info
        self.device = dist_info.device
        self.run_dir = Path(config.out)
        # "auto" measures the machine; under torchrun every rank must compute alike, so rank 0's
        # choice is the run's.
        self.precision = distributed.broadcast_object(
            resolve_precision(config.precision, self.device), dist_info)
        world = dist_info.world_size
        if config.batch_size % (config.grad_accum * world):
            raise ValueError(f"batch_size {config.batch_size} must be divisible by grad_accum "
                             f"{config.grad_accum} × processes {world}; change --batch-size or --grad-accum")
        # PretrainingBatches' batch size is per rank: a global micro-batch is that × world_size.
        self.rank_batch_size = config.batch_size // (config.grad_accum * world)

        # ---- data
        data_dir = Path(config.data)
        if not data_dir.is_dir():
            raise FileNotFoundError(f"data directory {data_dir} does not exist; make it with "
                                    "`bertkit prepare`")
        # Continuing from a checkpoint: its tokenizer must be the one the data was made with.
        init_tokenizer = BertTokenizer.from_pretrained(config.init) if config.init else None
        self.data = PretrainingData(data_dir, "train", tokenizer=init_tokenizer)
        self.eval_data = None
        eval_size = self.data.meta["splits"].get("eval", {}).get("num_instances", 0)
        if eval_size >= self.rank_batch_size * world:
            self.eval_data = PretrainingData(data_dir, "eval")
        else:
            logger.warning("%s has %d held-out instances, fewer than one batch of %d; training "
                           "without evaluation", data_dir, eval_size, self.rank_batch_size * world)
        self.objective = config.objective or self.data.objective
        if self.objective != "mlm" and self.objective != self.data.objective:
            raise ValueError(f"--objective {self.objective} needs data prepared for it; {data_dir} was "
                             f"prepared for {self.data.objective}: run `bertkit prepare --objective "
                             f"{self.objective}`")
        self.use_nsp = self.objective != "mlm"
        self.batches = RunBatches(self.data, self.rank_batch_size, seed=config.seed,
                                  mlm_probability=config.mlm_probability, rank=dist_info.rank,
                                  world_size=world)
        if config.max_steps is not None:
            self.total_steps = config.max_steps
        else:
            epochs = config.epochs if config.epochs is not None else 1.0
            self.total_steps = max(1, int(epochs * self.batches.batches_per_epoch) // config.grad_accum)
        self.warmup_steps = (config.warmup_steps if config.warmup_steps is not None
                             else max(1, round(0.06 * self.total_steps)))
        self.warmup_steps = min(self.warmup_steps, self.total_steps)
        self.eval_every = config.eval_every or 10 * config.log_every

        # ---- model (same init on every rank: seeded before construction)
        torch.manual_seed(config.seed)
        model = self._build_model()
        self.model_config = model.config
        self.model = model.to(self.device).train()
        self.optimizer = optim.build_optimizer(
            self.model, config.lr, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps)
        self.scheduler = optim.lr_schedule(self.optimizer, self.warmup_steps, self.total_steps,
                                           config.schedule)

        # ---- position in the run
        self.step = 0
        self.tokens_seen = 0
        self.elapsed = 0.0
        self.bad_steps = 0
        self.metrics = state.MetricsLog(self.run_dir)
        # Dropout streams differ between ranks (they see different rows) but are fixed by the seed.
        torch.manual_seed(config.seed * 1000 + 1 + dist_info.rank)

    # ----------------------------------------------------------------- set-up helpers
    def _build_model(self) -> BertForPreTraining:
        """A new model of `config.model` sized to the data's vocabulary, or the `init` checkpoint."""
        c = self.config
        vocab = self.data.vocab_size
        if c.init is not None:
            model = BertForPreTraining.from_pretrained(c.init, **c.model_overrides)
            if model.config.vocab_size != vocab:
                raise ValueError(f"--init {c.init} has vocab_size {model.config.vocab_size} but the "
                                 f"data's tokenizer has {vocab} tokens; prepare the data with the "
                                 f"tokenizer of {c.init}")
        else:
            model = BertForPreTraining(BertConfig.resolve(c.model, **{**c.model_overrides,
                                                                      "vocab_size": vocab}))
        if model.config.max_sequence_length < self.data.max_seq_len:
            raise ValueError(f"the data's max_seq_len {self.data.max_seq_len} exceeds the model's "
                             f"limit of {model.config.max_sequence_length} tokens (max_position_embeddings "
                             f"{model.config.max_position_embeddings}); prepare with a shorter --max-seq-len "
                             "or use a larger model config")
        if self.use_nsp and model.nsp is None:
            raise ValueError(f"objective {self.objective} needs a sentence-pair head, which model_type "
                             f"{model.config.model_type!r} does not have; use --objective mlm")
        return model

    def _setup_run_dir(self) -> None:
        """Rank 0: check the directory, write the config, restore the newest checkpoint if resuming."""
        c = self.config
        error = None
        if self.dist.is_main:
            try:
                prepare_run_dir(c)
                state.check_output_dir(self.run_dir, (c.keep + 1) * state.checkpoint_bytes(self.model))
                for path in state.remove_partial_checkpoints(self.run_dir):
                    logger.info("removed incomplete checkpoint %s", path)
                config_path = self.run_dir / CONFIG_FILE
                if c.resume and config_path.is_file():
                    check_resume_config(json.loads(config_path.read_text(encoding="utf-8")), c,
                                        config_path)
                atomic_write_json(config_path, c.to_dict())
            except (ValueError, OSError) as err:
                if not self.dist.enabled:
                    raise
                error = err
        # Other ranks wait here; they raise rank 0's error instead of hanging at the next collective.
        error = distributed.broadcast_object(error, self.dist)
        if error is not None:
            raise error

    def _resume(self) -> None:
        checkpoint = state.latest_checkpoint(self.run_dir)
        if checkpoint is None:
            if self.dist.is_main:
                logger.info("no checkpoint in %s yet; starting from step 0", self.run_dir)
                self.metrics.truncate_after(0)
            return
        saved = state.load_trainer_state(checkpoint)
        if saved.get("data_digest") != data_digest(self.data.meta):
            raise ValueError(f"{checkpoint} was trained on different data than {self.config.data} "
                             "(the prepared data changed); resume with the original data directory")
        load_into(self.model, read_state_dict(checkpoint), str(checkpoint))
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.step = int(saved["step"])
        self.tokens_seen = int(saved["tokens_seen"])
        self.elapsed = float(saved["elapsed"])
        self.bad_steps = int(saved["bad_steps"])
        chosen = saved.get("precision")
        if self.config.precision == "auto" and chosen in ("fp32", "bf16") and chosen != self.precision:
            # The probe can rank two close rates differently from one session to the next; the
            # checkpoint's choice keeps the resumed steps equal to an uninterrupted run's.
            logger.info("precision auto: keeping the checkpoint's %s (measured %s now)", chosen,
                        self.precision)
            self.precision = chosen
        rng = saved["rng"]
        if len(rng) == self.dist.world_size:
            state.restore_rng_state(rng[self.dist.rank])
        else:
            # Data order and masks still match exactly; only the dropout stream is re-seeded.
            logger.warning("checkpoint was written by %d processes, this run has %d: resuming with "
                           "fresh dropout seeds (not bit-identical to an uninterrupted run)",
                           len(rng), self.dist.world_size)
            torch.manual_seed(self.config.seed * 1000 + 1 + self.dist.rank + 7919 * self.step)
        if self.dist.is_main:
            self.metrics.truncate_after(self.step)
            logger.info("resuming from %s (step %d of %d)", checkpoint, self.step, self.total_steps)

    # ----------------------------------------------------------------- saving
    def _trainer_state(self) -> dict[str, Any]:
        rng = state.capture_rng_state()
        if self.dist.enabled:
            gathered: list[Any] = [None] * self.dist.world_size
            dist.all_gather_object(gathered, rng)
            rng_all = gathered
        else:
            rng_all = [rng]
        consumed = self.step * self.config.grad_accum
        epoch, position = divmod(consumed, self.batches.batches_per_epoch)
        return {
            "format": 1,
            "step": self.step,
            "epoch": epoch,
            "batch_in_epoch": position,  # next micro-batch of that epoch to read
            "tokens_seen": self.tokens_seen,
            "elapsed": self.elapsed,
            "bad_steps": self.bad_steps,
            "precision": self.precision,  # what "auto" chose: a resumed run keeps it
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_all,  # one entry per rank
            "world_size": self.dist.world_size,
            "config": json.dumps(self.config.to_dict()),
            "data_digest": data_digest(self.data.meta),
        }

    def save(self) -> None:
        """Checkpoint on rank 0 (every rank must call: RNG states are gathered)."""
        trainer_state = self._trainer_state()
        error = None
        if self.dist.is_main:
            try:
                state.save_checkpoint(self.run_dir, self.step, self.model, self.data.tokenizer_dir,
                                      trainer_state, self.config.keep)
            except RuntimeError as err:  # non-finite weights: never replace a good checkpoint
                error = str(err)
        error = distributed.broadcast_object(error, self.dist)
        if error:
            raise TrainingDiverged(error)

    # ----------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, Any] | None:
        """MLM / NSP loss and accuracy on the first `eval_batches` held-out batches (fixed masks)."""
        if self.eval_data is None:
            return None
        batches = PretrainingBatches(self.eval_data, self.rank_batch_size, seed=self.config.seed,
                                     epoch=0, rank=self.dist.rank, world_size=self.dist.world_size,
                                     mlm_probability=self.config.mlm_probability)
        total = evaluation_sums(self.model, batches, device=self.device, precision=self.precision,
                                max_batches=self.config.eval_batches, use_nsp=self.use_nsp)
        distributed.all_reduce_sum(total, self.dist)
        return summarise(total)

    # ----------------------------------------------------------------- one optimizer step
    def _train_step(self, engine: nn.Module, micro_batches: list[dict[str, torch.Tensor]]
                    ) -> tuple[torch.Tensor, float, int]:
        """Forward/backward over the micro-batches, clip, update. Returns (stats, grad_norm, tokens)."""
        # Counts over the whole step (all micro-batches, all ranks) normalise the loss exactly.
        counts = torch.tensor([[float((b["mlm_labels"] != IGNORE_INDEX).sum()),
                                float((b["nsp_labels"] != IGNORE_INDEX).sum()),
                                float(b["attention_mask"].sum())] for b in micro_batches],
                              dtype=torch.float64)  # (accum, 3)
        global_counts = distributed.all_reduce_sum(counts.sum(0).to(self.device), self.dist).cpu()
        mlm_total, nsp_total, tokens = global_counts.tolist()
        world = self.dist.world_size
        stats = torch.zeros(len(_STATS), dtype=torch.float64, device=self.device)
        for k, cpu_batch in enumerate(micro_batches):
            batch = _to_device(cpu_batch, self.device)
            last = k == len(micro_batches) - 1
            # DDP all-reduces gradients on every backward unless told not to: once per step suffices.
            sync = contextlib.nullcontext() if last or not self.dist.enabled else engine.no_sync()
            with sync:
                with autocast(self.device, self.precision):
                    out = engine(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                 mlm_labels=batch["mlm_labels"],
                                 nsp_labels=batch["nsp_labels"] if self.use_nsp else None)
                # mean × (local count / step count) = this micro-batch's share of the step's mean;
                # × world because DDP averages (not sums) gradients over ranks.
                loss = out.mlm_loss * (counts[k, 0].item() / max(mlm_total, 1.0))
                if out.nsp_loss is not None:
                    loss = loss + out.nsp_loss * (counts[k, 1].item() / max(nsp_total, 1.0))
                (loss * world).backward()
            stats += batch_stats(out, batch["mlm_labels"], batch["nsp_labels"])

        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # The schedule follows the step count, skipped steps included, so max_steps stays the end.
        self.scheduler.step()
        return stats, grad_norm, int(tokens)

    # ----------------------------------------------------------------- the loop
    def run(self) -> dict[str, Any]:
        c = self.config
        self._setup_run_dir()
        if c.resume:
            self._resume()
        if self.step >= self.total_steps:
            logger.info("%s is already complete (step %d of %d)", self.run_dir, self.step, self.total_steps)
            return self._summary(None, None, None)

        engine: nn.Module = self.model
        if self.dist.enabled:
            # Without NSP the pooler and NSP head get no gradient; DDP must be told to expect that.
            engine = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=not self.use_nsp)
        if c.compile:
            self.model.bert.compile_layers()

        accum = c.grad_accum
        keys = self.batches.positions(self.step * accum, self.total_steps * accum)
        loader = make_loader(self.batches, keys, loader_workers(c.num_workers, self.device),
                             self.device)
        stream: Iterator = iter(loader)
        if self.dist.is_main:
            self._log_start()

        from tqdm.auto import tqdm

        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (c.progress and self.dist.is_main))
        window = torch.zeros(len(_STATS), dtype=torch.float64, device=self.device)
        # Training speed counts the steps only (data wait included), not evaluations or saves.
        window_tokens, window_seconds, window_steps = 0, 0.0, 0
        last_grad_norm = float("nan")
        train_summary: dict[str, Any] | None = None
        eval_summary: dict[str, Any] | None = None
        saved_at = self.step
        stopped = None
        this_session = time.perf_counter()
        session_start = this_session - self.elapsed
        try:
            with _StopFlag() as stop_flag:
                while self.step < self.total_steps:
                    step_start = time.perf_counter()
                    micro_batches = [next(stream) for _ in range(accum)]
                    lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses
                    stats, grad_norm, tokens = self._train_step(engine, micro_batches)
                    step_seconds = time.perf_counter() - step_start
                    self.step += 1
                    self.tokens_seen += tokens
                    if math.isfinite(grad_norm):
                        self.bad_steps = 0
                        window += stats
                        window_tokens += tokens
                        window_seconds += step_seconds
                        window_steps += 1
                        last_grad_norm = grad_norm
                    else:
                        self.bad_steps += 1
                        logger.warning("step %d: non-finite loss or gradient (grad norm %s); update "
                                       "skipped (%d in a row, limit %d)", self.step, grad_norm,
                                       self.bad_steps, c.max_bad_steps)
                        if self.bad_steps >= c.max_bad_steps:
                            raise TrainingDiverged(
                                f"{self.bad_steps} non-finite steps in a row (up to step {self.step}); "
                                f"stopping. The last good checkpoint is kept in {self.run_dir}. "
                                "Lower --lr, raise --warmup-steps, or use --precision fp32")
                    self.elapsed = time.perf_counter() - session_start
                    bar.update(1)

                    if self.step % c.log_every == 0 or self.step == self.total_steps:
                        distributed.all_reduce_sum(window, self.dist)
                        if window_steps:
                            train_summary = summarise(window)
                            record = {"step": self.step, "split": "train", **train_summary,
                                      "lr": lr, "grad_norm": last_grad_norm,
                                      "tokens_per_s": window_tokens / max(window_seconds, 1e-9),
                                      "tokens_seen": self.tokens_seen, "elapsed": self.elapsed}
                            if self.dist.is_main:
                                self.metrics.write(record)
                                bar.set_postfix(loss=f"{record['loss']:.3f}",
                                                tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
                        window.zero_()
                        window_tokens, window_seconds, window_steps = 0, 0.0, 0
                    if self.step % self.eval_every == 0 or self.step == self.total_steps:
                        eval_summary = self._log_eval()
                    if self.step % c.save_every == 0 or self.step == self.total_steps:
                        self.save()
                        saved_at = self.step
                    if not distributed.all_true(not stop_flag.raised, self.dist):
                        if saved_at != self.step:
                            self.save()
                        raise Interrupted(f"stopped by signal at step {self.step} of "
                                          f"{self.total_steps}; checkpoint saved in {self.run_dir}, "
                                          "continue with --resume", stop_flag.signum)
                    if (c.time_limit is not None and self.step < self.total_steps
                            and distributed.all_true(time.perf_counter() - this_session > c.time_limit,
                                                     self.dist)):
                        if saved_at != self.step:
                            self.save()
                        stopped = "time_limit"
                        logger.warning("time limit of %.0f s reached at step %d of %d; checkpoint "
                                       "saved, continue with --resume", c.time_limit, self.step,
                                       self.total_steps)
                        break
        finally:
            bar.close()
            del stream, loader
        return self._summary(train_summary, eval_summary, stopped)

    def _log_eval(self) -> dict[str, Any] | None:
        result = self.evaluate()
        if result is not None and self.dist.is_main:
            self.metrics.write({"step": self.step, "split": "eval", **result,
                                "tokens_seen": self.tokens_seen, "elapsed": self.elapsed})
        return result

    def _log_start(self) -> None:
        n_params = count_parameters(self.model)
        logger.info("pre-training %s (%.1fM parameters, vocab %d) for %d steps of %d sequences "
                    "(%d processes × %d micro-batches), %s on %s, objective %s",
                    self.config.model if self.config.init is None else self.config.init,
                    n_params / 1e6, self.model_config.vocab_size, self.total_steps,
                    self.config.batch_size, self.dist.world_size, self.config.grad_accum,
                    self.precision, self.device, self.objective)

    def _summary(self, train: dict | None, evaluation: dict | None,
                 stopped: str | None) -> dict[str, Any]:
        summary = {
            "run_dir": str(self.run_dir),
            "model_dir": str(self.run_dir / state.MODEL),
            "steps": self.step,
            "total_steps": self.total_steps,
            "tokens_seen": self.tokens_seen,
            "elapsed_s": round(self.elapsed, 2),
            "tokens_per_s": self.tokens_seen / self.elapsed if self.elapsed > 0 else None,
            "precision": self.precision,
            "world_size": self.dist.world_size,
            "train": train,
            "eval": evaluation,
            "stopped": stopped,  # None (finished), or "time_limit" (resumable)
        }
        if self.dist.is_main:
            atomic_write_json(self.run_dir / SUMMARY_FILE, summary)
        return summary


def pretrain(config: PretrainConfig) -> dict[str, Any]:
    """Pre-train (or resume) a BERT per `config`; returns the run summary (also in summary.json).

    Under `torchrun` each process calls this with the same config; rank 0 writes all files.
    Raises ValueError / FileNotFoundError / FileExistsError for bad settings or inputs (before any
    training), TrainingDiverged when training has to stop on non-finite values, Interrupted (a
    KeyboardInterrupt) after SIGINT / SIGTERM once the current step is checkpointed.
    """
    info = distributed.init_distributed(config.device)
    try:
        summary = Trainer(config, info).run()
        # All ranks leave together: a rank that tore its process group down while rank 0 was still
        # writing the final files aborted now and then in gloo ("terminate called without an
        # active exception", SIGABRT; about 1 run in 7 of tests/test_ddp.py's resume).
        distributed.barrier(info)
        return summary
    finally:
        distributed.shutdown(info)
