"""Sequence classification and sentence-pair tasks: reading, labels, features, window aggregation.

Input files are CSV, TSV (both with a header row) or JSONL, with a text column, for pairs a second
text column, and a label column (names configurable). Labels may be strings or integers (classes)
or numbers (regression: asked for with `problem_type="regression"`, or inferred when at least 10%
of the labels are non-integer numbers and the rest are numbers too).

Files that could mean two things are refused with the fix rather than read one way silently:
- a few non-integer numbers among integer labels (a typo, or regression targets?) and numbers
  mixed with class names: pass `--problem-type` to say which, or fix the rows;
- a CSV / TSV row with more fields than the header: a text holding the delimiter that is not
  quoted, whose fields would shift into the label column. pandas (`read_csv`) and 🤗 datasets
  refuse such a row too ("Expected 2 fields in line 3, saw 3");
- single texts for a pair task (no row has the second text) and a second-text column for a
  single-text task.

Long inputs. Training truncates each example to `max_length` tokens (for pairs the longer text
loses tokens first). Prediction reads everything: a text longer than one window is cut into
overlapping windows (`window_spans`), each window is classified, and the document's class
probabilities are the **mean of the windows' softmax probabilities** (regression: the mean of the
window outputs). For pairs the windows slide over the second text, the first one kept whole up to
half the window, as SQuAD does with question and passage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from bertkit.data.formats.common import WordPieces, known_label_order, window_spans
from bertkit.data.report import DataReport
from bertkit.data.rows import read_rows


@dataclass
class ClassifyExample:
    """One row: `text`, `text_pair` (None for single-text tasks), `label` (class name as a
    string, a float regression target, or None when the input has no labels), `where` (file:line)."""

    text: str
    text_pair: str | None
    label: str | float | None
    where: str = ""


@dataclass
class ClassifyColumns:
    """Column (CSV/TSV header) or key (JSONL) names."""

    text: str = "text"
    text_pair: str = "text_pair"
    label: str = "label"


def _label_value(value: Any) -> str | float | None:
    """A class label as a string ('3' for 3 or 3.0), a non-integer number as a float."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return str(int(value)) if float(value).is_integer() else float(value)
    text = str(value).strip()
    number = _as_float(text)
    if number is not None and any(ch.isdigit() for ch in text):
        return _label_value(number)  # "2" and "2.0" are one class; "0.5" is a regression target
    return text or None


def read_classify(path: str | os.PathLike, *, pair: bool = False,
                  columns: ClassifyColumns | None = None,
                  labelled: bool = True) -> tuple[list[ClassifyExample], DataReport]:
    """Read a CSV / TSV / JSONL classification file.

    pair: read `columns.text_pair` too (sentence-pair task).
    labelled: rows must carry a label (training / evaluation); False reads texts only and ignores
      any label column (prediction).
    Rows with a missing column or an empty text are reported (file:line) and skipped; raises
    ValueError when no row is usable or when the header lacks a required column.
    """
    columns = columns or ClassifyColumns()
    report = DataReport(str(path))
    needed = [columns.text] + ([columns.text_pair] if pair else []) + ([columns.label] if labelled else [])
    examples = []
    rows_with_pair = 0
    fix = "name the columns with --text-column / --pair-column / --label-column"
    for line_no, row in read_rows(path, report, required=dict.fromkeys(needed, fix)):
        where = f"{path}:{line_no}"
        extra = row.pop(None, None)
        if extra:
            header = list(row)
            raise ValueError(f"{where}: {len(header) + len(extra)} fields where the header has "
                             f"{len(header)} ({', '.join(map(repr, header))}); the extra field is "
                             f"{extra[0]!r}. A text that holds the delimiter must be quoted "
                             '("like, this"); fix the row (the fields would shift into the label '
                             "column)")
        if not pair and row.get(columns.text_pair) is not None:
            raise ValueError(f"{where}: a second text in column {columns.text_pair!r}, but the task "
                             "(or model) reads single texts; pass --task pair to use both texts "
                             "(a pair model), or remove the column")
        rows_with_pair += row.get(columns.text_pair) is not None
        absent = [c for c in needed if row.get(c) is None]
        if absent:
            report.skip(where, f"missing {', '.join(map(repr, absent))}")
            continue
        text = str(row[columns.text])
        text_pair = str(row[columns.text_pair]) if pair else None
        if not text.strip() or (pair and not text_pair.strip()):
            report.skip(where, "empty text")
            continue
        label = _label_value(row[columns.label]) if labelled else None
        if labelled and label is None:
            report.skip(where, f"empty or non-finite label in column {columns.label!r}")
            continue
        examples.append(ClassifyExample(text, text_pair, label, where))
    if pair and not rows_with_pair and report.n_skipped:
        raise ValueError(f"{path}: no row has a second text (key {columns.text_pair!r}), but the task "
                         "(or model) is for text pairs; name the key with --pair-column, or use "
                         "--task classify for single texts")
    report.n_kept = len(examples)
    report.require_rows()
    return examples, report


# ---------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------
@dataclass
class LabelSpace:
    """The head's outputs: class names in id order, or regression (one output, `names` None)."""

    names: list[str] | None

    @property
    def regression(self) -> bool:
        return self.names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.names is None else len(self.names)

    @property
    def id2label(self) -> dict[int, str]:
        return {0: "LABEL_0"} if self.names is None else dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in self.id2label.items()}

    def describe(self, column: str = "label") -> str:
        """One line saying what was inferred, e.g. "labels: 3 classes (neg, neu, pos) from column
        'label'"."""
        if self.regression:
            return f"regression: numeric labels from column {column!r} (one output, MSE loss)"
        shown = ", ".join(self.names[:10]) + (", …" if len(self.names) > 10 else "")
        hint = ""
        if len(self.names) > 20 and all(_is_int(n) for n in self.names):
            hint = "; if these integers are scores, pass --problem-type regression"
        return f"labels: {len(self.names)} classes ({shown}) from column {column!r}{hint}"

    @classmethod
    def infer(cls, examples: Sequence[ClassifyExample], problem_type: str | None = None,
              known: dict[str, int] | None = None, column: str = "label") -> "LabelSpace":
        """The label space of training examples.

        problem_type: "regression", "single_label_classification" or None: regression when every
          label is a number and at least 10% are non-integers, classes when there are no
          non-integers; anything between (a few non-integers among integers, numbers mixed with
          names) is ambiguous and raises ValueError naming the rows and `--problem-type`.
        known: a label2id from the model being fine-tuned; reused (same order, so a trained head
          keeps its meaning) when it names every training label.
        column: the label column's name, for messages.
        Classes are sorted: numerically when all are integers (so 0..K-1 keep their ids), else
        alphabetically.
        """
        values = [e.label for e in examples]
        if problem_type is None:
            _check_unambiguous(examples, column)
        if problem_type == "regression" or (problem_type is None and any(isinstance(v, float) for v in values)):
            bad = [e for e in examples if _as_float(e.label) is None]
            if bad:
                raise ValueError(f"{bad[0].where}: label {bad[0].label!r} is not a number, but the "
                                 f"task is regression ({len(bad)} such rows); fix the labels or "
                                 "pass --problem-type single_label_classification")
            return cls(None)
        if problem_type not in (None, "single_label_classification"):
            raise ValueError(f"problem_type {problem_type!r} is not supported for fine-tuning; use "
                             "'single_label_classification' or 'regression'")
        names = {str(v) for v in values}
        reused = known_label_order(names, known)
        if reused:
            return cls(reused)
        if len(names) < 2:
            raise ValueError(f"the training data has a single label {names.pop()!r}; a classifier "
                             "needs at least two classes")
        if all(_is_int(n) for n in names):
            return cls(sorted(names, key=int))
        return cls(sorted(names))

    def encode(self, examples: Sequence[ClassifyExample], source: str) -> list[int | float]:
        """Label ids (or float targets) of examples; ValueError listing labels the space lacks.

        An unknown label in an evaluation file is an error, not a skipped row: dropping the rows
        of a class the model cannot predict would report a better score than the model earns.
        """
        if self.regression:
            out = [_as_float(e.label) for e in examples]
            bad = [e for e, v in zip(examples, out) if v is None]
            if bad:
                raise ValueError(f"{bad[0].where}: label {bad[0].label!r} is not a number "
                                 f"({len(bad)} rows in {source}); regression needs numeric labels")
            return out
        index = self.label2id
        unknown = [e for e in examples if str(e.label) not in index]
        if unknown:
            names = sorted({str(e.label) for e in unknown})
            raise ValueError(f"{unknown[0].where}: label {unknown[0].label!r} was not in the training "
                             f"data ({len(unknown)} rows of {source} have unknown labels "
                             f"{', '.join(map(repr, names[:10]))}; known: "
                             f"{', '.join(map(repr, self.names))}); add training examples of "
                             "these labels or remove the rows")
        return [index[str(e.label)] for e in examples]


# Below this share of non-integer labels among numbers, the non-integers look like typos in a
# classification file, not regression targets (STS-B's similarity scores: most are non-integers).
MIN_REGRESSION_SHARE = 0.1


def _check_unambiguous(examples: Sequence[ClassifyExample], column: str) -> None:
    """Refuse labels that could mean classes or regression (see `LabelSpace.infer`)."""
    floats = [e for e in examples if isinstance(e.label, float)]
    integers = [e for e in examples if isinstance(e.label, str) and _is_int(e.label)]
    names = [e for e in examples if isinstance(e.label, str) and not _is_int(e.label)]
    numbers = floats or integers
    if names and numbers:
        n_numbers = len(floats) + len(integers)
        raise ValueError(
            f"column {column!r} mixes numbers and names as labels: {n_numbers} "
            f"number{'s' if n_numbers > 1 else ''} (e.g. {numbers[0].label!r} at {numbers[0].where}) "
            f"and {len(names)} name{'s' if len(names) > 1 else ''} (e.g. {names[0].label!r} at "
            f"{names[0].where}); fix the rows, or pass --problem-type single_label_classification "
            "to take every value as a class name")
    if floats and len(floats) < MIN_REGRESSION_SHARE * len(examples):
        where = ", ".join(f"{e.where} ({e.label!r})" for e in floats[:3])
        raise ValueError(
            f"column {column!r}: {len(floats)} of {len(examples)} labels are non-integer numbers "
            f"({where}{', …' if len(floats) > 3 else ''}), the rest integers: classes or "
            "regression? Pass --problem-type regression to learn the numbers, or fix those rows "
            "(or pass --problem-type single_label_classification to make each value a class)")


def _as_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# features
# ---------------------------------------------------------------------------------------------
def _truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths to keep so that a + b <= budget, taking tokens from the longer text first."""
    if len_a + len_b <= budget:
        return len_a, len_b
    half = budget // 2
    if len_a <= half:
        return len_a, budget - len_a
    if len_b <= half:
        return budget - len_b, len_b
    return budget - half, half


def classify_features(examples: Sequence[ClassifyExample], pieces: WordPieces, max_length: int, *,
                      label_ids: Sequence[int | float] | None = None, windows: bool = False,
                      stride: int | None = None) -> list[dict[str, Any]]:
    """Model inputs for examples: [CLS] text [SEP] (text_pair [SEP]).

    Each feature: input_ids, token_type_ids (lists, length <= max_length), example (index into
    examples) and, when `label_ids` is given, labels. Without `windows` every example gives one
    truncated feature (training); with `windows` a long example gives one feature per window,
    starts `stride` tokens apart (default: half a window), for `aggregate_windows`.
    """
    if max_length < 4:
        raise ValueError(f"max_length {max_length} leaves no room for text; use at least 4")
    enc_a = pieces.encode([e.text for e in examples])
    has_pair = any(e.text_pair is not None for e in examples)
    enc_b = pieces.encode([e.text_pair or "" for e in examples]) if has_pair else None
    features = []
    for i, example in enumerate(examples):
        a = enc_a[i].ids
        b = enc_b[i].ids if example.text_pair is not None else None
        budget = max_length - (3 if b is not None else 2)
        for ids_a, ids_b in _segments(a, b, budget, windows, stride):
            ids = [pieces.cls_id] + ids_a + [pieces.sep_id]
            types = [0] * len(ids)
            if ids_b is not None:
                ids += ids_b + [pieces.sep_id]
                types += [1] * (len(ids_b) + 1)
            feature = {"input_ids": ids, "token_type_ids": types, "example": i}
            if label_ids is not None:
                feature["labels"] = label_ids[i]
            features.append(feature)
    return features


def _segments(a: list[int], b: list[int] | None, budget: int, windows: bool,
              stride: int | None) -> list[tuple[list[int], list[int] | None]]:
    """(first, second) token lists of each feature of one example."""
    if b is None:
        if not windows or len(a) <= budget:
            return [(a[:budget], None)]
        return [(a[s:e], None) for s, e in window_spans(len(a), budget, stride or max(1, budget // 2))]
    if not windows or len(a) + len(b) <= budget:
        keep_a, keep_b = _truncate_pair(len(a), len(b), budget)
        return [(a[:keep_a], b[:keep_b])]
    a = a[:max(budget // 2, budget - len(b))]
    room = budget - len(a)
    return [(a, b[s:e]) for s, e in window_spans(len(b), room, stride or max(1, room // 2))]


def aggregate_windows(logits: Sequence[torch.Tensor], features: Sequence[dict[str, Any]],
                      n_examples: int, regression: bool) -> torch.Tensor:
    """Per-example scores from per-window logits.

    logits: one (C,) float tensor per feature. Returns (n_examples, C): the mean over an example's
    windows of softmax probabilities (classification) or of raw outputs (regression, C = 1).
    """
    stacked = torch.stack(list(logits))  # (F, C)
    values = stacked if regression else stacked.softmax(dim=-1)  # (F, C)
    index = torch.tensor([f["example"] for f in features])  # (F,)
    sums = torch.zeros(n_examples, values.shape[1]).index_add_(0, index, values)  # (N, C)
    counts = torch.zeros(n_examples).index_add_(0, index, torch.ones(len(index)))  # (N,)
    if bool((counts == 0).any()):
        raise ValueError("an example has no window; every example must yield a feature")
    return sums / counts[:, None]  # (N, C)
