"""Scores of text pairs by the cosine of their embeddings: STS and pair classification, as MTEB
computes them.

STS: Spearman's rank correlation (ties share their mean rank, as `scipy.stats.spearmanr`) and
Pearson's, of the cosine against the gold score; the main figure is Spearman's. A linear rescale
of the gold scores (MTEB's normalisation to 0..1) changes neither, so none is applied.

Pair classification (labels 0 / 1): MTEB's threshold protocol, not a trained classifier: pairs
ordered by cosine, the best accuracy and the best F1 over every threshold between two distinct
cosines (a threshold never splits tied scores), and the average precision of the cosine ranking
(scikit-learn's `average_precision_score`: precision at each distinct score, weighted by the
recall it adds). MTEB's `cosine_accuracy`, `cosine_f1`, `cosine_precision`, `cosine_recall` and
`cosine_ap`; its manhattan, euclidean and dot variants are not computed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _ranks(x: np.ndarray) -> np.ndarray:
    """(N,) 1-based ranks of x, ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]  # (N,) first of each run of equal values
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(x)] - 1
    mean_rank = (first + last) / 2 + 1  # (G,) mean 1-based rank of each run
    ranks = np.empty(len(x))
    ranks[order] = mean_rank[group]
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    if denominator == 0:
        raise ValueError("a correlation needs values that vary; every score or every similarity is the same")
    return float((x * y).sum() / denominator)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return pearson(_ranks(np.asarray(x, dtype=np.float64)), _ranks(np.asarray(y, dtype=np.float64)))


def sts_scores(cosines: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
    """{"spearman", "pearson"} of the cosines against the gold scores."""
    return {"spearman": spearman(gold, cosines), "pearson": pearson(gold, cosines)}


def best_accuracy(scores: Sequence[float], labels: Sequence[int]) -> float:
    """The best accuracy of `score > threshold → 1` over every threshold between distinct scores."""
    rows = sorted(zip(scores, labels), key=lambda r: r[0], reverse=True)
    best, positives, negatives_left = 0.0, 0, sum(1 for label in labels if label == 0)
    for i in range(len(rows) - 1):
        if rows[i][1] == 1:
            positives += 1
        else:
            negatives_left -= 1
        if rows[i][0] == rows[i + 1][0]:
            continue
        best = max(best, (positives + negatives_left) / len(rows))
    return best


def best_f1(scores: Sequence[float], labels: Sequence[int]) -> tuple[float, float, float]:
    """(F1, precision, recall) at the threshold of the best F1."""
    rows = sorted(zip(scores, labels), key=lambda r: r[0], reverse=True)
    best = (0.0, 0.0, 0.0)
    correct, relevant = 0, sum(labels)
    for i in range(len(rows) - 1):
        correct += rows[i][1] == 1
        if rows[i][0] == rows[i + 1][0] or not correct:
            continue
        precision, recall = correct / (i + 1), correct / relevant
        f1 = 2 * precision * recall / (precision + recall)
        if f1 > best[0]:
            best = (f1, precision, recall)
    return best


def average_precision(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Σ over distinct scores, best first, of (recall gained there) · (precision there)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    last_of_run = np.r_[scores[1:] != scores[:-1], True]  # (N,) the last pair at each distinct score
    true_pos = np.cumsum(labels)[last_of_run]
    seen = (np.arange(len(scores)) + 1)[last_of_run]
    precision = true_pos / seen
    recall = true_pos / labels.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def pair_classification_scores(cosines: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    """{"accuracy", "f1", "precision", "recall", "ap"} of cosine thresholds (module docstring)."""
    labels = [int(label) for label in labels]
    if len(set(labels)) < 2:
        raise ValueError("pair classification needs pairs of both labels, 0 and 1")
    f1, precision, recall = best_f1(cosines, labels)
    return {"accuracy": best_accuracy(cosines, labels), "f1": f1, "precision": precision, "recall": recall,
            "ap": average_precision(cosines, labels)}
