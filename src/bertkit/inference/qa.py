"""Extractive question answering: answer spans in a context, with windows past the length limit.

Windows of `max_seq_length` pieces, `doc_stride` apart, as the original SQuAD code builds them
(`data.tasks.qa.qa_features`), and one decoder for every caller (`data.tasks.qa.decode_answers`):
in each window the best starts × ends within the passage, ranked across windows by start + end
logit, each start read from the window that gives it the most context; spans snapped to whole
words (the tokenizer's words), so "2026" is never returned as "202", nor "CPUs" as "CPU". An
answer's score is its probability among the n-best candidates (softmax of their start + end
logits, as the original BERT code's nbest_predictions). With "no answer" allowed (SQuAD 2.0), ""
is chosen when the [CLS] score (its smallest over the windows) beats the best span's by more
than `null_score_diff_threshold`.

Why this decoder: fine-tuning's evaluation and `bertkit qa` used to decode differently (start +
end logits, against p(start) · p(end) with a softmax per window and the largest of the windows'
null scores). Within one window they agree; across windows a per-window softmax makes a window
without the answer look as sure as the one with it, and the largest null score answers "" for
most long contexts. Measured on BBC articles as contexts (596 dev questions, 6 in 10 over 2+
windows; `bench/qa_decoders.py`, docs/benchmarks.md), the logit sum scored F1 78.2 against 76.2
(SQuAD 1.1-style) and 92.4 against 67.4 (2.0-style, with unanswerable questions); transformers'
way, [CLS] kept in each window's softmax, scored 76.9 and 92.0. Fine-tuning's evaluation decodes
here too (`answer_examples`), so a run's dev F1 is the F1 of these answers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import torch

from bertkit.data.formats.qa import QAExample, QAPrediction, QASettings, decode_answers, qa_features
from bertkit.inference.common import Use, as_texts, engine_for
from bertkit.inference.engine import Engine
from bertkit.inference.ner import token_logits


def qa(model: Engine | str | os.PathLike, questions: str | Sequence[str], contexts: str | Sequence[str],
       *, top_k: int = 1, max_answer_length: int = 30, max_seq_length: int = 384, doc_stride: int = 128,
       max_question_length: int = 64, allow_no_answer: bool = False, null_score_diff_threshold: float = 0.0,
       **options: Any) -> list[list[dict[str, Any]]]:
    """The top_k answers to each question: [{"text", "start", "end", "score"}], the chosen one first.

    contexts: one per question, or a single context for every question. start / end are
    character offsets into the context (end exclusive); score is the answer's probability among
    the n-best candidates. allow_no_answer: SQuAD 2.0 models may answer "" (start = end = 0) when
    the [CLS] score beats the best span's by more than null_score_diff_threshold.
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
    settings = QASettings(max_seq_length=max_seq_length, doc_stride=doc_stride,
                          max_query_length=max_question_length, max_answer_length=max_answer_length,
                          n_best=max(20, top_k), null_score_diff_threshold=null_score_diff_threshold)
    examples = [QAExample(str(i), q, c) for i, (q, c) in enumerate(zip(questions, contexts))]
    predictions = answer_examples(engine, examples, settings, allow_no_answer=allow_no_answer)
    return [prediction.answers(top_k) for prediction in predictions]


def answer_examples(engine: Engine, examples: Sequence[QAExample], settings: QASettings, *,
                    allow_no_answer: bool) -> list[QAPrediction]:
    """The decoded answer of each example (`data.tasks.qa.QAPrediction`), windows and decoding as
    `settings` say, the windows at most the engine's max_length pieces. What `qa` and
    fine-tuning's evaluation both answer with."""
    settings = dataclasses.replace(settings, max_seq_length=min(settings.max_seq_length, engine.max_length))
    encoded = qa_features(examples, engine.word_pieces, settings, training=False)
    spans = token_logits(engine, encoded.features, field="spans")  # (T_f, 2) per feature
    return decode_answers([s[:, 0] for s in spans], [s[:, 1] for s in spans], examples, encoded, settings,
                          allow_no_answer)


# ---------------------------------------------------------------------------------------------
# the use's record: a file's chunks, a service's merged runs, the exported graph
# ---------------------------------------------------------------------------------------------
def qa_chunk(engine: Engine, options: dict[str, Any]):
    """Records (question as the text, context as the pair) → {"answers"} per record."""
    return lambda records: [{"answers": a} for a in qa(engine, [r.text for r in records],
                                                        [r.pair for r in records], **options)]


def check_qa_file(pair_field: str | None, fmt: str) -> None:
    """A question needs its context: a file of rows must name the context column (SQuAD JSON
    holds both)."""
    if pair_field is None and fmt != "squad":
        raise ValueError("qa over a file needs the context column: pass --pair-field (e.g. context) "
                         "and --text-field for the question")


def run_qa(engine: Engine, key: tuple, pairs: Sequence[tuple[str, str]]) -> list[list[dict]]:
    """key: (top_k, max_answer_length, allow_no_answer); items: (question, context) pairs."""
    top_k, max_answer_length, allow_no_answer = key
    return qa(engine, [q for q, _ in pairs], [c for _, c in pairs], top_k=top_k,
              max_answer_length=max_answer_length, allow_no_answer=allow_no_answer)


def span_graph(model, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(B, T, H) → ((B, T) start logits, (B, T) end logits)."""
    return tuple(model.qa_outputs(model.dropout(hidden)).unbind(-1))


def predict_reading(task: str, path, suffix: str, fmt: str, columns: dict[str, str | None], stride: int | None,
                    saved: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """qa: SQuAD JSON (.json), else rows of question and context; the lengths fine-tuning used."""
    options = {"doc_stride": stride or 128, "max_answer_length": saved.get("max_answer_length", 30),
               "max_question_length": saved.get("max_query_length", 64),
               "allow_no_answer": bool(saved.get("version_2_with_negative")),
               "null_score_diff_threshold": saved.get("null_score_diff_threshold", 0.0)}
    if suffix == ".json":
        return "squad", {}, options
    # QA rows: fine-tuning read SQuAD files, so its column settings are not these.
    return fmt, {"text_field": columns["text_column"] or "question",
                 "pair_field": columns["pair_column"] or "context"}, options


USE = Use("qa", qa, chunk=qa_chunk, runner=run_qa, outputs=("start_logits", "end_logits"), graph=span_graph,
          check_file=check_qa_file, predict_reading=predict_reading)
