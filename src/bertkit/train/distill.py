"""Knowledge distillation: a shallower student trained to match a teacher (Sanh et al. 2019, DistilBERT).

The student has the teacher's width and K of its L layers, copied from layers spread over the
depth (`spread_layers`: 12 → 6 takes [0, 2, 4, 7, 9, 11], as DistilBERT did); embeddings, pooler
and heads are copied too. Its loss is DistilBERT's recipe:

    loss = α_ce · KL(p_teacher ‖ p_student) · T²  +  α_hard · CE(student, labels)  +  α_cos · (1 − cos)

with p = softmax(logits / T), T = 2; the KL is PyTorch's `kl_div(log p_student, p_teacher)`
(DistilBERT's KLDivLoss, "batchmean": summed over classes, averaged over the predicted rows),
scaled by T² so its gradients keep the size of a T = 1 loss (Hinton et al. 2015); the cosine term
pulls the student's last hidden states toward the teacher's (mean of 1 − cos over real tokens).

Two modes:
  general  (`data`: a DATA_DIR made by `bertkit prepare`): MLM batches; the KL is over the
           vocabulary at the masked positions, the hard term is the student's MLM loss.
           Defaults α_ce 5, α_hard (α_mlm) 2, α_cos 1 (DistilBERT's published run).
  task     (`task` classify | ner, `teacher` a fine-tuned model, `train` its labelled data and
           optionally `unlabeled` texts): soft labels from the teacher on every example — rows
           for classify, first word pieces for ner; labelled examples add the hard cross-entropy.
           Defaults α_ce 1, α_hard 0 (soft labels only), α_cos 0.

A run writes to OUT_DIR: distill_config.json, metrics.jsonl (a train line every `log_every` steps
with each loss term; an eval line per epoch in task mode), checkpoints/step-N (atomic, the newest
kept; `resume` continues exactly: the same per-step losses as an uninterrupted run), model/ (the
student, a Hugging Face directory with the tokenizer) and summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.backend.precision import autocast, resolve_precision
from bertkit.constants import DISTILL_TASKS, IGNORE_INDEX
from bertkit.data.formats.common import pad_batch
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.checkpoint import load_into, read_state_dict
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import task_class
from bertkit.encoder.model import BertForMaskedLM
from bertkit.train import finetune as ft
from bertkit.train import optim, state
from bertkit.train.card import distill_card
from bertkit.util.fileio import atomic_write_json, model_directory

log = logging.getLogger(__name__)

CONFIG_FILE = "distill_config.json"
SUMMARY_FILE = "summary.json"
RUN_OUTPUTS = (CONFIG_FILE, SUMMARY_FILE, state.METRICS, state.CHECKPOINTS, state.MODEL, "tokenizer")
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "save_every", "out_dir", "eval_batch_size"}
# Labels of unlabeled NER words: a first piece to distil at, with no gold tag (hard loss skips it).
UNLABELED_WORD = -99
DEFAULT_ALPHAS = {"general": (5.0, 2.0, 1.0), "task": (1.0, 0.0, 0.0)}  # (α_ce, α_hard, α_cos)


@dataclass
class DistillConfig:
    """Every setting of a distillation run; written to OUT_DIR/distill_config.json."""

    teacher: str  # model directory: pre-trained (general) or fine-tuned (task)
    out_dir: str
    task: str | None = None  # None: general distillation on `data`; classify | ner: task distillation
    data: str | None = None  # general: DATA_DIR of `bertkit prepare`
    train: str | None = None  # task: labelled training file or builtin:NAME[:SPLIT]
    unlabeled: str | None = None  # task: more inputs without labels (teacher soft labels only)
    eval: str | None = None  # task: scored after every epoch
    test: str | None = None  # task: scored at the end
    student_layers: int = 6
    layers: list[int] | None = None  # the teacher layers to copy; None = `spread_layers`

    temperature: float = 2.0
    alpha_ce: float | None = None  # None: 5 (general) / 1 (task)
    alpha_hard: float | None = None  # MLM (general) or label cross-entropy (task); None: 2 / 0
    alpha_cos: float | None = None  # None: 1 (general) / 0 (task)

    epochs: int = 3
    max_steps: int | None = None  # stop after this many steps (before the epochs end)
    batch_size: int = 32
    lr: float = 5e-4  # DistilBERT's peak rate
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    max_grad_norm: float = 5.0  # DistilBERT's clipping
    seed: int = 42
    max_length: int = 128  # task: pieces per example
    mlm_probability: float = 0.15  # general: dynamic masking of the prepared data
    max_train_examples: int | None = None

    log_every: int = 10
    save_every: int = 200
    eval_batch_size: int = 64
    device: str = "auto"
    precision: str = "auto"
    progress: bool = True
    overwrite: bool = False
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("teacher", "out_dir", "data", "train", "unlabeled", "eval", "test"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, str(value))
        if self.layers is not None:
            self.layers = [int(i) for i in self.layers]
        mode = "general" if self.task is None else "task"
        for name, default in zip(("alpha_ce", "alpha_hard", "alpha_cos"), DEFAULT_ALPHAS[mode]):
            if getattr(self, name) is None:
                setattr(self, name, default)
        self.validate()

    @property
    def mode(self) -> str:
        return "general" if self.task is None else "task"

    def validate(self) -> None:
        problems = []
        if self.task is not None and self.task not in DISTILL_TASKS:
            problems.append(f"task {self.task!r} cannot be distilled; choose {' or '.join(DISTILL_TASKS)}, "
                            "or leave it out for general distillation on --data")
        if self.task is None and self.data is None:
            problems.append("general distillation needs --data DATA_DIR (from `bertkit prepare`); "
                            "for task distillation pass --task and --train")
        if self.task is not None and self.train is None:
            problems.append(f"task distillation (--task {self.task}) needs --train FILE")
        if self.task is not None and self.data is not None:
            problems.append("--data is for general distillation; with --task pass --train (and --unlabeled)")
        for name in ("student_layers", "epochs", "batch_size", "max_length", "log_every", "save_every",
                     "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_steps", "max_train_examples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"{name} must be a positive integer or None, got {value!r}")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0, got {self.temperature!r}")
        for name in ("alpha_ce", "alpha_hard", "alpha_cos"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.alpha_ce + self.alpha_hard + self.alpha_cos == 0:
            problems.append("alpha_ce, alpha_hard and alpha_cos are all 0: nothing to learn")
        problems += state.run_problems(lr=self.lr, warmup_ratio=self.warmup_ratio, resume=self.resume,
                                       overwrite=self.overwrite, precision=self.precision)
        if problems:
            raise ValueError("invalid distillation settings: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# The student
# ---------------------------------------------------------------------------------------------
def spread_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """K teacher layers spread evenly over L, first and last included: round(i (L−1) / (K−1)).

    12 → 6: [0, 2, 4, 7, 9, 11] (DistilBERT's choice); 6 → 3: [0, 2, 5]; K = 1: [0]."""
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(f"student_layers {student_layers} must be between 1 and the teacher's "
                         f"{teacher_layers} layers")
    if student_layers == 1:
        return [0]
    return [round(i * (teacher_layers - 1) / (student_layers - 1)) for i in range(student_layers)]


_LAYER = re.compile(r"^bert\.layers\.(\d+)\.(.*)$")


def student_from_teacher(teacher: nn.Module, layers: list[int]) -> nn.Module:
    """A model of the teacher's class and width with len(layers) layers: layer i is a copy of the
    teacher's layer layers[i]; everything outside the layers (embeddings, pooler, heads) is copied."""
    config: BertConfig = teacher.config
    if config.family.shares_layers:
        raise ValueError("ALBERT shares one set of layer weights across its depth: there are no "
                         "distinct layers to pick; distil a BERT, RoBERTa or DistilBERT teacher")
    depth = config.num_hidden_layers
    bad = [i for i in layers if not 0 <= i < depth]
    if bad or not layers or sorted(set(layers)) != list(layers):
        raise ValueError(f"layers {layers} must be increasing teacher layer numbers in 0..{depth - 1}")
    student = type(teacher)(config.replace(num_hidden_layers=len(layers)))
    source = teacher.state_dict()
    copied: dict[str, torch.Tensor] = {}
    for name, tensor in source.items():
        match = _LAYER.match(name)
        if match is None:
            copied[name] = tensor.detach().clone()
        elif int(match.group(1)) in layers:
            copied[f"bert.layers.{layers.index(int(match.group(1)))}.{match.group(2)}"] = tensor.detach().clone()
    student.load_state_dict(copied, strict=True)
    return student


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(p_teacher ‖ p_student) · T² at temperature T, summed over classes, averaged over rows.

    student_logits, teacher_logits: (M, C). Returns () fp32; 0 for M = 0."""
    if student_logits.shape[0] == 0:
        return student_logits.float().sum() * 0.0
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (M, C)
    p_teacher = F.softmax(teacher_logits.float() / temperature, dim=-1)  # (M, C)
    return F.kl_div(log_p_student, p_teacher, reduction="batchmean") * temperature ** 2


def cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> torch.Tensor:
    """Mean of 1 − cos(student, teacher) over the rows: (N, H) each → () fp32 (PyTorch's
    CosineEmbeddingLoss with target 1, as DistilBERT)."""
    return (1 - F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)).mean()


@dataclass
class StepLosses:
    total: torch.Tensor  # () the weighted sum that is back-propagated
    ce: torch.Tensor  # () soft cross-entropy (KL · T²)
    hard: torch.Tensor  # () MLM (general) or label cross-entropy (task)
    cos: torch.Tensor  # () 1 − cos of last hidden states

    def values(self) -> dict[str, float]:
        return {"loss": self.total.item(), "ce": self.ce.item(), "hard": self.hard.item(), "cos": self.cos.item()}


def _combine(config: DistillConfig, ce, hard, cos) -> StepLosses:
    total = config.alpha_ce * ce + config.alpha_hard * hard + config.alpha_cos * cos
    return StepLosses(total=total, ce=ce, hard=hard, cos=cos)


def general_losses(config: DistillConfig, student: nn.Module, teacher: nn.Module,
                   batch: dict[str, torch.Tensor]) -> StepLosses:
    """MLM models on one pre-training batch (input_ids, token_type_ids, attention_mask,
    mlm_labels (B, T), -100 where nothing is predicted)."""
    from bertkit.encoder.model import mlm_logits_and_loss

    ids, segments, mask, labels = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                   batch["mlm_labels"])
    s_hidden = student.bert(ids, segments, mask).last_hidden_state  # (B, T, H)
    s_logits, mlm, _ = mlm_logits_and_loss(student.mlm, student.bert.embeddings.word_embeddings.weight,
                                           s_hidden, labels)  # (M, V)
    with torch.no_grad():
        t_hidden = teacher.bert(ids, segments, mask).last_hidden_state  # (B, T, H)
        t_logits, _, _ = mlm_logits_and_loss(teacher.mlm, teacher.bert.embeddings.word_embeddings.weight,
                                             t_hidden, labels)  # (M, V)
    real = mask.bool()  # (B, T)
    return _combine(config, soft_cross_entropy(s_logits, t_logits, config.temperature), mlm,
                    cosine_loss(s_hidden[real], t_hidden[real]))


def _task_outputs(model: nn.Module, task: str, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, last hidden states (B, T, H)) of a classify or ner model."""
    out = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    if task == "classify":
        return model.sentence_logits(out.last_hidden_state[:, 0], out.pooler_output), out.last_hidden_state  # (B, K)
    return model.classifier(model.dropout(out.last_hidden_state)), out.last_hidden_state  # (B, T, K)


def task_losses(config: DistillConfig, student: nn.Module, teacher: nn.Module,
                batch: dict[str, torch.Tensor]) -> StepLosses:
    """classify: labels (B,) long, -100 for unlabeled rows; ner: labels (B, T) long, -100 where
    nothing is predicted, `UNLABELED_WORD` on the first piece of an unlabeled word."""
    labels = batch["labels"]
    s_logits, s_hidden = _task_outputs(student, config.task, batch)
    with torch.no_grad():
        t_logits, t_hidden = _task_outputs(teacher, config.task, batch)
    if config.task == "classify":
        soft_rows = torch.ones_like(labels, dtype=torch.bool)  # (B,) every row has soft labels
    else:
        soft_rows = labels != IGNORE_INDEX  # (B, T) first pieces of words
    gold = labels >= 0
    ce = soft_cross_entropy(s_logits[soft_rows], t_logits[soft_rows], config.temperature)
    hard = (F.cross_entropy(s_logits[gold].float(), labels[gold]) if bool(gold.any())
            else s_logits.float().sum() * 0.0)
    real = batch["attention_mask"].bool()
    return _combine(config, ce, hard, cosine_loss(s_hidden[real], t_hidden[real]))


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
class _GeneralData:
    """Pre-training batches of DATA_DIR; micro-step k of the run is batch k mod n of epoch k // n."""

    def __init__(self, config: DistillConfig, teacher_vocab: int):
        from bertkit.data.shards import PretrainingBatches, PretrainingData

        self.data = PretrainingData(config.data, "train")
        if self.data.vocab_size != teacher_vocab:
            raise ValueError(f"{config.data} was prepared with a vocabulary of {self.data.vocab_size} "
                             f"but the teacher's has {teacher_vocab}; prepare the data with the "
                             f"teacher's tokenizer (--tokenizer {config.teacher})")
        self._make = lambda epoch: PretrainingBatches(self.data, config.batch_size, seed=config.seed,
                                                      epoch=epoch, mlm_probability=config.mlm_probability)
        self._epoch, self._batches = 0, self._make(0)
        self.per_epoch = len(self._batches)
        self.digest = json.dumps(self.data.meta, sort_keys=True, default=str)

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(k, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._make(epoch)
        return self._batches[i]


class _TaskData:
    """Features of the labelled (and unlabeled) inputs; each epoch's order is drawn from
    (seed, epoch) alone, so a resumed run regenerates it."""

    def __init__(self, config: DistillConfig, runner: ft.Task):
        self.config, self.pieces = config, runner.pieces
        train, self.report = runner.read(config.train, training=True)
        if config.max_train_examples:
            train = train[:config.max_train_examples]
        features = runner.train_features(train, config.train)
        if config.unlabeled:
            features += self._unlabeled(runner, config.unlabeled)
        if not features:
            raise ValueError(f"{config.train}: no training features could be made")
        self.features = features
        self.per_epoch = math.ceil(len(features) / config.batch_size)
        self._epoch, self._order = None, None
        self.digest = ft.features_digest(features)

    def _unlabeled(self, runner, spec: str) -> list[dict]:
        from bertkit.data.formats import classify, ner

        examples, _ = runner.read(spec, training=False, labelled_rows=False)
        if self.config.task == "classify":
            rows = classify.classify_features(examples, self.pieces, self.config.max_length)
            return [{**row, "labels": IGNORE_INDEX} for row in rows]
        if examples and isinstance(examples[0], tuple):  # raw text lines: the tokenizer splits words
            sentences = [ner.NerSentence(s.words, None) for s in ner.split_words(self.pieces, [t for t, _ in examples])]
        else:
            sentences = list(examples)
        outside = {name: i for i, name in enumerate(runner.names)}
        tagged = [ner.NerSentence(list(s.words), ["O"] * len(s.words)) for s in sentences]
        encoded = ner.ner_features(tagged, self.pieces, self.config.max_length, label2id=outside)
        rows = []
        for feature in encoded.features:  # every first piece is a word to distil at, with no gold tag
            labels = [UNLABELED_WORD if x != IGNORE_INDEX else IGNORE_INDEX for x in feature["labels"]]
            if any(x == UNLABELED_WORD for x in labels):
                rows.append({**feature, "labels": labels})
        return rows

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(k, self.per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = ft.shuffled_batches(self.features, self.config.batch_size,
                                              random.Random(self.config.seed * 1000 + epoch))
        return pad_batch([self.features[j] for j in self._order[i]], self.pieces.pad_id)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def _load_teacher(config: DistillConfig) -> nn.Module:
    directory = model_directory(config.teacher, "--teacher")
    cls = BertForMaskedLM if config.task is None else task_class(config.task)
    if config.task is not None and not BertConfig.from_json(directory).id2label:
        raise ValueError(f"--teacher {directory} has no labels (id2label): task distillation needs a "
                         f"teacher fine-tuned with `bertkit finetune --task {config.task}`")
    teacher = cls.from_pretrained(directory)
    missing = [n for n in (teacher.load_report.missing if teacher.load_report else [])]
    if missing:
        raise ValueError(f"--teacher {directory} lacks {len(missing)} tensors of its "
                         f"{cls.__name__} (first: {missing[0]}): a teacher must be complete, "
                         "not partly random")
    return teacher


def distill(config: DistillConfig) -> dict[str, Any]:
    """Run one distillation (see the module docstring); returns summary.json's content."""
    from tqdm.auto import tqdm

    out = state.check_run_outputs(config.out_dir, RUN_OUTPUTS, overwrite=config.overwrite, resume=config.resume)
    teacher = _load_teacher(config)
    layers = config.layers or spread_layers(teacher.config.num_hidden_layers, config.student_layers)
    torch.manual_seed(config.seed)
    student = student_from_teacher(teacher, layers)

    runner, evaluation, test = None, None, None
    if config.mode == "general":
        data = _GeneralData(config, teacher.config.vocab_size)
        tokenizer_dir = data.data.tokenizer_dir
        losses_of = general_losses
    else:
        tokenizer = BertTokenizer.from_pretrained(config.teacher)
        settings = ft.FinetuneConfig(task=config.task, model=config.teacher, train=config.train,
                                     out_dir=config.out_dir, max_length=config.max_length,
                                     eval_batch_size=config.eval_batch_size, progress=config.progress)
        runner = ft.TASK_CLASSES[config.task](settings, tokenizer)
        runner.load_labels(teacher.config)
        if config.task == "classify" and runner.space.regression:
            raise ValueError(f"{config.teacher} is a regression model; distil a classifier (soft "
                             "labels need classes)")
        data = _TaskData(config, runner)
        evaluation = runner.read(config.eval, training=False) if config.eval else None
        test = runner.read(config.test, training=False) if config.test else None
        # Only the tokenizer's files: checkpoints copy every file of this directory next to the
        # student's weights, so the teacher's directory itself would bring its model.safetensors.
        tokenizer_dir = Path(config.out_dir) / "tokenizer"
        losses_of = task_losses

    total = data.per_epoch * config.epochs
    if config.max_steps:
        total = min(total, config.max_steps)
    device = ft.device_for(config.device)
    precision = resolve_precision(config.precision, device)
    teacher.to(device).eval()
    student.to(device).train()
    optimizer = optim.build_optimizer(student, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    metrics = state.MetricsLog(out)
    step, seconds, records = 0, 0.0, []
    window = {"loss": 0.0, "ce": 0.0, "hard": 0.0, "cos": 0.0, "n": 0}

    resume_from = (state.resume_checkpoint(out, config.to_dict(), out / CONFIG_FILE, RESUMABLE_CHANGES)
                   if config.resume else None)
    if resume_from is not None:
        saved = state.load_trainer_state(resume_from)
        if saved.get("data_digest") != data.digest:
            raise ValueError(f"{resume_from} was trained on other inputs than the run has now; resume "
                             "with the original data, or start over with --overwrite")
        load_into(student, read_state_dict(resume_from), str(resume_from))
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["scheduler"])
        step, seconds = int(saved["step"]), float(saved["seconds"])
        window, records = json.loads(saved["window"]), json.loads(saved["records"])
        precision = saved.get("precision", precision)
        state.restore_rng_state(saved["rng"])
        metrics.truncate_after(step)
        log.info("resuming from %s (step %d of %d)", resume_from, step, total)
    else:
        out.mkdir(parents=True, exist_ok=True)
        for name in (state.METRICS, SUMMARY_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / state.CHECKPOINTS, ignore_errors=True)
    atomic_write_json(out / CONFIG_FILE, config.to_dict())
    if config.mode == "task":
        tokenizer.save_pretrained(tokenizer_dir)

    def save() -> None:
        state.save_checkpoint(out, step, student, tokenizer_dir, {
            "format": 1, "step": step, "seconds": seconds, "optimizer": optimizer.state_dict(),
            "scheduler": schedule.state_dict(), "rng": state.capture_rng_state(), "precision": precision,
            "data_digest": data.digest, "window": json.dumps(window), "records": json.dumps(records)},
            keep=1)

    def evaluate() -> dict[str, Any]:
        student.eval()
        with autocast(device, precision):
            scores = runner.evaluate(student, evaluation[0], config.eval)
        student.train()
        return scores

    bar = tqdm(total=total, initial=step, desc="distill", unit="step", disable=not config.progress,
               dynamic_ncols=True)
    tick = time.time()
    while step < total:
        batch = {k: v.to(device) for k, v in data.batch(step).items()}
        lr = optimizer.param_groups[0]["lr"]
        with autocast(device, precision):
            losses = losses_of(config, student, teacher, batch)
        if not torch.isfinite(losses.total):
            raise FloatingPointError(f"the distillation loss became {float(losses.total)} at step "
                                     f"{step + 1}; lower --lr")
        losses.total.backward()
        if config.max_grad_norm:
            nn.utils.clip_grad_norm_(student.parameters(), config.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        for key, value in losses.values().items():
            window[key] += value
        window["n"] += 1
        bar.update(1)
        if step % config.log_every == 0 or step == total:
            n = window.pop("n")
            record = {"split": "train", "step": step, "lr": lr, **{k: v / n for k, v in window.items()}}
            metrics.write(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
            window = {"loss": 0.0, "ce": 0.0, "hard": 0.0, "cos": 0.0, "n": 0}
        if evaluation is not None and (step % data.per_epoch == 0 or step == total):
            record = {"split": "eval", "step": step, "epoch": math.ceil(step / data.per_epoch), **evaluate()}
            records.append(record)
            metrics.write(record)
        if step % config.save_every == 0 or step == total:
            seconds += time.time() - tick
            tick = time.time()
            save()
    bar.close()

    summary: dict[str, Any] = {"status": "done", "mode": config.mode, "task": config.task,
                               "teacher": config.teacher, "teacher_layers": teacher.config.num_hidden_layers,
                               "layers": layers, "steps": step, "precision": precision,
                               "student_parameters": sum(p.numel() for p in student.parameters()),
                               "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
                               "model": str(out / state.MODEL), "seconds": round(seconds, 2)}
    if records:
        summary["eval"] = records[-1]
    if test is not None:
        student.eval()
        with autocast(device, precision):
            summary["test"] = runner.evaluate(student, test[0], config.test)
    if config.mode == "task":
        summary["data"] = {"train": data.report.to_dict(), "features": len(data.features)}
    atomic_write_json(out / SUMMARY_FILE, summary)
    distill_card(out)
    return summary


__all__ = ["DistillConfig", "distill", "spread_layers", "student_from_teacher", "soft_cross_entropy",
           "cosine_loss", "general_losses", "task_losses", "StepLosses"]
