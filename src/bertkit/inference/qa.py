"""Extractive question answering: answer spans in a context, with windows past the length limit.

Windows of `max_seq_length` pieces, `doc_stride` apart, as the original SQuAD code builds them
(`data.tasks.qa.qa_features`). A span's score is p(start) · p(end), each a softmax over the
window's passage pieces (and [CLS] when "no answer" is allowed), as transformers'
question-answering pipeline scores. Spans are snapped to whole words (the tokenizer's words), so
"2026" is never returned as "202", nor "CPUs" as "CPU"; the same span found in several windows
is returned once, with its best score.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import torch

from bertkit.data.tasks.common import max_context_owner
from bertkit.data.tasks.qa import QAExample, QASettings, qa_features, snap_to_words
from bertkit.inference.common import as_texts, engine_for
from bertkit.inference.engine import Engine
from bertkit.inference.ner import token_logits


def qa(model: Engine | str | os.PathLike, questions: str | Sequence[str], contexts: str | Sequence[str],
       *, top_k: int = 1, max_answer_length: int = 30, max_seq_length: int = 384, doc_stride: int = 128,
       max_question_length: int = 64, allow_no_answer: bool = False, **options: Any
       ) -> list[list[dict[str, Any]]]:
    """The top_k answers to each question: [{"text", "start", "end", "score"}] best first.

    contexts: one per question, or a single context for every question. start / end are
    character offsets into the context (end exclusive). allow_no_answer: SQuAD 2.0 models may
    answer "" (start = end = 0) when the [CLS] score beats every span.
    """
    engine = engine_for(model, "qa", **options)
    questions = as_texts(questions, "question")
    contexts = as_texts(contexts, "context")
    if len(contexts) == 1 and len(questions) > 1:
        contexts = contexts * len(questions)
    if len(contexts) != len(questions):
        raise ValueError(f"got {len(questions)} questions but {len(contexts)} contexts; give one "
                         "context per question, or one for all")
    if top_k < 1:
        raise ValueError(f"top_k must be positive, got {top_k}")
    settings = QASettings(max_seq_length=min(max_seq_length, engine.max_length),
                          doc_stride=doc_stride, max_query_length=max_question_length,
                          max_answer_length=max_answer_length, n_best=max(20, top_k))
    examples = [QAExample(str(i), q, c) for i, (q, c) in enumerate(zip(questions, contexts))]
    return answer_examples(engine, examples, settings, allow_no_answer=allow_no_answer, top_k=top_k)


def answer_examples(engine: Engine, examples: Sequence[QAExample], settings: QASettings, *,
                    allow_no_answer: bool, top_k: int = 1) -> list[list[dict[str, Any]]]:
    """The top_k answers of each example, windows and decoding as `settings` say (the windows
    are at most the engine's max_length). What `qa` and fine-tuning's evaluation both decode with."""
    settings = dataclasses.replace(settings, max_seq_length=min(settings.max_seq_length, engine.max_length))
    encoded = qa_features(examples, engine.word_pieces, settings, training=False)
    spans = token_logits(engine, encoded.features, field="spans")  # (T_f, 2) per feature
    by_example: dict[int, list[int]] = {}
    for f, feature in enumerate(encoded.features):
        by_example.setdefault(feature["example"], []).append(f)
    return [_answers(example, [encoded.features[f] for f in by_example.get(i, [])],
                     [spans[f] for f in by_example.get(i, [])], encoded.offsets[i], encoded.words[i],
                     settings, top_k, allow_no_answer)
            for i, example in enumerate(examples)]


def _answers(example: QAExample, features: list[dict[str, Any]], logits: list[torch.Tensor],
             offsets: list[tuple[int, int]], words: list[int | None], settings: QASettings,
             top_k: int, allow_no_answer: bool) -> list[dict[str, Any]]:
    owner = max_context_owner([f["span"] for f in features], len(offsets))
    best: dict[tuple[int, int], float] = {}  # (char start, char end) → best score
    null_score = 0.0
    for w, (feature, window) in enumerate(zip(features, logits)):
        c0 = feature["context_start"]
        first, last = feature["span"]
        n = last - first
        if n == 0:
            continue
        # softmax over the passage pieces (and [CLS] when "no answer" may be given)
        rows = torch.cat([window[:1], window[c0:c0 + n]]) if allow_no_answer else window[c0:c0 + n]
        probs = rows.softmax(0)  # (n [+1], 2)
        if allow_no_answer:
            null_score = max(null_score, float(probs[0, 0] * probs[0, 1]))
            probs = probs[1:]
        p_start, p_end = probs[:, 0], probs[:, 1]  # (n,)
        k = min(settings.n_best, n)
        for s in p_start.topk(k).indices.tolist():
            if owner[first + s] != w:
                continue  # another window sees this start with more context
            for e in p_end.topk(k).indices.tolist():
                if e < s or e - s + 1 > settings.max_answer_length:
                    continue
                span = _snap(first + s, first + e, offsets, words)
                score = float(p_start[s] * p_end[e])
                if score > best.get(span, -1.0):
                    best[span] = score
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))
    answers = [{"text": example.context[s:e], "start": s, "end": e, "score": score}
               for (s, e), score in ranked]
    if allow_no_answer:
        answers.append({"text": "", "start": 0, "end": 0, "score": null_score})
        answers.sort(key=lambda a: -a["score"])
    return answers[:top_k]


def _snap(s: int, e: int, offsets: list[tuple[int, int]], words: list[int | None]) -> tuple[int, int]:
    """Character span of pieces s..e widened to the whole words they touch."""
    s, e = snap_to_words(s, e, words)
    return offsets[s][0], offsets[e][1]
