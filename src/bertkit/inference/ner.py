"""Named entities in raw text: typed spans with character offsets, from a token classifier.

The text is split into the tokenizer's words (whitespace, punctuation, single CJK characters);
each word is scored at its first piece, from the window that gives it most context when the
text is longer than the model's limit; the tag sequence is the most probable *valid* BIO / BIOES
sequence (constrained Viterbi), so every entity is a well-formed span.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from bertkit.data.tasks import ner as tasks_ner
from bertkit.data.tasks.common import WordPieces
from bertkit.inference.common import as_texts, engine_for
from bertkit.inference.engine import Batch, Engine


def word_pieces(engine: Engine) -> WordPieces:
    """The engine's tokenizer as plain word pieces (made once per engine)."""
    pieces = getattr(engine, "_word_pieces", None)
    if pieces is None:
        pieces = engine._word_pieces = WordPieces.of(engine.tokenizer)
    return pieces


def token_logits(engine: Engine, features: Sequence[dict[str, Any]], field: str = "logits"
                 ) -> list[torch.Tensor]:
    """One (T_f, ...) float32 tensor per feature of the head's per-token output `field`."""
    out: list[Any] = [None] * len(features)

    def head(model, batch: Batch):
        result = model.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed)
        if field == "spans":
            values = torch.stack([result.start_logits, result.end_logits], -1)  # (N, 2)
        else:
            values = getattr(result, field)  # (N, K)
        return batch.split(values.float().cpu())

    ids = [f["input_ids"] for f in features]
    types = [f["token_type_ids"] for f in features]
    for index, rows in engine.run(ids, types, head):
        for i, row in zip(index, rows):
            out[i] = row
    return out


def ner(model: Engine | str | os.PathLike, texts: str | Sequence[str], *, stride: int | None = None,
        **options: Any) -> list[list[dict[str, Any]]]:
    """Entities of each text: [{"type", "text", "start", "end", "score"}] in text order.

    start / end are character offsets into the text (end exclusive); score is the mean
    probability of the entity's word tags. stride: pieces between window starts for texts
    longer than the model's limit (default half a window).
    """
    engine = engine_for(model, "ner", **options)
    texts = as_texts(texts)
    id2label = engine.config.id2label
    if not id2label:
        raise ValueError("the model has no id2label in its config.json, so its tags cannot be named; "
                         "use a model made by `bertkit finetune --task ner`")
    names = [id2label[i] for i in range(engine.config.num_labels)]
    pieces = word_pieces(engine)
    splits = tasks_ner.split_words(pieces, texts)
    encoded = tasks_ner.ner_features([tasks_ner.NerSentence(s.words, None) for s in splits], pieces,
                                     engine.max_length, stride=stride)
    words = tasks_ner.word_logits(token_logits(engine, encoded.features), encoded)
    out = []
    for split, rows in zip(splits, words):
        if rows is None:
            out.append([])
            continue
        log_probs = rows.log_softmax(-1)  # (W, C)
        tags = tasks_ner.constrained_decode(log_probs, names)
        entities = []
        for entity in tasks_ner.entities_with_offsets(tags, split):
            chosen = [names.index(t) for t in tags[entity["word_start"]:entity["word_end"]]]
            probs = log_probs[torch.arange(entity["word_start"], entity["word_end"]), chosen].exp()
            entities.append({"type": entity["type"], "text": entity["text"], "start": entity["start"],
                             "end": entity["end"], "score": float(probs.mean())})
        out.append(entities)
    return out
