"""Every setting of a fine-tuning run: `FinetuneConfig`, written to OUT_DIR/finetune_config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bertkit.constants import FINETUNE_TASKS
from bertkit.encoder.config import PRESETS
from bertkit.train import lora, state

# classify, pair, ner, qa (this file's settings), and embed, rerank, sparse (their trainers' own
# settings take the fields they share with these: `tasks.TaskRow.from_finetune`).
TASKS = FINETUNE_TASKS


@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run; written to OUT_DIR/finetune_config.json."""

    task: str  # classify | pair | ner | qa (embed | rerank | sparse: see `tasks.py`)
    model: str  # model directory, or a preset name for random init (needs `tokenizer`)
    train: str  # training file, or builtin:NAME[:SPLIT]
    out_dir: str
    eval: str | None = None  # scored after every epoch; picks the best epoch
    test: str | None = None  # scored once with the best model at the end
    tokenizer: str | None = None  # tokenizer directory (default: the model directory)

    # --- optimisation (BERT paper, appendix A.3: batch 16/32, lr 2e-5…5e-5, 2-4 epochs)
    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None  # peak rate; None = `default_lr` for the model's hidden size
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1  # share of the steps spent warming up, as the reference run_classifier
    max_grad_norm: float = 1.0
    freeze_encoder: bool = False  # train the head only (a linear probe of the encoder)
    # LoRA adapters instead of full fine-tuning: "r=8,alpha=16,dropout=0.05,targets=query,value"
    # (bertkit.train.lora); only the adapters and the head train.
    lora: str | None = None
    lora_save: str = "merged"  # merged: a plain checkpoint; adapters: PEFT's adapter files
    patience: int | None = None  # stop after this many epochs without a better eval score
    seed: int = 42

    # --- inputs
    max_length: int | None = None  # pieces per window; None = 128 (384 for qa)
    doc_stride: int | None = None  # pieces between window starts; None = half a window (128 for qa)
    # classify / pair evaluation (eval and test sets): every window of a long text, probabilities
    # averaged; False scores the first max_length pieces only, as training sees them and as a
    # plain transformers loop evaluates (BBC articles at 128 pieces: 7× fewer windows to run).
    # `predict` always reads every window.
    eval_windows: bool = True
    max_train_examples: int | None = None  # use the first N training examples (small budgets)
    text_column: str = "text"
    pair_column: str = "text_pair"
    label_column: str = "label"
    problem_type: str | None = None  # classify/pair: "regression" or "single_label_classification"
    tokens_key: str = "tokens"  # ner JSONL keys
    tags_key: str = "tags"
    ner_invalid: str = "skip"  # ner: "skip" sentences with broken BIO/BIOES, or "repair" them

    # --- qa (run_squad.py's defaults)
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_score_diff_threshold: float = 0.0
    version_2_with_negative: bool | None = None  # None: as the training file says

    # --- execution
    eval_batch_size: int = 64
    device: str = "auto"  # auto | cpu | cuda
    # auto = bf16 on CUDA; on CPU whichever of fp32 / bf16 a matmul probe measures faster here
    # (bertkit.backend.precision). bf16 is autocast: weights and optimizer state stay fp32.
    precision: str = "auto"
    progress: bool = True
    overwrite: bool = False
    # Steps between training states in OUT_DIR/checkpoints (one is also written after every
    # epoch); a tiny model's step takes milliseconds, a base model's on CPU about a second.
    save_every: int = 200
    resume: bool = False  # continue OUT_DIR from its training state

    def __post_init__(self) -> None:
        for name in ("model", "train", "out_dir", "eval", "test", "tokenizer"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, str(value))  # paths are stored as text in finetune_config.json
        if self.max_length is None:
            self.max_length = 384 if self.task == "qa" else 128
        self.validate()

    def validate(self) -> None:
        problems = []
        if self.task not in TASKS:
            problems.append(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        for name in ("epochs", "batch_size", "eval_batch_size", "max_length", "max_query_length",
                     "max_answer_length", "n_best", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("patience", "doc_stride", "max_train_examples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"{name} must be a positive integer or None, got {value!r}")
        problems += state.run_problems(lr=self.lr, warmup_ratio=self.warmup_ratio, resume=self.resume,
                                       overwrite=self.overwrite, precision=self.precision)
        if self.lora is not None:
            try:
                lora.LoraSpec.parse(self.lora)
            except ValueError as err:
                problems.append(str(err))
            if self.freeze_encoder:
                problems.append("lora and freeze_encoder exclude each other (LoRA freezes the encoder "
                                "itself and trains adapters in it); pass one")
        if self.lora_save not in lora.SAVE_MODES:
            problems.append(f"lora_save must be one of {', '.join(lora.SAVE_MODES)}, got {self.lora_save!r}")
        elif self.lora_save == "adapters" and self.lora is not None and self.model in PRESETS:
            problems.append(f"lora_save adapters needs a pre-trained --model directory to load them onto, "
                            f"not the preset {self.model!r} (random weights); use lora_save merged")
        if not isinstance(self.eval_windows, bool):
            problems.append(f"eval_windows must be True or False, got {self.eval_windows!r}")
        if self.ner_invalid not in ("skip", "repair"):
            problems.append(f"ner_invalid must be 'skip' or 'repair', got {self.ner_invalid!r}")
        if problems:
            raise ValueError("invalid fine-tuning settings: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
