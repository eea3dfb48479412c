"""Whether a fine-tuning run could have learned: the warnings a run prints and writes to eval.json.

A run that is too short, or that ends where it started, still writes a model and a score; without
a word the score reads like a result. Three checks, each against a number the run itself measured:

- **steps**: fewer than `MIN_STEPS` optimizer steps. The linear schedule warms up over the first
  10% and decays to 0, so a 10-step run (300 examples at batch 32, one epoch) makes a handful of
  updates at any useful rate. BERT's own smallest fine-tuning (MRPC: 3,668 pairs, batch 32, 3
  epochs) is about 340 steps.
- **chance loss**: the mean training loss of the last epoch (or the last tenth of steps) still at
  least `CHANCE_FRACTION` of the loss of a uniform guess: ln(labels) for a classifier or tagger,
  ln(window) for QA's start and end, ln(1 + negatives) for a listwise reranker, ln 2 per pair
  (bce), ln(batch) for in-batch contrastive embeddings, ln(batch × (1 + hard negatives)) for SPLADE.
- **trivial baseline**: the evaluation metric no better than a predictor that ignores its input —
  a classifier's accuracy against always answering the most frequent label of that evaluation set,
  a reranker's MRR@10 against the first stage's own order of the same candidates.

The checks are the same for every task; what a task's loss chooses among and which trivial
predictor it is measured against belong to its trainer, and its row in the task table
(`train/finetune/tasks.py`) names both.
"""

from __future__ import annotations

import math
from typing import Any

MIN_STEPS = 100
CHANCE_FRACTION = 0.9


def uniform_guess(choices: int) -> float | None:
    """The cross-entropy of a uniform guess among `choices` outcomes, ln(choices); None below two
    (nothing to guess). A task's chance loss is this over what its loss chooses among."""
    return math.log(choices) if choices > 1 else None


def no_baseline(scores: dict[str, Any], metric: str, split: str) -> str | None:
    """The baseline check of a task that scores no trivial predictor: never a warning."""
    return None


def step_warning(steps: int, *, examples: int, batch_size: int, epochs: int) -> str | None:
    """The warning for a run of fewer than MIN_STEPS optimizer steps, with how to get more."""
    if steps >= MIN_STEPS:
        return None
    return (f"only {steps} optimizer steps ({examples} training examples at batch {batch_size}, "
            f"{epochs} epoch{'s' if epochs != 1 else ''}): too short to learn much; fine-tuning "
            f"usually takes a few hundred or more — raise --epochs, lower --batch-size or add data")


def loss_warning(last_loss: float | None, chance: float | None) -> str | None:
    """The warning for a training loss that ended near a uniform guess's."""
    if last_loss is None or chance is None or last_loss < CHANCE_FRACTION * chance:
        return None
    return (f"the training loss ended at {last_loss:.3f}, near chance ({chance:.3f}, a uniform "
            "guess): the model learned little; try another --lr, more steps, or check the labels")


def baseline_warning(metric: str, value: float | None, baseline: float | None, baseline_name: str,
                     split: str) -> str | None:
    """The warning for an evaluation score no better than a trivial predictor's (higher = better)."""
    if value is None or baseline is None or value > baseline:
        return None
    return (f"{split} {metric} {value:.4f} is no better than {baseline_name} ({baseline:.4f}): the "
            "model has not learned the task")


def collect(*warnings: str | None) -> list[str]:
    """The warnings that apply, in order."""
    return [w for w in warnings if w]
