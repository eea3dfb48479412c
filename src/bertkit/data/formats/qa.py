"""Extractive question answering on SQuAD v1.1 / v2.0 files: features, windows, span decoding.

Follows the original BERT `run_squad.py` procedure (Devlin et al. 2019, section 4.2-4.3):

- The question is cut to `max_query_length` (64) pieces; a feature is
  `[CLS] question [SEP] passage-window [SEP]` of at most `max_seq_length` (384) pieces, with
  segment 0 for the question and 1 for the passage — or whatever pair layout the model's
  tokenizer makes (RoBERTa: `<s> question </s></s> passage-window </s>`, segment 0 throughout,
  as transformers' question-answering pipeline feeds it).
- Passages longer than a window are read through overlapping windows whose starts are
  `doc_stride` (128) pieces apart (note: the distance between window starts, as in `run_squad.py`;
  other code calls the *overlap* the stride).
- Training: the answer's first and last pieces are the targets when the window holds the whole
  answer; otherwise, and for unanswerable questions (v2.0), both targets are 0 ([CLS]).
- Decoding: in every window the `n_best` (20) highest start and end scores within the passage
  give candidate spans (start <= end, at most `max_answer_length` (30) pieces, start in the window
  that gives it the most context); the best by start + end score is the answer, cut from the
  original passage through the pieces' character offsets (no detokenisation). For v2.0 the null
  score is the smallest [CLS] start + end score over the windows; "no answer" is predicted when
  null score − best span score > `null_score_diff_threshold` (0.0).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from bertkit.data.formats.common import WordPieces, max_context_owner, window_spans
from bertkit.data.report import DataReport, read_text


@dataclass
class QAExample:
    """One question: `answers` as (text, character start in context) pairs; empty when
    `is_impossible` (v2.0) or unknown (prediction input). `where` = file:line (question id)."""

    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False
    where: str = ""
    line: int = 0  # line of the question's id in the file (0 when not read from one)


@dataclass
class QASettings:
    """Windowing and decoding settings; the defaults are `run_squad.py`'s."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    # v2.0: answer "" when null score − best span score exceeds this; tune it on dev data.
    null_score_diff_threshold: float = 0.0
    # Whether "no answer" may be predicted (SQuAD v2.0); None = as the data file says.
    version_2_with_negative: bool | None = None


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def read_squad(path: str | os.PathLike, *, training: bool,
               report: DataReport | None = None) -> tuple[list[QAExample], DataReport, bool]:
    """Read a SQuAD-format JSON file (v1.1 or v2.0).

    training: answers are needed to make targets, so an answerable question whose first answer
      text is not found at its `answer_start` (or that has no answer) is reported and skipped.
      In evaluation only the answer texts are scored: an answer that is not at its
      `answer_start` keeps its question and is reported (`report.notes`, file, line and id).
    report: where bad questions are counted (a new DataReport when None).
    Returns (examples, report, is_v2): is_v2 when the file says version "v2..." or any question
    carries `is_impossible`. Questions with an empty question or context, or a repeated id, are
    skipped; ValueError when none is usable.
    """
    path = Path(path)
    raw = read_text(path)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file; expected {{\"data\": [{{\"paragraphs\": "
                         "[{\"context\": ..., \"qas\": [...]}]}]}")
    lines = _id_lines(raw)
    report = DataReport(str(path)) if report is None else report
    is_v2 = str(data.get("version", "")).startswith("v2")
    examples, seen = [], set()
    for article in data["data"]:
        for paragraph in article.get("paragraphs", []) if isinstance(article, dict) else []:
            context = paragraph.get("context", "") if isinstance(paragraph, dict) else ""
            for qa in paragraph.get("qas", []) if isinstance(paragraph, dict) else []:
                qid = str(qa.get("id", ""))
                where = f"{path}:{lines.get(qid, '?')} (question id {qid!r})"
                is_v2 = is_v2 or "is_impossible" in qa
                problem = _qa_problem(qa, qid, context, seen, training)
                if problem:
                    report.skip_problem(where, problem)
                    continue
                seen.add(qid)
                if not training:
                    for note in _offset_problems(qa, context):
                        report.note(where, note)
                impossible = bool(qa.get("is_impossible", False))
                answers = [] if impossible else [(str(a["text"]), int(a["answer_start"]))
                                                 for a in qa.get("answers", [])
                                                 if isinstance(a, dict) and "text" in a]
                examples.append(QAExample(qid, str(qa["question"]), context, answers, impossible, where,
                                          lines.get(qid, 0)))
    report.n_kept = len(examples)
    report.require_rows()
    return examples, report, is_v2


def _id_lines(raw: str) -> dict[str, int]:
    """Question id -> line number in the JSON text, so bad questions can be located."""
    out = {}
    for m in re.finditer(r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"', raw):
        out.setdefault(m.group(1), raw.count("\n", 0, m.start()) + 1)
    return out


def _offset_problems(qa: dict, context: str) -> list[str]:
    """Eval answers whose text is not at their `answer_start`: only the text is scored, so the
    question is kept, but a wrong offset usually means the file was edited or built wrongly."""
    problems = []
    for answer in qa.get("answers") or []:
        if not isinstance(answer, dict) or "text" not in answer:
            continue
        text = str(answer["text"])
        try:
            start = int(answer.get("answer_start"))
        except (TypeError, ValueError):
            problems.append(f"answer {text!r} has no integer answer_start; fix answer_start")
            continue
        if context[start:start + len(text)] != text:
            found = context.find(text)
            hint = f" (it occurs at {found})" if found >= 0 else " (and nowhere in the context)"
            problems.append(f"answer {text!r} is not at answer_start {start}{hint}; only the answer "
                            "text is scored, fix answer_start")
    return problems


def _qa_problem(qa: Any, qid: str, context: str, seen: set[str], training: bool) -> str | None:
    if not isinstance(qa, dict) or not qid:
        return "question without an id"
    if qid in seen:
        return "repeated question id (ids must be unique)"
    if not str(qa.get("question", "")).strip():
        return "empty question"
    if not context.strip():
        return "empty context"
    if not training or qa.get("is_impossible", False):
        return None
    answers = qa.get("answers") or []
    if not answers:
        return "answerable question without answers (mark it is_impossible for SQuAD v2.0)"
    first = answers[0]
    try:
        text, start = str(first["text"]), int(first["answer_start"])
    except (KeyError, TypeError, ValueError):
        return "answer needs 'text' and an integer 'answer_start'"
    if not text.strip():
        return "empty answer text"
    if context[start:start + len(text)] != text:
        found = context.find(text)
        hint = f" (it occurs at {found})" if found >= 0 else " (and nowhere in the context)"
        return (f"answer {text!r} is not at answer_start {start}{hint}; fix answer_start, the "
                "targets would be wrong")
    return None


# ---------------------------------------------------------------------------------------------
# features
# ---------------------------------------------------------------------------------------------
@dataclass
class QAEncoded:
    """Features and what maps them back to passages.

    features: input_ids, token_type_ids, example (index), span ([start, end) of passage pieces in
      the window), context_start (position of the window's first passage piece in the feature),
      and, when training, start_positions / end_positions.
    offsets[i]: (start, end) character span in example i's context of each passage piece.
    words[i]: the tokenizer's word index of each passage piece (for snapping spans to words).
    n_unreachable: training answers the tokenizer could not map to pieces (skipped).
    """

    features: list[dict[str, Any]]
    offsets: list[list[tuple[int, int]]]
    n_unreachable: int = 0
    words: list[list[int | None]] = field(default_factory=list)


def qa_features(examples: Sequence[QAExample], pieces: WordPieces, settings: QASettings, *,
                training: bool) -> QAEncoded:
    """Windowed features for each question (see the module docstring for the layout)."""
    if settings.max_query_length < 1:
        raise ValueError(f"max_query_length must be >= 1, got {settings.max_query_length}")
    contexts = sorted({e.context for e in examples})
    ctx_enc = dict(zip(contexts, pieces.encode(contexts)))  # passages shared by questions: once
    q_enc = pieces.encode([e.question for e in examples])
    out = QAEncoded([], [])
    for i, (example, q) in enumerate(zip(examples, q_enc)):
        ctx = ctx_enc[example.context]
        query = q.ids[:settings.max_query_length]
        head = [pieces.cls_id] + query + list(pieces.pair_middle)
        budget = settings.max_seq_length - len(head) - 1  # the closing separator
        if budget < 1:
            raise ValueError(f"max_seq_length {settings.max_seq_length} leaves no room for the "
                             f"passage after a {len(query)}-piece question; raise --max-length or "
                             "lower --max-query-length")
        out.offsets.append(list(ctx.offsets))
        out.words.append(list(ctx.word_ids))
        target = _answer_pieces(example, ctx.offsets) if training else None
        if training and target is None and not example.is_impossible:
            out.n_unreachable += 1
            continue
        for start, end in window_spans(len(ctx.ids), budget, min(settings.doc_stride, budget)):
            feature = {
                "input_ids": head + ctx.ids[start:end] + [pieces.sep_id],
                "token_type_ids": [0] * len(head) + [pieces.second_type_id] * (end - start + 1),
                "example": i,
                "span": (start, end),
                "context_start": len(head),
            }
            if training:
                # Windows without the whole answer point at [CLS], as unanswerable ones do.
                s, e = 0, 0
                if target is not None and start <= target[0] and target[1] < end:
                    s, e = target[0] - start + len(head), target[1] - start + len(head)
                feature["start_positions"], feature["end_positions"] = s, e
            out.features.append(feature)
    return out


def _answer_pieces(example: QAExample, offsets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """First and last passage piece overlapping the first answer; None when unanswerable/unmapped."""
    if example.is_impossible or not example.answers:
        return None
    text, char_start = example.answers[0]
    char_end = char_start + len(text)
    inside = [p for p, (s, e) in enumerate(offsets) if e > char_start and s < char_end and e > s]
    return (inside[0], inside[-1]) if inside else None


# ---------------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------------
@dataclass
class QAPrediction:
    """The answer to one question: `text` ("" = no answer), `score` (start + end logit of the
    best span), `null_score_diff` (null score − best span score; v2.0 only, else None), and the
    n-best list of {text, start, end, score, probability}, best first: character offsets into the
    context ("" at 0, 0), start + end logit, and the softmax of those over the list (the original
    BERT code's nbest probabilities).

    `answers(top_k)` is what `bertkit qa` returns: the chosen answer first, then the rest of the
    n-best list by score, each {text, start, end, score = its probability}."""

    id: str
    text: str
    score: float
    null_score_diff: float | None
    nbest: list[dict[str, Any]]

    def answers(self, top_k: int = 1) -> list[dict[str, Any]]:
        ordered = sorted(self.nbest, key=lambda c: (c["text"] != self.text, -c["score"]))
        return [{"text": c["text"], "start": c["start"], "end": c["end"], "score": c["probability"]}
                for c in ordered[:top_k]]


def decode_answers(start_logits: Sequence[torch.Tensor], end_logits: Sequence[torch.Tensor],
                   examples: Sequence[QAExample], encoded: QAEncoded, settings: QASettings,
                   allow_null: bool) -> list[QAPrediction]:
    """The best answer span of each question from its windows' start/end logits.

    start_logits / end_logits: one (T_f,) float tensor per feature.
    """
    by_example: dict[int, list[int]] = {}
    for f, feature in enumerate(encoded.features):
        by_example.setdefault(feature["example"], []).append(f)
    predictions = []
    for i, example in enumerate(examples):
        feats = by_example.get(i, [])
        offsets = encoded.offsets[i]
        owner = max_context_owner([encoded.features[f]["span"] for f in feats], len(offsets))
        candidates: list[tuple[float, int, int]] = []  # (score, first piece, last piece)
        null_score = math.inf
        for w, f in enumerate(feats):
            feature = encoded.features[f]
            null_score = min(null_score, float(start_logits[f][0] + end_logits[f][0]))
            candidates += _window_candidates(start_logits[f], end_logits[f], feature, owner, w, settings)
        words = encoded.words[i] if encoded.words else None
        predictions.append(_choose(example, candidates, null_score, offsets, settings, allow_null, words))
    return predictions


def _window_candidates(start: torch.Tensor, end: torch.Tensor, feature: dict[str, Any],
                       owner: list[int], window: int, settings: QASettings) -> list[tuple[float, int, int]]:
    c0 = feature["context_start"]
    span_start, span_end = feature["span"]
    n = span_end - span_start
    if n == 0:
        return []
    s_logits = start[c0:c0 + n]  # (n,) scores of the passage pieces in this window
    e_logits = end[c0:c0 + n]  # (n,)
    k = min(settings.n_best, n)
    out = []
    for s in s_logits.topk(k).indices.tolist():
        if owner[span_start + s] != window:
            continue  # another window sees this start with more context
        for e in e_logits.topk(k).indices.tolist():
            if e < s or e - s + 1 > settings.max_answer_length:
                continue
            out.append((float(s_logits[s] + e_logits[e]), span_start + s, span_start + e))
    return out


def snap_to_words(s: int, e: int, words: Sequence[int | None] | None) -> tuple[int, int]:
    """Pieces s..e widened to the whole words they touch (words[p]: word index of piece p), so
    an answer is never part of a word ("202" of 2026, "CPU" of "CPUs")."""
    if not words:
        return s, e
    while s > 0 and words[s] is not None and words[s - 1] == words[s]:
        s -= 1
    while e + 1 < len(words) and words[e] is not None and words[e + 1] == words[e]:
        e += 1
    return s, e


def _choose(example: QAExample, candidates: list[tuple[float, int, int]], null_score: float,
            offsets: Sequence[tuple[int, int]], settings: QASettings, allow_null: bool,
            words: Sequence[int | None] | None = None) -> QAPrediction:
    candidates.sort(key=lambda c: -c[0])
    nbest: list[dict[str, Any]] = []
    seen = set()
    for score, s, e in candidates:
        s, e = snap_to_words(s, e, words)
        start, end = offsets[s][0], offsets[e][1]
        text = example.context[start:end]
        if text in seen:
            continue
        seen.add(text)
        nbest.append({"text": text, "start": start, "end": end, "score": score})
        if len(nbest) == settings.n_best:
            break
    best = nbest[0] if nbest else None
    if allow_null and math.isfinite(null_score) and "" not in seen:
        nbest.append({"text": "", "start": 0, "end": 0, "score": null_score})
        nbest.sort(key=lambda c: -c["score"])
    if nbest:
        probs = torch.tensor([c["score"] for c in nbest]).softmax(0).tolist()
        for c, p in zip(nbest, probs):
            c["probability"] = p
    if best is None:
        return QAPrediction(example.id, "", null_score if math.isfinite(null_score) else 0.0,
                            None, nbest)
    if not allow_null:
        return QAPrediction(example.id, best["text"], best["score"], None, nbest)
    diff = null_score - best["score"]
    text = "" if diff > settings.null_score_diff_threshold else best["text"]
    return QAPrediction(example.id, text, best["score"], diff, nbest)
