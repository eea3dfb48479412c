"""Named entities: typed spans with character offsets, from a token classifier.

Raw text is split into the tokenizer's words (whitespace, punctuation, single CJK characters);
pre-split words (CoNLL sentences, fine-tuning's evaluation) are taken as they are. Each word is
scored at its first piece, from the window that gives it most context when the text is longer
than the model's limit; the tag sequence is the most probable *valid* BIO / BIOES sequence
(constrained Viterbi), so every entity is a well-formed span. An entity's score is the mean
probability of its words' tags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from bertkit.data.formats import ner as tasks_ner
from bertkit.encoder.tasks import label_names
from bertkit.inference.common import Use, as_texts, column, engine_for
from bertkit.inference.engine import Batch, Engine


def token_logits(engine: Engine, features: Sequence[dict[str, Any]], field: str = "logits"
                 ) -> list[torch.Tensor]:
    """One (T_f, ...) float32 tensor per feature of the head's per-token output `field`
    ("spans": start and end logits stacked, (T_f, 2))."""

    def head(model, batch: Batch):
        result = model.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed)
        if field == "spans":
            values = torch.stack([result.start_logits, result.end_logits], -1)  # (N, 2)
        else:
            values = getattr(result, field)  # (N, K)
        return batch.split(values.float().cpu())

    ids = [f["input_ids"] for f in features]
    types = [f["token_type_ids"] for f in features]
    return engine.run_ordered(ids, types, head)


@dataclass
class WordTags:
    """One sentence's predicted tags, and each word's log-probabilities over the tags (W, C);
    None when the sentence has no word the tokenizer could split into pieces."""

    tags: list[str]
    log_probs: torch.Tensor | None

    def entities(self, split: tasks_ner.WordSplit, names: Sequence[str]) -> list[dict[str, Any]]:
        """{"type", "text", "start", "end", "score"} per entity, offsets into `split.text`."""
        out = []
        for entity in tasks_ner.entities_with_offsets(self.tags, split):
            words = range(entity["word_start"], entity["word_end"])
            chosen = [names.index(t) for t in self.tags[entity["word_start"]:entity["word_end"]]]
            probs = self.log_probs[torch.tensor(list(words)), chosen].exp()
            out.append({"type": entity["type"], "text": entity["text"], "start": entity["start"],
                        "end": entity["end"], "score": float(probs.mean())})
        return out


def tag_names(engine: Engine) -> list[str]:
    if not engine.config.id2label:
        raise ValueError("the model has no id2label in its config.json, so its tags cannot be named; "
                         "use a model made by `bertkit finetune --task ner`")
    return label_names(engine.config)


def tag_words(engine: Engine, sentences: Sequence[Sequence[str]], *, stride: int | None = None
              ) -> list[WordTags]:
    """The tags of pre-split sentences. stride: pieces between window starts for sentences longer
    than the model's limit (default half a window)."""
    names = tag_names(engine)
    encoded = tasks_ner.ner_features([tasks_ner.NerSentence(list(s), None) for s in sentences],
                                     engine.word_pieces, engine.max_length, stride=stride)
    out = []
    for sentence, rows in zip(sentences, tasks_ner.word_logits(token_logits(engine, encoded.features), encoded)):
        if rows is None:
            out.append(WordTags(["O"] * len(sentence), None))
            continue
        log_probs = rows.log_softmax(-1)  # (W, C)
        out.append(WordTags(tasks_ner.constrained_decode(log_probs, names), log_probs))
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
    names = tag_names(engine)
    splits = tasks_ner.split_words(engine.word_pieces, texts)
    tagged = tag_words(engine, [s.words for s in splits], stride=stride)
    return [[] if t.log_probs is None else t.entities(split, names) for split, t in zip(splits, tagged)]


def ner_words(model: Engine | str | os.PathLike, sentences: Sequence[Sequence[str]], *,
              stride: int | None = None, **options: Any) -> list[dict[str, Any]]:
    """Tags and entities of pre-split sentences (CoNLL words): {"tokens", "tags", "entities"} per
    sentence, the entities' offsets into the words joined as `data.tasks.ner.join_words` joins them."""
    engine = engine_for(model, "ner", **options)
    if not sentences or any(not s for s in sentences):
        raise ValueError("ner_words needs sentences of at least one word each")
    names = tag_names(engine)
    out = []
    for words, tagged in zip(sentences, tag_words(engine, sentences, stride=stride)):
        split = tasks_ner.join_words(words)
        entities = [] if tagged.log_probs is None else tagged.entities(split, names)
        out.append({"tokens": list(words), "tags": tagged.tags, "entities": entities})
    return out


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs, the exported graph
# ---------------------------------------------------------------------------------------------
def ner_chunk(engine: Engine, options: dict[str, Any]):
    """Records → {"entities"} per raw text, or `ner_words`' tags per word for pre-split words."""
    def ner_records(records):
        if records[0].words is not None:  # pre-split words (CoNLL): tags per word too
            return ner_words(engine, [r.words for r in records], **options)
        return [{"entities": e} for e in ner(engine, [r.text for r in records], **options)]
    return ner_records


def run_ner(engine: Engine, key: tuple, texts: Sequence[str]) -> list[list[dict]]:
    """The entities of each text (no options: key is ())."""
    return ner(engine, list(texts))


def token_graph(model, hidden: torch.Tensor) -> tuple[torch.Tensor]:
    """(B, T, H) → ((B, T, K) tag logits,)."""
    return (model.classifier(model.dropout(hidden)),)


def predict_reading(task: str, path, suffix: str, fmt: str, columns: dict[str, str | None], stride: int | None,
                    saved: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """ner: raw text (.txt), JSON Lines words (.jsonl / .json / .ndjson), else CoNLL."""
    if suffix in (".txt", ".text"):
        return "txt", {}, {"stride": stride}
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl", {"words_field": column(columns, saved, "tokens_key", "tokens")}, {"stride": stride}
    return "conll", {}, {"stride": stride}


USE = Use("ner", ner, chunk=ner_chunk, runner=run_ner, outputs=("logits",), graph=token_graph,
          predict_reading=predict_reading)
