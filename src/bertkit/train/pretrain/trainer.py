"""The pre-training run: MLM (+ NSP) or ELECTRA's replaced-token detection on prepared shards,
resumable exactly, one process or many.

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
import json
import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from bertkit.backend.precision import autocast, resolve_precision
from bertkit.constants import IGNORE_INDEX
from bertkit.data.shards import PretrainingBatches, PretrainingData
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.checkpoint import load_into, read_state_dict
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertForPreTraining, count_parameters
from bertkit.train import optim, state
from bertkit.train.card import pretrain_card
from bertkit.train.pretrain.batches import (
    STATS,
    RunBatches,
    batch_stats,
    data_digest,
    evaluation_sums,
    loader_workers,
    make_loader,
    summarise,
    to_device,
)
from bertkit.train.pretrain.config import (
    CONFIG_FILE,
    SUMMARY_FILE,
    PretrainConfig,
    TrainingDiverged,
    check_resume_config,
    prepare_run_dir,
)
from bertkit.train.pretrain.rtd import ReplacedTokenDetection
from bertkit.util import distributed
from bertkit.util.fileio import atomic_write_json, model_directory

logger = logging.getLogger(__name__)


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
        config = config.resolved()  # the family's masking rate when none is given
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
        init_tokenizer = (BertTokenizer.from_pretrained(model_directory(config.init, "--init"))
                          if config.init else None)
        self.data = PretrainingData(data_dir, "train", tokenizer=init_tokenizer)
        self.eval_data = None
        eval_size = self.data.meta["splits"].get("eval", {}).get("num_instances", 0)
        if eval_size >= self.rank_batch_size * world:
            self.eval_data = PretrainingData(data_dir, "eval")
        else:
            logger.warning("%s has %d held-out instances, fewer than one batch of %d; training "
                           "without evaluation", data_dir, eval_size, self.rank_batch_size * world)
        self.objective = config.objective or self.data.objective
        if self.objective not in ("mlm", "rtd") and self.objective != self.data.objective:
            raise ValueError(f"--objective {self.objective} needs data prepared for it; {data_dir} was "
                             f"prepared for {self.data.objective}: run `bertkit prepare --objective "
                             f"{self.objective}`")
        self.use_nsp = self.objective not in ("mlm", "rtd")
        self.rtd_weight = config.rtd_weight if self.objective == "rtd" else 0.0
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
    def _build_model(self) -> BertForPreTraining | ReplacedTokenDetection:
        """A new model of `config.model` sized to the data's vocabulary, or the `init` checkpoint;
        for rtd, a generator and an ELECTRA discriminator of that shape."""
        c = self.config
        vocab = self.data.vocab_size
        if self.objective == "rtd":
            if c.init is not None:
                raise ValueError("--objective rtd starts from new weights; --init is not supported "
                                 "with it (continue a run with --resume)")
            config = BertConfig.resolve(c.model, **{**c.model_overrides, "vocab_size": vocab})
            model = ReplacedTokenDetection(config, c.generator_size, c.rtd_weight)
        elif c.init is not None:
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
        if isinstance(self.model, ReplacedTokenDetection):
            self.model.load_directory(checkpoint)
        else:
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
        return summarise(total, self.rtd_weight)

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
        stats = torch.zeros(len(STATS), dtype=torch.float64, device=self.device)
        for k, cpu_batch in enumerate(micro_batches):
            batch = to_device(cpu_batch, self.device)
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
                if out.rtd_loss is not None:  # a mean over real tokens: weighted by this share of them
                    loss = loss + self.rtd_weight * out.rtd_loss * (counts[k, 2].item() / max(tokens, 1.0))
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
            compile_layers = getattr(self.model, "compile_layers", self.model.bert.compile_layers)
            compile_layers()

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
        window = torch.zeros(len(STATS), dtype=torch.float64, device=self.device)
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
                            train_summary = summarise(window, self.rtd_weight)
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
            pretrain_card(self.run_dir)
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
        distributed.leave_together(info)  # not before rank 0 has written its last files
        return summary
    finally:
        distributed.shutdown(info)
