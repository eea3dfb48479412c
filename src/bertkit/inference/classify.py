"""Sequence classification of texts and pairs, and cross-encoder reranking.

Scores as transformers' text-classification pipeline and sentence-transformers' CrossEncoder
give them: softmax over the labels of a single-label head; sigmoid per label for multi-label
heads and for heads with one label (a cross-encoder's relevance); raw values for regression.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from bertkit.data.formats.classify import ClassifyExample, aggregate_windows, classify_features
from bertkit.encoder.model import encoder_of
from bertkit.encoder.tasks import label_names
from bertkit.inference.common import Ids, Use, as_texts, column, engine_for, run_ids
from bertkit.inference.engine import Batch, Engine

FUNCTIONS = ("softmax", "sigmoid", "none")


def sequence_logits(engine: Engine, ids: Sequence[Sequence[int]],
                    type_ids: Sequence[Sequence[int]] | None) -> torch.Tensor:
    """(N, K) float32 logits of the classification head for token sequences (special tokens
    included), in input order."""
    out = torch.empty(len(ids), engine.config.num_labels)

    def head(model, batch: Batch) -> torch.Tensor:
        return model.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).logits.float()

    for index, rows in engine.run(ids, type_ids, head):
        out[index] = rows.cpu()
    return out


def logits(engine: Engine, texts: list[str], pairs: list[str] | None) -> torch.Tensor:
    """(N, K) float32 logits of texts (or pairs), each cut to the engine's max_length, in input order."""
    encodings = engine.encode(texts, pairs)
    return sequence_logits(engine, [e.ids for e in encodings], [e.type_ids for e in encodings])


def example_scores(engine: Engine, examples: Sequence[ClassifyExample], *, windows: bool = True,
                   stride: int | None = None) -> torch.Tensor:
    """(N, K) scores of classification examples: softmax probabilities (raw outputs for a
    regression head), averaged over each example's windows of max_length pieces, `stride` apart
    (default half a window). windows=False reads each example's first window only (what
    training sees). Fine-tuning's evaluation scores with this, and `classify(windows=True)`."""
    features = classify_features(examples, engine.word_pieces, engine.max_length, windows=windows, stride=stride)
    rows = sequence_logits(engine, [f["input_ids"] for f in features], [f["token_type_ids"] for f in features])
    return aggregate_windows(list(rows), features, len(examples), engine.config.problem_type == "regression")


def score_function(config) -> str:
    """The function that turns this head's logits into scores (the pipeline's rule)."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def classify(model: Engine | str | os.PathLike, texts: str | Sequence[str],
             pairs: str | Sequence[str] | None = None, *, function: str | None = None,
             windows: bool = False, stride: int | None = None, **options: Any) -> list[dict[str, Any]]:
    """Labels and scores: [{"label", "score", "scores": {label: score}}] per text, input order.

    pairs: second texts for a sentence-pair model ([CLS] a [SEP] b [SEP]). function: softmax,
    sigmoid or none (raw logits); default from the head (see the module docstring). A regression
    head gives {"value"} instead of labels.
    windows: a text past the model's limit is read through every window of it (`stride` pieces
    apart), softmax probabilities averaged (`example_scores`; softmax heads only), instead of being
    cut to the limit.
    """
    engine = engine_for(model, "classify", **options)
    texts = as_texts(texts)
    pairs = None if pairs is None else as_texts(pairs, "pair text")
    function = function or score_function(engine.config)
    if function not in FUNCTIONS:
        raise ValueError(f"unknown function {function!r}; use one of {', '.join(FUNCTIONS)}")
    regression = engine.config.problem_type == "regression"
    if windows:
        if function != "softmax" and not regression:
            raise ValueError(f"windows average softmax probabilities; function {function!r} cannot be "
                             "averaged over windows, so pass windows=False (texts cut to the limit)")
        examples = [ClassifyExample(t, p, None) for t, p in zip(texts, pairs or [None] * len(texts))]
        scores = example_scores(engine, examples, stride=stride)  # (N, K)
        if regression:
            return [{"value": float(row[0])} for row in scores]
    else:
        raw = logits(engine, texts, pairs)  # (N, K)
        if regression:
            return [{"value": float(row[0])} for row in raw]
        scores = raw.softmax(-1) if function == "softmax" else raw.sigmoid() if function == "sigmoid" else raw
    names = label_names(engine.config)
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


# ---------------------------------------------------------------------------------------------
# the uses' records: a file's chunks, a service's merged runs, the exported graph
# ---------------------------------------------------------------------------------------------
def classify_chunk(engine: Engine, options: dict[str, Any]):
    """Records (with their pair texts, if the file has them) → `classify`'s dict per record."""
    def classify_records(records):
        pairs = [r.pair for r in records] if records[0].pair is not None else None
        return classify(engine, [r.text for r in records], pairs, **options)
    return classify_records


def rerank_chunk(engine: Engine, options: dict[str, Any]):
    """Records (documents) → {"score"} per record, its relevance to options' `query`, in file order."""
    query = options.pop("query")

    def score_records(records):
        scored = rerank(engine, query, [r.text for r in records], **options)
        by_index = {s["index"]: s["score"] for s in scored}
        return [{"score": by_index[i]} for i in range(len(records))]
    return score_records


def run_logits(engine: Engine, key: tuple, items: Sequence[Ids]) -> list[torch.Tensor]:
    """(K,) float32 classifier logits per sequence (a text or a pair): /predict and /rerank."""

    def head(m, batch) -> torch.Tensor:
        return m.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).logits.float().cpu()

    return run_ids(engine, items, head)


def sentence_graph(model, hidden: torch.Tensor) -> tuple[torch.Tensor]:
    """(B, T, H) → ((B, K) logits,) from the [CLS] state, through the pooler where the head has one."""
    encoder = encoder_of(model)
    first = hidden[:, 0]  # (B, H) the [CLS] state
    pooled = torch.tanh(encoder.pooler(first)) if encoder.pooler is not None else None
    return (model.sentence_logits(first, pooled),)  # (B, K)


def predict_reading(task: str, path, suffix: str, fmt: str, columns: dict[str, str | None], stride: int | None,
                    saved: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """classify / pair: the text column (and the pair's), every window of a long text read."""
    reading = {"text_field": column(columns, saved, "text_column", "text")}
    if task == "pair":
        reading["pair_field"] = column(columns, saved, "pair_column", "text_pair")
        if suffix in (".txt", ".text"):  # a line is one text; a pair model would see half its input
            raise ValueError(f"{path}: a .txt file holds single texts (one a line), but the model "
                             "is for text pairs (task pair); give a CSV / TSV / JSONL file with "
                             f"columns {reading['text_field']!r} and {reading['pair_field']!r}")
    return fmt, reading, {"windows": True, "stride": stride}


USE = Use("classify", classify, chunk=classify_chunk, runner=run_logits, outputs=("logits",),
          graph=sentence_graph, predict_reading=predict_reading)
RERANK_USE = Use("rerank", rerank, chunk=rerank_chunk, runner=run_logits, outputs=("logits",),
                 graph=sentence_graph)
