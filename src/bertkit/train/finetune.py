"""Fine-tuning on the four downstream task types, and prediction with the result.

`finetune(task, model, train, out_dir, eval_file=..., ...)` trains a task head on a pre-trained
encoder (Devlin et al. 2019, section 4): full fine-tuning with AdamW, linear warmup then linear
decay, or the head alone with `freeze_encoder`. The peak learning rate defaults by the model's
width (`default_lr`): 3e-5 for BERT-base and wider (the paper searched 2e-5 … 5e-5), higher
for the small models, which learn next to nothing in an epoch at base's rate. After every epoch the eval set is scored; the best model so far is written to
OUT_DIR at once, so a crash or a kill later loses nothing already learned; `patience` epochs
without improvement stop the run.

Resumable exactly, as pre-training is: every `save_every` steps and after every epoch a training
state (weights, optimizer, schedule, the batch order's generator, torch / Python / NumPy RNG
states, the epoch's running loss, the epoch records) is written atomically to
OUT_DIR/checkpoints/step-N (only the newest is kept). `resume=True` continues from it: a run
killed at any moment, even by SIGKILL, and resumed repeats the uninterrupted run's per-step
losses. The state is removed once the run has finished.

OUT_DIR is a Hugging Face model directory (config.json with id2label / label2id,
model.safetensors, tokenizer files) that `transformers`' matching `BertFor…` class loads with the
same predictions, plus:
  finetune_config.json   every setting of the run (`predict` reads the task and lengths from it)
  metrics.jsonl          one line per epoch: train loss, learning rate, eval metrics
  steps.jsonl            one line per optimizer step: epoch, loss, learning rate
  eval.json              the best epoch's eval metrics, test metrics of the best model, data
                         reports; on a crash, the error and what had been saved

`model` is a model directory or a preset name (tiny … large) for a randomly initialised encoder of
that size, whose tokenizer then comes from `tokenizer`. Data come from files (see
`bertkit.data.tasks`) or built-in sets (`builtin:NAME[:SPLIT]`, see `bertkit.data.labelled`): a
built-in train split brings its dev split as eval set and its test split as test set.

`predict(model_dir, input_file, out_file)` runs a fine-tuned directory over a file, with the
same windows and decoding as evaluation, and writes one JSON line per input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from bertkit import metrics
from bertkit.checkpoint import check_architecture, load_into, read_state_dict, to_hf_state_dict
from bertkit.config import PRESETS, BertConfig
from bertkit.data import labelled
from bertkit.data.tasks import classify, ner, qa
from bertkit.data.tasks.common import (IGNORE_INDEX, DataReport, WordPieces, forward_batches, pad_batch,
                                       read_text)
from bertkit.fileio import atomic_write_json, atomic_write_text, check_writable_output, missing_model_dir
from bertkit.heads import HEADS
from bertkit.precision import PRECISIONS, autocast, resolve_precision
from bertkit.train import distributed, lora, optim, state as train_state

log = logging.getLogger(__name__)

TASKS = ("classify", "pair", "ner", "qa")
RETRIEVAL_TASKS = ("embed", "rerank")  # bi-encoder / cross-encoder: bertkit.train.retrieval
CONFIG_FILE = "finetune_config.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
STEPS_FILE = "steps.jsonl"
# Files a run writes into OUT_DIR; an existing one is only replaced with `overwrite`.
RUN_OUTPUTS = ("config.json", "model.safetensors", CONFIG_FILE, METRICS_FILE, EVAL_FILE, STEPS_FILE,
               train_state.CHECKPOINTS)
# Settings that may change when a run is resumed: they do not alter the sequence of updates.
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "eval_batch_size", "save_every",
                     "out_dir"}
HEAD_PREFIXES = ("classifier.", "qa_outputs.")  # Hugging Face names of the task heads' tensors


@dataclass
class FinetuneConfig:
    """Every setting of a fine-tuning run; written to OUT_DIR/finetune_config.json."""

    task: str  # classify | pair | ner | qa
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
    # (bertkit.precision). bf16 is autocast: weights and optimizer state stay fp32.
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
        if self.task not in TASKS + RETRIEVAL_TASKS:
            problems.append(f"unknown task {self.task!r}; choose one of {', '.join(TASKS + RETRIEVAL_TASKS)}")
        for name in ("epochs", "batch_size", "eval_batch_size", "max_length", "max_query_length",
                     "max_answer_length", "n_best", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("patience", "doc_stride", "max_train_examples"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"{name} must be a positive integer or None, got {value!r}")
        if self.lr is not None and not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.resume and self.overwrite:
            problems.append("resume and overwrite exclude each other; pass one")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
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


# ---------------------------------------------------------------------------------------------
# Tasks: reading, labels, features, evaluation and prediction behind one interface
# ---------------------------------------------------------------------------------------------
def _read_builtin(spec: str, task: str, default_split: str) -> tuple[list, DataReport] | None:
    found = labelled.resolve_builtin(spec, default_split)
    if found is None:
        return None
    name, split = found
    wanted = "classify" if task in ("classify", "pair") else task
    if labelled.labelled_set(name).task != wanted or task == "pair":
        raise ValueError(f"{spec} is a {labelled.labelled_set(name).task} data set; use it with "
                         f"--task {labelled.labelled_set(name).task}")
    items = labelled.load_labelled(name, split)
    return items, DataReport(spec, n_kept=len(items))


class ClassifyTask:
    """Single texts (`classify`) and text pairs (`pair`): classes or regression."""

    def __init__(self, config: FinetuneConfig, pieces: WordPieces):
        self.config, self.pieces = config, pieces
        self.pair = config.task == "pair"
        self.columns = classify.ClassifyColumns(config.text_column, config.pair_column, config.label_column)
        self.space: classify.LabelSpace | None = None
        self.notes: dict[str, Any] = {}  # facts about the training data for eval.json

    def read(self, spec: str, *, training: bool, labelled_rows: bool = True):
        found = _read_builtin(spec, self.config.task, "train" if training else "dev")
        if found:
            return found
        if not labelled_rows and str(spec).endswith(".txt"):
            if self.pair:  # a line is one text; a pair model would silently see half its input
                raise ValueError(f"{spec}: a .txt file holds single texts (one a line), but the model "
                                 "is for text pairs (task pair); give a CSV / TSV / JSONL file with "
                                 f"columns {self.config.text_column!r} and {self.config.pair_column!r}")
            return _read_text_lines(spec, lambda text, where: classify.ClassifyExample(text, None, None, where))
        return classify.read_classify(spec, pair=self.pair, columns=self.columns, labelled=labelled_rows)

    def setup_labels(self, train: Sequence, known: dict[str, int] | None) -> dict[str, Any]:
        self.space = classify.LabelSpace.infer(train, self.config.problem_type, known,
                                               column=self.config.label_column)
        self.notes["labels"] = self.space.describe(self.config.label_column)
        log.info("%s", self.notes["labels"])  # say what was inferred: it decides the head
        return {"id2label": self.space.id2label, "label2id": self.space.label2id,
                "problem_type": "regression" if self.space.regression else "single_label_classification"}

    def load_labels(self, model_config: BertConfig) -> None:
        regression = model_config.problem_type == "regression" or model_config.num_labels == 1
        if not regression and model_config.id2label is None:
            raise ValueError(f"{self.config.model} has no labels (no id2label in config.json): it "
                             "is not a fine-tuned classifier; fine-tune it first with `bertkit "
                             f"finetune --task {self.config.task}`")
        self.space = classify.LabelSpace(None if regression else
                                         [model_config.id2label[i] for i in sorted(model_config.id2label)])

    def train_features(self, examples: Sequence, source: str) -> list[dict]:
        return classify.classify_features(examples, self.pieces, self.config.max_length,
                                          label_ids=self.space.encode(examples, source))

    def main_metric(self) -> tuple[str, bool]:
        return ("mse", False) if self.space.regression else ("accuracy", True)

    def check_labels(self, examples: Sequence, source: str) -> None:
        self.space.encode(examples, source)

    def _scores(self, model: nn.Module, examples: Sequence, windows: bool = True) -> torch.Tensor:
        features = classify.classify_features(examples, self.pieces, self.config.max_length,
                                              windows=windows, stride=self.config.doc_stride)
        out = forward_batches(model, features, pad_id=self.pieces.pad_id,
                              batch_size=self.config.eval_batch_size, progress=self.config.progress)
        return classify.aggregate_windows(out["logits"], features, len(examples), self.space.regression)

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        gold = self.space.encode(examples, source)
        scores = self._scores(model, examples, self.config.eval_windows)  # (N, C)
        if self.space.regression:
            pred = scores[:, 0]
            target = torch.tensor(gold)
            pearson = float(torch.corrcoef(torch.stack([pred, target]))[0, 1]) if len(gold) > 1 else float("nan")
            return {"mse": float(((pred - target) ** 2).mean()), "pearson": pearson, "n": len(gold)}
        pred = scores.argmax(-1).tolist()
        return {"accuracy": metrics.accuracy(pred, gold), "macro_f1": metrics.macro_f1(pred, gold),
                "n": len(gold)}

    def predict(self, model: nn.Module, examples: Sequence) -> list[dict[str, Any]]:
        scores = self._scores(model, examples)
        rows = []
        for example, row in zip(examples, scores.tolist()):
            out: dict[str, Any] = {"text": example.text}
            if example.text_pair is not None:
                out["text_pair"] = example.text_pair
            if self.space.regression:
                out["value"] = row[0]
            else:
                out["label"] = self.space.names[max(range(len(row)), key=row.__getitem__)]
                out["scores"] = dict(zip(self.space.names, row))
            rows.append(out)
        return rows


class NerTask:
    """Token classification with BIO / BIOES tags."""

    def __init__(self, config: FinetuneConfig, pieces: WordPieces):
        self.config, self.pieces = config, pieces
        self.scheme: str | None = None
        self.names: list[str] | None = None
        self.notes: dict[str, Any] = {}

    def read(self, spec: str, *, training: bool, labelled_rows: bool = True):
        found = _read_builtin(spec, "ner", "train" if training else "dev")
        if found:
            if training:
                self.scheme = "BIO"
            return found
        if not labelled_rows and str(spec).endswith(".txt"):
            return _read_text_lines(spec, lambda text, where: (text, where))
        sentences, report, scheme = ner.read_ner(
            spec, labelled=labelled_rows, tokens_key=self.config.tokens_key, tags_key=self.config.tags_key,
            invalid=self.config.ner_invalid)
        if training:
            self.scheme = scheme
        return sentences, report

    def setup_labels(self, train: Sequence, known: dict[str, int] | None) -> dict[str, Any]:
        self.names = ner.label_names(train, self.scheme or "BIO", known)
        return {"id2label": dict(enumerate(self.names)), "label2id": {n: i for i, n in enumerate(self.names)}}

    def load_labels(self, model_config: BertConfig) -> None:
        if model_config.id2label is None:
            raise ValueError(f"{self.config.model} has no tags (no id2label in config.json): it is "
                             "not a fine-tuned tagger; fine-tune it first with `bertkit finetune "
                             "--task ner`")
        self.names = [model_config.id2label[i] for i in sorted(model_config.id2label)]
        not_tags = [n for n in self.names if n != "O" and n[:2] not in ("B-", "I-", "E-", "S-")]
        if not_tags:
            raise ValueError(f"{self.config.model}'s labels ({', '.join(map(repr, not_tags[:5]))}) are "
                             "not BIO / BIOES tags: it is a sequence classifier, not a tagger; pass "
                             "--task classify, or a model fine-tuned with `bertkit finetune --task ner`")
        self.scheme = "BIOES" if any(n[:2] in ("E-", "S-") for n in self.names) else "BIO"

    def train_features(self, examples: Sequence, source: str) -> list[dict]:
        encoded = ner.ner_features(examples, self.pieces, self.config.max_length,
                                   label2id={n: i for i, n in enumerate(self.names)},
                                   stride=self.config.doc_stride)
        self.notes.update(scheme=self.scheme, words_without_pieces=encoded.n_words_without_pieces)
        # A window holding only continuation pieces has no label; it would add a NaN loss.
        return [f for f in encoded.features if any(x != IGNORE_INDEX for x in f["labels"])]

    def main_metric(self) -> tuple[str, bool]:
        return "f1", True

    def check_labels(self, examples: Sequence, source: str) -> None:
        """An eval tag the head lacks is an error: it could never be predicted, and skipping its
        sentences would flatter the score."""
        known = set(self.names)
        for sentence in examples:
            unknown = sorted(set(sentence.tags) - known)
            if unknown:
                raise ValueError(f"{sentence.where}: tag(s) {', '.join(map(repr, unknown))} were not in "
                                 f"the training data (known: {', '.join(self.names)}); use the same "
                                 "entity types and tag scheme in training and evaluation")

    def tag(self, model: nn.Module, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        """Predicted tags of pre-split sentences."""
        encoded = ner.ner_features([ner.NerSentence(list(s), None) for s in sentences], self.pieces,
                                   self.config.max_length, stride=self.config.doc_stride)
        out = forward_batches(model, encoded.features, pad_id=self.pieces.pad_id, token_level=True,
                              batch_size=self.config.eval_batch_size, progress=self.config.progress)
        # the most probable valid BIO / BIOES sequence, so every predicted entity is a span
        return [["O"] * len(s) if rows is None else ner.constrained_decode(rows.log_softmax(-1), self.names)
                for s, rows in zip(sentences, ner.word_logits(out["logits"], encoded))]

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        self.check_labels(examples, source)
        predicted = self.tag(model, [s.words for s in examples])
        scores = metrics.entity_scores(predicted, [s.tags for s in examples])
        result = scores.to_dict()
        result["n"] = len(examples)
        return result

    def predict(self, model: nn.Module, examples: Sequence) -> list[dict[str, Any]]:
        if examples and isinstance(examples[0], tuple):  # raw text lines: the tokenizer splits words
            splits = ner.split_words(self.pieces, [text for text, _ in examples])
            tags = self.tag(model, [s.words for s in splits])
            return [{"text": s.text, "entities": ner.entities_with_offsets(t, s)} for s, t in zip(splits, tags)]
        tags = self.tag(model, [s.words for s in examples])
        return [{"tokens": s.words, "tags": t, "entities": ner.entities_with_offsets(t, ner.join_words(s.words))}
                for s, t in zip(examples, tags)]


class QATask:
    """Extractive QA on SQuAD v1.1 / v2.0 files."""

    def __init__(self, config: FinetuneConfig, pieces: WordPieces):
        self.config, self.pieces = config, pieces
        self.settings = qa.QASettings(config.max_length, config.doc_stride or 128, config.max_query_length,
                                      config.max_answer_length, config.n_best,
                                      config.null_score_diff_threshold, config.version_2_with_negative)
        self.notes: dict[str, Any] = {}

    def read(self, spec: str, *, training: bool, labelled_rows: bool = True):
        if labelled.resolve_builtin(spec) is not None:
            raise ValueError(f"{spec}: no built-in QA data set exists; pass a SQuAD-format JSON file")
        examples, report, is_v2 = qa.read_squad(spec, training=training)
        if training and self.settings.version_2_with_negative is None:
            self.settings.version_2_with_negative = is_v2
            self.config.version_2_with_negative = is_v2
        return examples, report

    def setup_labels(self, train: Sequence, known: dict[str, int] | None) -> dict[str, Any]:
        return {}

    def load_labels(self, model_config: BertConfig) -> None:
        if self.settings.version_2_with_negative is None:
            self.settings.version_2_with_negative = False

    def train_features(self, examples: Sequence, source: str) -> list[dict]:
        encoded = qa.qa_features(examples, self.pieces, self.settings, training=True)
        self.notes["answers_not_mapped_to_pieces"] = encoded.n_unreachable
        if encoded.n_unreachable:
            log.warning("%s: %d answers could not be mapped to word pieces (skipped)", source,
                        encoded.n_unreachable)
        return encoded.features

    def main_metric(self) -> tuple[str, bool]:
        return "f1", True

    def check_labels(self, examples: Sequence, source: str) -> None:
        pass  # answers are texts of the passage: nothing to match against a label set

    def answers(self, model: nn.Module, examples: Sequence) -> list[qa.QAPrediction]:
        encoded = qa.qa_features(examples, self.pieces, self.settings, training=False)
        out = forward_batches(model, encoded.features, pad_id=self.pieces.pad_id, token_level=True,
                              fields=("start_logits", "end_logits"),
                              batch_size=self.config.eval_batch_size, progress=self.config.progress)
        return qa.decode_answers(out["start_logits"], out["end_logits"], examples, encoded,
                                 self.settings, bool(self.settings.version_2_with_negative))

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        predictions = {p.id: p.text for p in self.answers(model, examples)}
        gold = {e.id: [text for text, _ in e.answers] for e in examples}
        result = metrics.squad_scores(predictions, gold).to_dict()
        result["n"] = len(examples)
        return result

    def predict(self, model: nn.Module, examples: Sequence) -> list[dict[str, Any]]:
        # the five best answers are kept per question: the full n-best list is for decoding
        return [{**dataclasses.asdict(p), "nbest": p.nbest[:5]} for p in self.answers(model, examples)]


def _task_of_architecture(directory: Path) -> str | None:
    """The --task that suits the head named in config.json's `architectures`, if any."""
    names = BertConfig.from_json(directory).extra.get("architectures") or []
    for task, cls in HEADS.items():
        if task in TASKS and cls.__name__ in names:
            return task
    return None


TASK_CLASSES = {"classify": ClassifyTask, "pair": ClassifyTask, "ner": NerTask, "qa": QATask}


def _read_text_lines(path: str, make) -> tuple[list, DataReport]:
    """Prediction input as plain text, one example a line (blank lines skipped)."""
    report = DataReport(str(path))
    items = []
    for line_no, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            items.append(make(line.strip(), f"{path}:{line_no}"))
    report.n_kept = len(items)
    report.require_rows()
    return items, report


# ---------------------------------------------------------------------------------------------
# Model, tokenizer, output directory
# ---------------------------------------------------------------------------------------------
def _load_tokenizer(config: FinetuneConfig):
    from bertkit.tokenizer import BertTokenizer

    source = config.tokenizer
    if source is None:
        if config.model in PRESETS:
            raise ValueError(f"--model {config.model} is a preset (random init) and has no tokenizer; "
                             "pass --tokenizer DIR (e.g. the directory of a pre-trained model)")
        if not Path(config.model).is_dir():
            raise FileNotFoundError(missing_model_dir(config.model, "--model") + f", or a preset "
                                    f"({', '.join(PRESETS)}) with --tokenizer")
        source = config.model
    return BertTokenizer.from_pretrained(source)


def build_model(task: str, model: str, vocab_size: int, label_overrides: dict[str, Any],
                seed: int) -> nn.Module:
    """The task model: a preset of fresh weights (seeded), or a directory's weights with the head
    for `label_overrides`. A head of a different size in the directory (an earlier task's) is
    dropped and initialised afresh; a head of the same labels is kept."""
    cls = HEADS[task]
    torch.manual_seed(seed)  # the new head (and a preset's encoder) start from the run's seed
    if model in PRESETS:
        return cls(BertConfig.preset(model, vocab_size=vocab_size, **label_overrides))
    directory = Path(model)
    if not directory.is_dir():
        raise FileNotFoundError(missing_model_dir(model, "--model") + f", or a preset "
                                f"({', '.join(PRESETS)})")
    config = BertConfig.from_json(directory)
    if config.vocab_size != vocab_size:
        raise ValueError(f"the model's vocab_size {config.vocab_size} differs from the tokenizer's "
                         f"{vocab_size}; use the tokenizer the model was trained with")
    config = config.replace(**label_overrides) if label_overrides else config
    net = cls(config)
    state = read_state_dict(directory)
    own_shapes = {k: v.shape for k, v in to_hf_state_dict(net.state_dict()).items()}
    stale = [k for k, v in state.items() if k.startswith(HEAD_PREFIXES) and k in own_shapes
             and tuple(v.shape) != tuple(own_shapes[k])]
    if stale:
        log.warning("%s: task head %s has another label set; it is initialised afresh", model,
                    ", ".join(stale))
        state = {k: v for k, v in state.items() if k not in stale}
    net.load_report = load_into(net, state, str(directory))
    return net


def default_lr(hidden_size: int) -> float:
    """The peak fine-tuning learning rate for an encoder of `hidden_size`.

    Base and wider (768+): 3e-5, inside the 2e-5 … 5e-5 that BERT's authors searched (Devlin et
    al. 2019, appendix A.3). The compact models need more: BERT-tiny pre-trained briefly by the
    quickstart (600 steps), one epoch of the built-in sets (dev): zh-sentiment accuracy 0.529 at
    3e-5 (the majority class), 0.799 at 1e-3; zh-ner entity F1 0.011 at 3e-5, 0.452 at 1e-3 (issue
    13, item 8). Widths in between (small, medium: 512) take 1e-4, the highest rate Turc et al.
    2019 searched for their compact BERTs.
    """
    if hidden_size >= 768:
        return 3e-5
    if hidden_size >= 512:
        return 1e-4
    return 1e-3


def _check_out_dir(config: FinetuneConfig) -> Path:
    """OUT_DIR may be new or empty; a previous run's files are replaced only with `overwrite`."""
    out = check_writable_output(config.out_dir, overwrite=None, kind="dir")
    existing = [name for name in RUN_OUTPUTS if (out / name).exists()]
    if existing and not (config.overwrite or config.resume):
        raise FileExistsError(f"{out} already holds {', '.join(existing)}; choose another --out or "
                              "pass --overwrite to replace them")
    return out


def _start_out_dir(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, EVAL_FILE, STEPS_FILE):
        (out / name).unlink(missing_ok=True)  # stale results must not mix with this run's
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)


def _device(name: str) -> torch.device:
    info = distributed.init_distributed(name)
    if info.world_size > 1:
        raise ValueError("fine-tuning runs in a single process; start it without torchrun")
    return info.device


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def _batches(features: Sequence[dict], batch_size: int, rng: random.Random) -> list[list[int]]:
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


def _improved(value: float | None, best: float | None, higher_is_better: bool) -> bool:
    if value is None or math.isnan(value):
        return False
    if best is None:
        return True
    return value > best if higher_is_better else value < best


@dataclass
class _RunState:
    records: list[dict] = field(default_factory=list)
    best: float | None = None
    best_epoch: int | None = None
    best_eval: dict | None = None
    stopped_early: bool = False


def finetune(task: str, model_dir: str, train_file: str, out_dir: str, *, eval_file: str | None = None,
             **settings: Any) -> dict[str, Any]:
    """Fine-tune `model_dir` (or a preset) on `train_file`; write the model to `out_dir`.

    settings: any other `FinetuneConfig` field (epochs, lr, batch_size, freeze_encoder, patience,
    max_length, tokenizer, test, ...). Returns the content of OUT_DIR/eval.json: the best epoch,
    its eval metrics, the test metrics, data reports.
    """
    config = FinetuneConfig(task=task, model=str(model_dir), train=str(train_file), out_dir=str(out_dir),
                            eval=None if eval_file is None else str(eval_file), **settings)
    return run_finetune(config)


def run_finetune(config: FinetuneConfig) -> dict[str, Any]:
    """Run one fine-tuning (see the module docstring); returns eval.json's content."""
    if config.task in RETRIEVAL_TASKS:
        from bertkit.train import retrieval

        return retrieval.run(retrieval.from_finetune_config(config))
    out = _check_out_dir(config)  # fail before any work; create it only once the inputs are good
    tokenizer = _load_tokenizer(config)
    pieces = WordPieces.of(tokenizer)
    task = TASK_CLASSES[config.task](config, pieces)

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
    model = build_model(config.task, config.model, pieces.vocab_size, label_overrides, config.seed)
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

    device = _device(config.device)
    precision = resolve_precision(config.precision, device)
    model.to(device)
    if config.freeze_encoder:
        for param in model.bert.parameters():
            param.requires_grad_(False)
    lora_report = None
    if config.lora:
        lora_report = lora.apply_lora(model, lora.LoraSpec.parse(config.lora))
        log.info("%s", lora_report.summary())

    resume_from = _resume_point(config, out)
    if resume_from is None:
        _start_out_dir(out)
        _save_model(model, out, config)  # config and initial weights first, so the directory is complete
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

    state = _RunState()
    metric, higher = task.main_metric()
    started = time.time()
    try:
        reports["precision"] = _train(config, task, model, features, evaluation, out, state, metric,
                                      higher, device, precision, resume_from)
        precision = reports["precision"]
    except BaseException as err:
        failure = _summary(config, state, metric, reports, started,
                           status="interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                           error=f"{type(err).__name__}: {err}")
        latest = train_state.latest_checkpoint(out)
        if latest is not None:  # say how to continue, not only what was lost
            failure["resume"] = (f"a training state is saved in {latest}; run the same command "
                                 "with --resume to continue from it")
        atomic_write_json(out / EVAL_FILE, failure)
        raise
    summary = _summary(config, state, metric, reports, started, status="done")
    if test is not None:
        best = _load_best(model, out, config, label_overrides).to(device)
        with autocast(device, precision):
            summary["test"] = task.evaluate(best, test[0], config.test)
    atomic_write_json(out / EVAL_FILE, summary)
    # Finished: the training state (weights + optimizer, 3× the model) is no longer needed.
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)
    return summary


# ---------------------------------------------------------------------------------------------
# Training state: save and resume
# ---------------------------------------------------------------------------------------------
def _resume_point(config: FinetuneConfig, out: Path) -> Path | None:
    """The training state to continue from (with `resume`), after checking the settings match."""
    if not config.resume:
        return None
    checkpoint = train_state.latest_checkpoint(out)
    if checkpoint is None:
        eval_file = out / EVAL_FILE
        finished = eval_file.is_file() and json.loads(eval_file.read_text(encoding="utf-8")).get("status") == "done"
        if finished:
            raise ValueError(f"{out} holds a finished run (eval.json status done); nothing to resume. "
                             "Pass --overwrite to train it again, or choose another --out")
        log.info("no training state in %s yet; starting from step 0", out)
        return None
    saved_path = out / CONFIG_FILE
    train_state.check_same_settings(out, train_state.saved_settings(saved_path), config.to_dict(), saved_path,
                                    set(RESUMABLE_CHANGES), "Resume with the original settings, or "
                                    "start over with --overwrite")
    return checkpoint


def _features_digest(features: Sequence[dict]) -> str:
    """Fingerprint of the training features, stored in a training state: a resume must train on
    exactly the same inputs (the data file or the tokenizer may have changed since)."""
    digest = hashlib.sha256()
    for feature in features:
        digest.update(json.dumps(feature, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _save_training_state(out: Path, step: int, model: nn.Module, trainer_state: dict[str, Any]) -> None:
    """Write OUT/checkpoints/step-N atomically (a temp directory renamed when every file is on
    disk) and delete the older ones: any step-N that exists is complete."""
    root = out / train_state.CHECKPOINTS
    root.mkdir(exist_ok=True)
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    lora.save_weights(model, tmp)  # a LoRA model: frozen base + adapters, apart
    torch.save(trainer_state, tmp / train_state.TRAINER_STATE)
    for path in tmp.iterdir():  # rename is atomic; fsync makes the content survive a power loss
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in train_state.list_checkpoints(out)[:-1]:
        shutil.rmtree(old, ignore_errors=True)


def _save_model(model: nn.Module, out: Path, config: FinetuneConfig) -> None:
    """The model OUT_DIR holds: itself, or with LoRA merged / as PEFT adapters (`lora_save`)."""
    if config.lora:
        lora.save_lora(model, out, config.lora_save, base_model=str(Path(config.model).resolve()))
    else:
        model.save_pretrained(out)


def _load_best(model: nn.Module, out: Path, config: FinetuneConfig, label_overrides: dict) -> nn.Module:
    """The best model saved in OUT_DIR, for the test score: as `_save_model` wrote it."""
    if config.lora and config.lora_save == "adapters":
        best = build_model(config.task, config.model, model.config.vocab_size, label_overrides, config.seed)
        lora.apply_lora(best, lora.LoraSpec.parse(config.lora))
        lora.load_adapters(best, out)
        return best.eval()
    return type(model).from_pretrained(out)


def _truncate_steps_log(path: Path, step: int) -> None:
    """Keep the steps.jsonl lines up to `step`: a killed run wrote some after its last state."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the torn last line of a killed run
            continue
        if record.get("step", 0) <= step:
            kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))


def _train(config: FinetuneConfig, task, model: nn.Module, features: list[dict], evaluation,
           out: Path, state: _RunState, metric: str, higher: bool, device: torch.device,
           precision: str, resume_from: Path | None = None) -> str:
    """The epochs of a run (continued from `resume_from`'s training state if given); returns the
    precision trained in (a resumed run keeps its state's)."""
    from tqdm.auto import tqdm

    rng = random.Random(config.seed)  # the batch order; dropout draws from torch's generator
    steps_per_epoch = math.ceil(len(features) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    trainable = [p for p in model.parameters() if p.requires_grad]
    digest = _features_digest(features)
    steps_log = out / STEPS_FILE
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
        train_state.restore_rng_state(saved["rng"])
        _truncate_steps_log(steps_log, step)
        log.info("resuming from %s (step %d of %d, epoch %d)", resume_from, step, total, first_epoch)

    def save(epoch: int, position: int, order_rng) -> None:
        """The training state before micro-step `position` of `epoch` (whose batch order
        `order_rng` regenerates)."""
        run = {"records": state.records, "best": state.best, "best_epoch": state.best_epoch,
               "best_eval": state.best_eval, "stopped_early": state.stopped_early}
        _save_training_state(out, step, model, {
            "format": 1, "step": step, "epoch": epoch, "batch_in_epoch": position,
            "loss_sum": loss_sum, "n_batches": n_batches, "seconds": seconds,
            "order_rng": order_rng, "optimizer": optimizer.state_dict(),
            "scheduler": schedule.state_dict(), "rng": train_state.capture_rng_state(),
            "precision": precision, "features_digest": digest,
            "run": json.dumps(run)})  # plain JSON text: loads with weights_only=True

    if state.stopped_early:
        first_epoch = config.epochs + 1
    for epoch in range(first_epoch, config.epochs + 1):
        model.train()
        tick = time.time()
        if epoch != first_epoch or resume_from is None:
            loss_sum, n_batches, seconds, skip = 0.0, 0, 0.0, 0
        epoch_rng = rng.getstate()  # regenerates this epoch's order on resume
        batches = _batches(features, config.batch_size, rng)
        bar = tqdm(batches[skip:], desc=f"epoch {epoch}/{config.epochs}", initial=skip,
                   total=len(batches), unit="batch", disable=not config.progress, dynamic_ncols=True)
        for position, batch_index in enumerate(bar, start=skip):
            batch = pad_batch([features[i] for i in batch_index], task.pieces.pad_id)
            lr = optimizer.param_groups[0]["lr"]  # the rate this step uses
            with autocast(device, precision):
                loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the loss became {float(loss)} at step {step + 1} (epoch "
                                         f"{epoch}); lower --lr. The best model so far is in {out}")
            loss.backward()
            if config.max_grad_norm:
                nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_value = loss.item()
            loss_sum += loss_value
            n_batches += 1
            with open(steps_log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "epoch": epoch, "loss": loss_value, "lr": lr}) + "\n")
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
            with autocast(device, precision):
                scores = task.evaluate(model, evaluation[0], config.eval)
            record["eval"] = scores
            value = scores.get(metric)
        else:
            value = -record["train_loss"] if higher else record["train_loss"]  # no eval set: latest
        if evaluation is None or _improved(value, state.best, higher):
            state.best, state.best_epoch = value, epoch
            state.best_eval = record.get("eval")
            _save_model(model, out, config)  # atomic per file; the config does not change between epochs
            record["saved"] = True
        state.records.append(record)
        atomic_write_text(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in state.records))
        log.info("epoch %d: %s", epoch, json.dumps(record))
        if config.patience and state.best_epoch is not None and epoch - state.best_epoch >= config.patience:
            state.stopped_early = True
        loss_sum, n_batches, seconds = 0.0, 0, 0.0
        save(epoch + 1, 0, rng.getstate())  # after the epoch's record and best model
        if state.stopped_early:
            break
    return precision


def _summary(config: FinetuneConfig, state: _RunState, metric: str, reports: dict, started: float,
             *, status: str, error: str | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": status,
        "task": config.task,
        "model": config.model,
        "metric": metric,
        "best_epoch": state.best_epoch,
        "eval": state.best_eval,
        "epochs_run": len(state.records),
        "stopped_early": state.stopped_early,
        "seconds": round(time.time() - started, 2),
        "data": reports,
    }
    if error:
        summary["error"] = error
        summary["saved_model"] = (f"epoch {state.best_epoch}" if state.best_epoch
                                  else "initial weights only (no epoch finished)")
    return summary


# ---------------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------------
def predict(model_dir: str, input_file: str, out_file: str, *, task: str | None = None,
            overwrite: bool = False, batch_size: int = 64, device: str = "auto",
            progress: bool = True, **settings: Any) -> dict[str, Any]:
    """Run a fine-tuned directory over `input_file`; write one JSON line per input to `out_file`.

    task: taken from MODEL_DIR/finetune_config.json when the directory was made by `finetune`
      (with its lengths and column names); needed otherwise.
    settings: FinetuneConfig fields that override the saved ones (e.g. max_length, doc_stride,
      null_score_diff_threshold, text_column).
    Inputs and outputs per task:
      classify / pair: CSV / TSV / JSONL (text columns; labels ignored) or .txt (one text a line)
        → {"text", ["text_pair"], "label", "scores": {label: probability}} or {"text", "value"};
      ner: CoNLL / JSONL words → {"tokens", "tags", "entities"}; .txt raw text, one a line →
        {"text", "entities": [{"type", "text", "start", "end", ...}]} with character offsets;
      qa: SQuAD JSON → {"id", "text", "score", "null_score_diff", "nbest"}.
    Returns {"task", "n", "out_file", "input": data report}.
    """
    # The output first: an unwritable --out must not cost the whole prediction run.
    out = check_writable_output(out_file, overwrite=overwrite, kind="file")
    directory = Path(model_dir)
    if not directory.is_dir():
        raise FileNotFoundError(missing_model_dir(model_dir, "--model"))
    saved_path = directory / CONFIG_FILE
    saved = json.loads(saved_path.read_text(encoding="utf-8")) if saved_path.is_file() else {}
    task = task or saved.get("task")
    if task is None:
        raise ValueError(f"{directory} has no {CONFIG_FILE}; pass --task ({', '.join(TASKS)})")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    suited = _task_of_architecture(directory)
    check_architecture(directory, BertConfig.from_json(directory), HEADS[task],
                       (f"pass --task {suited}, or " if suited else "") +
                       f"fine-tune it first with `bertkit finetune --task {task}`")
    known = {f.name for f in dataclasses.fields(FinetuneConfig)}
    values = {k: v for k, v in saved.items() if k in known}
    values.update(task=task, model=str(directory), train=values.get("train", ""), out_dir=str(directory),
                  tokenizer=None, eval_batch_size=batch_size, device=device, progress=progress)
    values.update(settings)
    config = FinetuneConfig(**values)
    pieces = WordPieces.of(_load_tokenizer(config))
    runner = TASK_CLASSES[task](config, pieces)
    model = HEADS[task].from_pretrained(directory).to(_device(device))
    runner.load_labels(model.config)
    examples, report = runner.read(str(input_file), training=False, labelled_rows=False)
    rows = runner.predict(model, examples)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {"task": task, "n": len(rows), "out_file": str(out), "input": report.to_dict()}
