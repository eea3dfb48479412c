"""Text classification on frozen embeddings, by MTEB's logistic-regression protocol.

What is reproduced (MTEB 2.x `AbsTaskClassification`, not cross-validated): `experiments` runs
(MTEB's `n_experiments`, 10); before run i the list of training rows is shuffled again, in place,
by a fresh `numpy.random.RandomState(seed)` (seed 42), so the shuffles compound as MTEB's do, and
the first `samples_per_label` rows of each label in that order (MTEB's default 8) train
scikit-learn's `LogisticRegression(max_iter=100, random_state=seed)` (L2, C = 1, lbfgs) on the
training texts' embeddings; it predicts every test text, and accuracy, macro F1, weighted F1,
macro precision and macro recall are averaged over the runs. The same seed, rows and classifier
give MTEB's figures for the same embeddings (tested against `mteb.evaluate`).

Where not: MTEB's per-task settings (a task may set other `samples_per_label`, `n_experiments`, or
subsample its train split to 2,048 rows when the dataset is built) are options here, not read from
a task; average precision over hard predictions (MTEB's `ap` for binary tasks) is not reported;
5-fold cross-validation (MTEB's `is_cross_validation` tasks) is not offered.

scikit-learn is an optional dependency (`pip install 'bertkit[eval]'`).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

MTEB_SEED = 42
SAMPLES_PER_LABEL = 8
EXPERIMENTS = 10


def need_sklearn() -> None:
    import importlib.util

    if importlib.util.find_spec("sklearn") is None:
        raise ValueError("classification on embeddings fits scikit-learn's LogisticRegression (MTEB's "
                         "protocol), which is not installed: pip install 'bertkit[eval]'")


def undersamples(labels: Sequence[str], samples_per_label: int, experiments: int,
                 seed: int = MTEB_SEED) -> list[list[int]]:
    """The training rows of each run: MTEB's `_undersample_data`, run after run."""
    order = list(range(len(labels)))
    picks = []
    for _ in range(experiments):
        np.random.RandomState(seed).shuffle(order)  # in place: the next run shuffles this order again
        taken: Counter = Counter()
        rows = []
        for i in order:
            if taken[labels[i]] < samples_per_label:
                rows.append(i)
                taken[labels[i]] += 1
        picks.append(rows)
    return picks


def classification_scores(embed: Callable[[list[str]], np.ndarray], train_texts: Sequence[str],
                          train_labels: Sequence[str], test_texts: Sequence[str], test_labels: Sequence[str], *,
                          samples_per_label: int = SAMPLES_PER_LABEL, experiments: int = EXPERIMENTS,
                          seed: int = MTEB_SEED) -> dict[str, float]:
    """Mean {"accuracy", "f1", "f1_weighted", "precision", "recall"} over the runs.

    embed: texts → (N, H) embeddings; only the training texts some run picks are embedded (MTEB
    embeds that union too), and every test text once.
    """
    need_sklearn()
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

    if samples_per_label < 1 or experiments < 1:
        raise ValueError(f"samples_per_label and experiments must be positive, got {samples_per_label} "
                         f"and {experiments}")
    if len(set(train_labels)) < 2:
        raise ValueError("the training texts carry one label only; a classifier needs two or more")
    picks = undersamples(list(train_labels), samples_per_label, experiments, seed)
    used = sorted(set().union(*picks))
    vectors = embed([train_texts[i] for i in used])  # (U, H)
    position = {row: i for i, row in enumerate(used)}
    test = embed(list(test_texts))  # (M, H)
    runs = []
    for rows in picks:
        classifier = LogisticRegression(max_iter=100, random_state=seed)
        classifier.fit(vectors[[position[i] for i in rows]], [train_labels[i] for i in rows])
        predicted = classifier.predict(test)
        runs.append({
            "accuracy": accuracy_score(test_labels, predicted),
            "f1": f1_score(test_labels, predicted, average="macro"),
            "f1_weighted": f1_score(test_labels, predicted, average="weighted"),
            "precision": precision_score(test_labels, predicted, average="macro", zero_division=0),
            "recall": recall_score(test_labels, predicted, average="macro"),
        })
    return {name: float(np.mean([run[name] for run in runs])) for name in runs[0]}
