"""The words bertkit's rooms share, written once: tasks, uses, precisions, pooling modes, file
names, label names.

Torch-free and at the bottom of the layers, so the command line (which must not import torch to
print `--help`) and the library read the same tuples: a choice offered by a flag is a choice the
library accepts. The behaviour behind each word lives with its room (the task table in
`train/finetune/tasks.py`, the uses in `inference/uses.py`); this module holds the names only.
"""

from __future__ import annotations

# `bertkit finetune --task`: the heads trained on labelled files (classify, pair, ner, qa), then the
# retrieval models (a bi-encoder, a cross-encoder, SPLADE over the MLM head).
LABELLED_TASKS = ("classify", "pair", "ner", "qa")
FINETUNE_TASKS = LABELLED_TASKS + ("embed", "rerank", "sparse", "colbert")
# `bertkit distill --task` (task distillation; general distillation takes no task).
DISTILL_TASKS = ("classify", "ner")

# The engine's uses: what a model directory can be asked to do (`bertkit <use>`, `Engine.load(use=)`).
USES = ("embed", "embed-sparse", "fill-mask", "classify", "ner", "qa", "rerank", "embed-m3")
# The uses `bertkit export` writes a graph for (SPLADE's weights are computed from fill-mask's logits).
EXPORT_USES = ("embed", "fill-mask", "classify", "rerank", "ner", "qa")

# Precisions: what the engine runs (int8: dynamic quantization of the Linear layers), what training
# runs (int8 does not train); "auto" measures this machine once and keeps the faster.
ENGINE_PRECISIONS = ("auto", "fp32", "bf16", "int8", "int8-static")
TRAINING_PRECISIONS = ("auto", "fp32", "bf16")

# How tokens become one vector: every pooling the engine computes, and the ones a bi-encoder trains
# with (max pooling's gradient reaches one token a dimension: sentence-transformers trains with mean
# or [CLS] too). SPLADE pools its term weights by max (SPLADE v2) or sum (SPLADE v1).
POOLINGS = ("mean", "cls", "max")
TRAINED_POOLINGS = ("mean", "cls")
SPARSE_POOLINGS = ("max", "sum")

# What `bertkit finetune` writes beside the model: every setting of the run, which `bertkit predict`
# reads as its defaults.
FINETUNE_CONFIG = "finetune_config.json"

# The label value the losses skip, as PyTorch's cross_entropy and transformers do.
IGNORE_INDEX = -100


def label_name(index: int) -> str:
    """The name of output `index` of a head whose config.json names none: "LABEL_3", as transformers
    writes it."""
    return f"LABEL_{index}"
