"""Every setting of a pre-training run: `PretrainConfig`, written to RUN_DIR/pretrain_config.json;
what a run directory holds, and the rules for starting over in it or resuming it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.constants import TRAINING_PRECISIONS
from bertkit.data.shards import OBJECTIVES
from bertkit.encoder.config import BertConfig, check_override_keys
from bertkit.train import optim, state
from bertkit.util.fileio import check_writable_output, remove_outputs

CONFIG_FILE = "pretrain_config.json"
# What the data were prepared for, and ELECTRA's replaced-token detection, which needs only masks.
TRAINING_OBJECTIVES = (*OBJECTIVES, "rtd")
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
    # mlm | mlm+nsp | mlm+sop | rtd; None = what the data were prepared for (`bertkit prepare
    # --objective`). mlm on pair data trains the MLM alone and ignores the pair labels. rtd is
    # ELECTRA's replaced-token detection (train/pretrain/rtd.py) on any prepared data.
    objective: str | None = None
    # rtd only: the generator's width against the discriminator's (ELECTRA's figure 3: 1/4 to 1/2
    # works best) and the weight of the discriminator's loss (the paper's λ = 50).
    generator_size: float = 0.25
    rtd_weight: float = 50.0

    # --- length: exactly one of max_steps / epochs (neither = 1 epoch)
    max_steps: int | None = None
    epochs: float | None = None
    # --- batch: sequences per optimizer step over all ranks and micro-batches (BERT used 256)
    batch_size: int = 128
    grad_accum: int = 1  # micro-batches per optimizer step (to fit memory; same result)
    # Share of tokens selected for MLM. None = the family's: 0.15 as in the BERT paper, 0.30 for
    # ModernBERT (Warner et al. 2024, after Wettig et al. 2023, "Should you mask 15%?").
    mlm_probability: float | None = None

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
    # (bertkit.backend.precision: CPU flags mislead, bf16 ran at half the fp32 rate on one AVX-512 BF16 CPU)
    precision: str = "auto"
    compile: bool = False  # torch.compile the encoder layers (first steps are slower while it compiles)
    device: str = "auto"  # auto | cpu | cuda
    # DataLoader worker processes preparing batches ahead of the model. None = one on CUDA or
    # where a CPU core is left over by torch's threads, else none: on 2 cores with 2 threads a
    # worker competes with the compute and slows it (docs/design.md).
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
        if self.mlm_probability is not None and not 0 < self.mlm_probability < 1:
            problems.append(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        if self.precision not in TRAINING_PRECISIONS:
            problems.append(f"precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {self.precision!r}")
        if self.schedule not in optim.SCHEDULES:
            problems.append(f"schedule must be one of {', '.join(optim.SCHEDULES)}, got {self.schedule!r}")
        if self.num_workers is not None and self.num_workers < 0:
            problems.append(f"num_workers must be >= 0, got {self.num_workers!r}")
        if self.time_limit is not None and not self.time_limit > 0:
            problems.append(f"time_limit must be > 0 seconds, got {self.time_limit!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            problems.append(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if self.objective is not None and self.objective not in TRAINING_OBJECTIVES:
            problems.append(f"objective must be one of {', '.join(TRAINING_OBJECTIVES)}, got {self.objective!r}")
        if not 0 < self.generator_size <= 1:
            problems.append(f"generator_size must be in (0, 1], got {self.generator_size!r}")
        if not self.rtd_weight > 0:
            problems.append(f"rtd_weight must be > 0, got {self.rtd_weight!r}")
        if self.resume and self.overwrite:
            problems.append("resume and overwrite exclude each other; pass one")
        try:  # a typo such as hiden_dropout_prob fails here, before the data are read
            check_override_keys(self.model_overrides)
        except ValueError as err:
            problems.append(f"model_overrides (--model-arg): {err}")
        if problems:
            raise ValueError("invalid pre-training settings: " + "; ".join(problems))

    def resolved(self) -> "PretrainConfig":
        """A copy with the family defaults filled in (mlm_probability), as the run records them."""
        if self.mlm_probability is not None:
            return self
        return dataclasses.replace(self, mlm_probability=default_mlm_probability(self.init or self.model,
                                                                                 self.model_overrides))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PretrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown pre-training setting(s): {', '.join(unknown)}")
        return cls(**values)


def default_mlm_probability(model: str, overrides: dict[str, Any] | None = None) -> float:
    """The model family's mask rate (`Family.mlm_probability`: 0.30 for ModernBERT, else BERT's
    0.15); BERT's for a spec that does not resolve, which is left to the model's own error later."""
    try:
        config = BertConfig.resolve(model, **(overrides or {}))
    except (ValueError, OSError):
        config = BertConfig()
    return config.family.mlm_probability


# ---------------------------------------------------------------------------------------------
# The run directory
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
    # may be moved, and the data are compared by their digest (see `Trainer._resume`, trainer.py).
    state.check_same_settings(config.out, saved, config.to_dict(), source,
                              set(RESUMABLE_CHANGES) | {"data", "out"},
                              "Resume with the original settings, or start a new run with "
                              f"--init {Path(config.out) / state.MODEL}")
