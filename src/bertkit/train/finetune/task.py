"""The fine-tuning tasks behind one declared interface (`Task`): classify / pair, ner, qa.

A task reads its data files (or a built-in set), decides the head's labels, makes training
features, and scores a model on an evaluation set. Scoring runs on the inference engine, with the
use's own decoding (`bertkit.inference`), so the dev score a run reports is measured on exactly
what `bertkit classify|ner|qa` and `bertkit predict` answer. Knowledge distillation
(`train.distill`) trains on the same tasks.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Protocol, Sequence

import torch
from torch import nn

from bertkit.constants import IGNORE_INDEX
from bertkit.data import labelled, scoring
from bertkit.data.formats import classify, ner, qa
from bertkit.data.formats.common import WordPieces
from bertkit.data.report import DataReport, read_text
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder import tasks
from bertkit.encoder.config import BertConfig
from bertkit.inference import Engine
from bertkit.inference.classify import example_scores
from bertkit.inference.ner import tag_words
from bertkit.inference.qa import answer_examples
from bertkit.train import health
from bertkit.train.finetune.config import FinetuneConfig

log = logging.getLogger(__name__)


class Task(Protocol):
    """What the training loop (and distillation) asks of a task."""

    config: FinetuneConfig
    pieces: WordPieces
    notes: dict[str, Any]  # facts about the training data, for eval.json

    def read(self, spec: str, *, training: bool, labelled_rows: bool = True) -> tuple[list, DataReport]:
        """Examples of a file or built-in set. training: the train split is the default of a
        built-in set, and QA answers must map to pieces. labelled_rows=False reads inputs without
        labels (distillation's unlabelled texts), .txt lines included."""

    def setup_labels(self, train: Sequence, known: dict[str, int] | None) -> dict[str, Any]:
        """The head's labels from the training examples (keeping a fine-tuned model's own order,
        `known`); returns the config.json fields that describe them."""

    def load_labels(self, model_config: BertConfig) -> None:
        """The labels of an already fine-tuned model (a distillation teacher)."""

    def train_features(self, examples: Sequence, source: str) -> list[dict]:
        """Model inputs with targets, as `data.tasks.common.pad_batch` batches them."""

    def main_metric(self) -> tuple[str, bool]:
        """(name, higher is better) of the metric that picks the best epoch."""

    def check_labels(self, examples: Sequence, source: str) -> None:
        """ValueError for an evaluation example whose label the head lacks."""

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        """The metrics of `model` on labelled examples."""

    @staticmethod
    def chance_loss(config: FinetuneConfig, model_config: BertConfig) -> float | None:
        """The training loss of a uniform guess (`train.health`), None where there is none."""

    @staticmethod
    def baseline(scores: dict[str, Any], metric: str, split: str) -> str | None:
        """The warning for `scores` no better than a predictor that ignores its input."""


class _EngineTask:
    """What the three tasks share: the tokenizer, and the inference engine over a model being
    trained, in its own precision (the caller's autocast applies), back in training mode after."""

    def __init__(self, config: FinetuneConfig, tokenizer: BertTokenizer):
        self.config, self.tokenizer = config, tokenizer
        self.pieces = WordPieces.of(tokenizer)
        self.notes: dict[str, Any] = {}

    @contextlib.contextmanager
    def engine(self, model: nn.Module) -> Iterator[Engine]:
        was_training = model.training
        device = next(model.parameters()).device
        try:
            engine = Engine(model, self.tokenizer, device=device, max_length=self.config.max_length,
                            max_batch_tokens=self.config.eval_batch_size * self.config.max_length)
            engine.word_pieces = self.pieces  # made once per run, not per evaluation
            yield engine
        finally:
            model.train(was_training)


def label_chance(config: FinetuneConfig, model_config: BertConfig) -> float | None:
    """A classifier's or a tagger's chance loss: ln(labels), a uniform guess among the head's
    outputs (none for a regression)."""
    return None if model_config.problem_type == "regression" else health.uniform_guess(model_config.num_labels)


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


def _read_text_lines(path: str, make) -> tuple[list, DataReport]:
    """Unlabelled input as plain text, one example a line (blank lines skipped)."""
    report = DataReport(str(path))
    items = []
    for line_no, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            items.append(make(line.strip(), f"{path}:{line_no}"))
    report.n_kept = len(items)
    report.require_rows()
    return items, report


class ClassifyTask(_EngineTask):
    """Single texts (`classify`) and text pairs (`pair`): classes or regression."""

    def __init__(self, config: FinetuneConfig, tokenizer: BertTokenizer):
        super().__init__(config, tokenizer)
        self.pair = config.task == "pair"
        self.columns = classify.ClassifyColumns(config.text_column, config.pair_column, config.label_column)
        self.space: classify.LabelSpace | None = None

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
        tasks.check_labels(self.config.model, model_config, self.config.task)
        regression = model_config.problem_type == "regression" or model_config.num_labels == 1
        self.space = classify.LabelSpace(None if regression else tasks.label_names(model_config))

    def train_features(self, examples: Sequence, source: str) -> list[dict]:
        return classify.classify_features(examples, self.pieces, self.config.max_length,
                                          label_ids=self.space.encode(examples, source))

    def main_metric(self) -> tuple[str, bool]:
        return ("mse", False) if self.space.regression else ("accuracy", True)

    def check_labels(self, examples: Sequence, source: str) -> None:
        self.space.encode(examples, source)

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        gold = self.space.encode(examples, source)
        with self.engine(model) as engine:  # (N, C): every window, probabilities averaged (eval_windows)
            scores = example_scores(engine, examples, windows=self.config.eval_windows,
                                    stride=self.config.doc_stride)
        if self.space.regression:
            pred = scores[:, 0]
            target = torch.tensor(gold)
            pearson = float(torch.corrcoef(torch.stack([pred, target]))[0, 1]) if len(gold) > 1 else float("nan")
            return {"mse": float(((pred - target) ** 2).mean()), "pearson": pearson, "n": len(gold)}
        pred = scores.argmax(-1).tolist()
        # The accuracy of always answering the most frequent label: what a model that ignores its
        # input scores here (train.health warns when the model does no better).
        majority = max(gold.count(label) for label in set(gold)) / len(gold) if gold else None
        return {"accuracy": scoring.accuracy(pred, gold), "macro_f1": scoring.macro_f1(pred, gold),
                "majority_accuracy": majority, "n": len(gold)}

    chance_loss = staticmethod(label_chance)

    @staticmethod
    def baseline(scores: dict[str, Any], metric: str, split: str) -> str | None:
        """Always answering the evaluation set's most frequent label (none for a regression)."""
        return health.baseline_warning(metric, scores.get(metric), scores.get("majority_accuracy"),
                                       "always answering the most frequent label", split)


class NerTask(_EngineTask):
    """Token classification with BIO / BIOES tags."""

    def __init__(self, config: FinetuneConfig, tokenizer: BertTokenizer):
        super().__init__(config, tokenizer)
        self.scheme: str | None = None
        self.names: list[str] | None = None

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
        tasks.check_labels(self.config.model, model_config, "ner")
        self.names = tasks.label_names(model_config)
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

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        self.check_labels(examples, source)
        with self.engine(model) as engine:  # the decoder `bertkit ner` uses: valid BIO/BIOES paths
            tagged = tag_words(engine, [s.words for s in examples], stride=self.config.doc_stride)
        scores = scoring.entity_scores([t.tags for t in tagged], [s.tags for s in examples])
        result = scores.to_dict()
        result["n"] = len(examples)
        return result

    chance_loss = staticmethod(label_chance)

    @staticmethod
    def baseline(scores: dict[str, Any], metric: str, split: str) -> str | None:
        """Tagging every word O: no entity found, an F1 of 0."""
        return health.baseline_warning(metric, scores.get(metric), 0.0 if scores else None,
                                       "tagging every word O", split)


class QATask(_EngineTask):
    """Extractive QA on SQuAD v1.1 / v2.0 files."""

    def __init__(self, config: FinetuneConfig, tokenizer: BertTokenizer):
        super().__init__(config, tokenizer)
        self.settings = qa.QASettings(config.max_length, config.doc_stride or 128, config.max_query_length,
                                      config.max_answer_length, config.n_best,
                                      config.null_score_diff_threshold, config.version_2_with_negative)

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

    def answers(self, model: nn.Module, examples: Sequence[qa.QAExample]) -> dict[str, str]:
        """question id → the answer `bertkit qa` gives ("" = no answer), as evaluation scores it."""
        with self.engine(model) as engine:
            found = answer_examples(engine, examples, self.settings,
                                    allow_no_answer=bool(self.settings.version_2_with_negative))
        return {prediction.id: prediction.text for prediction in found}

    def evaluate(self, model: nn.Module, examples: Sequence, source: str) -> dict[str, Any]:
        predictions = self.answers(model, examples)
        gold = {e.id: [text for text, _ in e.answers] for e in examples}
        result = scoring.squad_scores(predictions, gold).to_dict()
        result["n"] = len(examples)
        return result

    @staticmethod
    def chance_loss(config: FinetuneConfig, model_config: BertConfig) -> float | None:
        """ln(window) for the start and for the end: a uniform guess over the window's positions."""
        return health.uniform_guess(config.max_length)

    baseline = staticmethod(health.no_baseline)
