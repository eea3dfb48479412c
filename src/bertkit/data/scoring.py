"""Evaluation metrics for the fine-tuning tasks, computed here (no external scorer).

- classification: `accuracy`, `macro_f1` (unweighted mean of per-class F1 over the classes that
  occur in the gold labels or the predictions);
- NER: `get_entities` reads BIO / IOB1 / BIOES tag sequences exactly as CoNLL's `conlleval` does
  (an `I-X` that follows `O` or another type starts a new entity), and `entity_scores` gives
  micro precision / recall / F1 over exact spans, plus the same per entity type;
- extractive QA: `squad_scores` gives SQuAD exact match and F1 with the official answer
  normalisation (lowercase, drop punctuation and the articles a / an / the, collapse whitespace),
  taking the maximum over the gold answers. Chinese answers are scored on characters instead of
  words, as the CMRC 2018 scorer does (each CJK character is a token, Latin words and numbers stay
  whole, punctuation is dropped); `language="auto"` picks this per question when the gold answer
  contains CJK characters.
"""

from __future__ import annotations

import collections
import re
import string
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from bertkit.util.text import has_cjk  # CJK ideographs as BERT's tokenizer defines them


# ---------------------------------------------------------------------------------------------
# classification
# ---------------------------------------------------------------------------------------------
def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """Fraction of positions where prediction == label (labels of any hashable type)."""
    _check_same_length(predictions, labels)
    if not labels:
        raise ValueError("accuracy of an empty set is undefined; the evaluation set has no rows")
    return sum(p == g for p, g in zip(predictions, labels)) / len(labels)


def macro_f1(predictions: Sequence, labels: Sequence) -> float:
    """Unweighted mean of per-class F1, over every class seen in labels or predictions.

    A class that is predicted but never gold gets F1 0 (its precision is 0), so spurious classes
    are penalised, as scikit-learn's `f1_score(average="macro")` does.
    """
    _check_same_length(predictions, labels)
    if not labels:
        raise ValueError("macro-F1 of an empty set is undefined; the evaluation set has no rows")
    classes = sorted(set(labels) | set(predictions), key=repr)
    scores = []
    for c in classes:
        tp = sum(p == c and g == c for p, g in zip(predictions, labels))
        n_pred = sum(p == c for p in predictions)
        n_gold = sum(g == c for g in labels)
        scores.append(_f1(tp, n_pred, n_gold))
    return sum(scores) / len(scores)


def _check_same_length(predictions: Sequence, labels: Sequence) -> None:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels; they must align")


def _f1(tp: int, n_pred: int, n_gold: int) -> float:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


# ---------------------------------------------------------------------------------------------
# NER: entity spans from tag sequences (conlleval semantics)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entity:
    """One entity: `type` (e.g. "PER") covering tokens [start, end) of its sentence."""

    type: str
    start: int
    end: int


def split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). Raises ValueError for anything else."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S") or not kind:
        raise ValueError(f"invalid tag {tag!r}: expected 'O' or B-/I-/E-/S- followed by a type, "
                         "e.g. 'B-PER'")
    return prefix, kind


def _chunk_bounds(prev: str, prev_type: str, cur: str, cur_type: str) -> tuple[bool, bool]:
    """(the entity open at the previous token closes before the current one, a new entity opens at
    the current token): conlleval's endOfChunk and startOfChunk. I-/E- after O, E or S open one:
    conlleval reads a stray continuation tag as the start of an entity rather than dropping it."""
    retyped = prev_type != cur_type
    ends = prev in ("E", "S") or (prev in ("B", "I") and cur in ("B", "S", "O")) or (prev != "O" and retyped)
    starts = cur in ("B", "S") or (cur in ("I", "E") and prev in ("O", "E", "S")) or (cur != "O" and retyped)
    return ends, starts


def get_entities(tags: Sequence[str]) -> list[Entity]:
    """Entities of one sentence's tags (BIO, IOB1 or BIOES), in order, with conlleval's rules."""
    entities = []
    prev, prev_type, start = "O", "", None
    for i, tag in enumerate(list(tags) + ["O"]):  # the sentinel closes an entity at the end
        cur, cur_type = split_tag(tag)
        ends, starts = _chunk_bounds(prev, prev_type, cur, cur_type)
        if start is not None and ends:
            entities.append(Entity(prev_type, start, i))
            start = None
        if starts:
            start = i
        prev, prev_type = cur, cur_type
    return entities


@dataclass
class PRF:
    precision: float
    recall: float
    f1: float
    n_pred: int
    n_gold: int
    n_correct: int


@dataclass
class EntityScores(PRF):
    """Micro-averaged exact-span scores (PRF's fields, in its order), and the same per entity type."""

    per_type: dict[str, PRF] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def entity_scores(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> EntityScores:
    """Entity-level P/R/F1, CoNLL style: an entity counts only if type, start and end all match.

    pred_tags, gold_tags: one tag list per sentence, sentence lengths equal pairwise.
    """
    _check_same_length(pred_tags, gold_tags)
    pred, gold = set(), set()
    for s, (p, g) in enumerate(zip(pred_tags, gold_tags)):
        if len(p) != len(g):
            raise ValueError(f"sentence {s}: {len(p)} predicted tags for {len(g)} gold tags")
        pred.update((s, e) for e in get_entities(p))
        gold.update((s, e) for e in get_entities(g))
    correct = pred & gold
    per_type = {}
    for kind in sorted({e.type for _, e in pred | gold}):
        n_p = sum(e.type == kind for _, e in pred)
        n_g = sum(e.type == kind for _, e in gold)
        n_c = sum(e.type == kind for _, e in correct)
        per_type[kind] = PRF(*_prf(n_c, n_p, n_g), n_p, n_g, n_c)
    return EntityScores(*_prf(len(correct), len(pred), len(gold)), len(pred), len(gold),
                        len(correct), per_type)


def _prf(n_correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    return precision, recall, _f1(n_correct, n_pred, n_gold)


# ---------------------------------------------------------------------------------------------
# extractive QA: SQuAD EM / F1, CMRC character F1
# ---------------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def cjk_tokens(text: str) -> list[str]:
    """CMRC-style tokens: each CJK character alone, Latin/digit runs whole, punctuation dropped."""
    tokens, run = [], []
    for ch in text.lower():
        cjk = has_cjk(ch)
        if cjk or unicodedata.category(ch)[0] in "PSZC" or ch.isspace():
            if run:
                tokens.append("".join(run))
                run = []
            if cjk:
                tokens.append(ch)
        else:
            run.append(ch)
    if run:
        tokens.append("".join(run))
    return tokens


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # Unanswerable gold (empty) vs empty prediction scores 1; either side empty alone scores 0.
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    n_same = sum(common.values())
    if n_same == 0:
        return 0.0
    precision = n_same / len(pred_tokens)
    recall = n_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str, *, chinese: bool = False) -> float:
    """1.0 when the normalised strings are equal (Chinese: equal after dropping punctuation)."""
    if chinese:
        return float(cjk_tokens(prediction) == cjk_tokens(gold))
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, *, chinese: bool = False) -> float:
    """Bag-of-tokens F1 between one prediction and one gold answer (characters for Chinese)."""
    if chinese:
        return _token_f1(cjk_tokens(prediction), cjk_tokens(gold))
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


@dataclass
class SquadScores:
    """exact_match and f1 in percent, as the SQuAD scorer prints them; `has_ans_*` / `no_ans_*`
    are the same over answerable / unanswerable questions (None when there are none)."""

    exact_match: float
    f1: float
    total: int
    has_ans_exact_match: float | None = None
    has_ans_f1: float | None = None
    has_ans_total: int = 0
    no_ans_exact_match: float | None = None
    no_ans_f1: float | None = None
    no_ans_total: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def squad_scores(predictions: dict[str, str], gold_answers: dict[str, list[str]], *,
                 language: str = "auto") -> SquadScores:
    """SQuAD v1.1 / v2.0 EM and F1 (max over gold answers), averaged over questions, in percent.

    predictions: question id -> predicted text ("" = no answer).
    gold_answers: question id -> gold texts; an empty list marks an unanswerable question (v2.0),
      whose only correct prediction is "".
    language: "en" (word tokens, SQuAD normalisation), "zh" (characters, CMRC) or "auto" (per
      question: "zh" when a gold answer contains CJK characters).
    A question without a prediction scores 0, as in the official script.
    """
    if language not in ("auto", "en", "zh"):
        raise ValueError(f"language must be 'auto', 'en' or 'zh', got {language!r}")
    if not gold_answers:
        raise ValueError("no questions to score: the gold answer set is empty")
    em, f1, has_ans = {}, {}, {}
    for qid, golds in gold_answers.items():
        chinese = language == "zh" or (language == "auto" and any(has_cjk(g) for g in golds))
        targets = [g for g in golds if normalize_answer(g) or (chinese and cjk_tokens(g))] or [""]
        has_ans[qid] = targets != [""]
        pred = predictions.get(qid, None)
        if pred is None:
            em[qid] = f1[qid] = 0.0
            continue
        em[qid] = max(exact_match(pred, g, chinese=chinese) for g in targets)
        f1[qid] = max(token_f1(pred, g, chinese=chinese) for g in targets)

    def mean(values: Iterable[float]) -> float | None:
        values = list(values)
        return 100.0 * sum(values) / len(values) if values else None

    has = [q for q in gold_answers if has_ans[q]]
    no = [q for q in gold_answers if not has_ans[q]]
    return SquadScores(
        exact_match=mean(em.values()), f1=mean(f1.values()), total=len(gold_answers),
        has_ans_exact_match=mean(em[q] for q in has), has_ans_f1=mean(f1[q] for q in has),
        has_ans_total=len(has),
        no_ans_exact_match=mean(em[q] for q in no), no_ans_f1=mean(f1[q] for q in no),
        no_ans_total=len(no))
