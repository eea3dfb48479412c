"""Sequence classification of texts and pairs, and cross-encoder reranking.

Scores as transformers' text-classification pipeline and sentence-transformers' CrossEncoder
give them: softmax over the labels of a single-label head; sigmoid per label for multi-label
heads and for heads with one label (a cross-encoder's relevance); raw values for regression.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from bertkit.inference.common import as_texts, engine_for
from bertkit.inference.engine import Batch, Engine

FUNCTIONS = ("softmax", "sigmoid", "none")


def logits(engine: Engine, texts: list[str], pairs: list[str] | None) -> torch.Tensor:
    """(N, K) float32 logits of the classification head, in input order."""
    out = torch.empty(len(texts), engine.config.num_labels)

    def head(model, batch: Batch) -> torch.Tensor:
        return model.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).logits.float()

    for index, rows in engine.run_encodings(engine.encode(texts, pairs), head):
        out[index] = rows.cpu()
    return out


def score_function(config) -> str:
    """The function that turns this head's logits into scores (the pipeline's rule)."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def classify(model: Engine | str | os.PathLike, texts: str | Sequence[str],
             pairs: str | Sequence[str] | None = None, *, function: str | None = None,
             **options: Any) -> list[dict[str, Any]]:
    """Labels and scores: [{"label", "score", "scores": {label: score}}] per text, input order.

    pairs: second texts for a sentence-pair model ([CLS] a [SEP] b [SEP]). function: softmax,
    sigmoid or none (raw logits); default from the head (see the module docstring). A regression
    head gives {"value"} instead of labels.
    """
    engine = engine_for(model, "classify", **options)
    texts = as_texts(texts)
    pairs = None if pairs is None else as_texts(pairs, "pair text")
    function = function or score_function(engine.config)
    if function not in FUNCTIONS:
        raise ValueError(f"unknown function {function!r}; use one of {', '.join(FUNCTIONS)}")
    raw = logits(engine, texts, pairs)  # (N, K)
    if engine.config.problem_type == "regression":
        return [{"value": float(row[0])} for row in raw]
    scores = raw.softmax(-1) if function == "softmax" else raw.sigmoid() if function == "sigmoid" else raw
    id2label = engine.config.id2label or {i: f"LABEL_{i}" for i in range(engine.config.num_labels)}
    names = [id2label[i] for i in range(scores.shape[1])]
    out = []
    for row in scores.tolist():
        best = max(range(len(row)), key=row.__getitem__)
        out.append({"label": names[best], "score": row[best], "scores": dict(zip(names, row))})
    return out


def rerank(model: Engine | str | os.PathLike, query: str, documents: Sequence[str], *,
           top_k: int | None = None, raw_scores: bool = False, **options: Any) -> list[dict[str, Any]]:
    """Documents ordered by a cross-encoder's relevance to `query`: [{"index", "score"}], best first.

    Each (query, document) pair is read as [CLS] query [SEP] document [SEP]; the score is the
    sigmoid of the head's one logit (raw_scores: the logit itself), as sentence-transformers'
    CrossEncoder scores. `index` is the document's position in `documents`.
    """
    engine = engine_for(model, "rerank", **options)
    query = as_texts(query, "query")[0]
    documents = as_texts(documents, "document")
    if engine.config.num_labels != 1:
        raise ValueError(f"rerank needs a cross-encoder with one output (relevance); this head has "
                         f"{engine.config.num_labels} labels ({', '.join((engine.config.id2label or {}).values())}); "
                         "use classify for it")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be positive, got {top_k}")
    raw = logits(engine, [query] * len(documents), documents)[:, 0]  # (D,)
    scores = raw if raw_scores else raw.sigmoid()
    order = sorted(range(len(documents)), key=lambda i: (-float(scores[i]), i))[:top_k]
    return [{"index": i, "score": float(scores[i])} for i in order]
