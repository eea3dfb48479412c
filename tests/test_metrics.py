"""Metrics on hand-made cases whose answers are worked out in the comments."""

from __future__ import annotations

import pytest

from bertkit.data.scoring import (
    Entity,
    accuracy,
    cjk_tokens,
    entity_scores,
    exact_match,
    get_entities,
    macro_f1,
    normalize_answer,
    squad_scores,
    token_f1,
)


# ------------------------------------------------------------------------------ classification
def test_accuracy_and_macro_f1():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    assert accuracy(pred, gold) == pytest.approx(4 / 6)
    # a: P 2/2 R 2/3 → F1 0.8; b: P 1/2 R 1/2 → 0.5; c: P 1/2 R 1/1 → 2/3
    assert macro_f1(pred, gold) == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)


def test_macro_f1_penalises_a_class_never_gold():
    # "x" is predicted once but never gold: its F1 is 0 and it counts in the mean.
    assert macro_f1(["a", "x"], ["a", "a"]) == pytest.approx((2 / 3 + 0.0) / 2)


def test_classification_metrics_reject_misaligned_or_empty():
    with pytest.raises(ValueError, match="2 predictions for 1 labels"):
        accuracy([1, 2], [1])
    with pytest.raises(ValueError, match="empty"):
        macro_f1([], [])


# ------------------------------------------------------------------------------ NER entities
def test_get_entities_bio():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O"]
    assert get_entities(tags) == [Entity("PER", 0, 2), Entity("LOC", 3, 4), Entity("LOC", 4, 6)]


def test_get_entities_stray_inside_tag_starts_an_entity_as_conlleval():
    # I- after O starts an entity; I- of another type closes the previous and starts a new one.
    tags = ["O", "I-PER", "I-PER", "I-LOC", "O", "I-ORG"]
    assert get_entities(tags) == [Entity("PER", 1, 3), Entity("LOC", 3, 4), Entity("ORG", 5, 6)]


def test_get_entities_bioes():
    tags = ["S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "O", "B-ORG", "E-ORG"]
    assert get_entities(tags) == [Entity("PER", 0, 1), Entity("LOC", 1, 4), Entity("LOC", 4, 5),
                                  Entity("ORG", 6, 8)]


def test_get_entities_entity_at_the_end_and_bad_tag():
    assert get_entities(["O", "B-X", "I-X"]) == [Entity("X", 1, 3)]
    with pytest.raises(ValueError, match="invalid tag 'PER'"):
        get_entities(["PER"])


def test_entity_scores_exact_span_match():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "O"]]
    # gold: PER(0,2) LOC(3,4) ORG(0,1); pred: PER(0,1) LOC(3,4) ORG(0,1) → 2 of 3 right both ways.
    scores = entity_scores(pred, gold)
    assert (scores.n_pred, scores.n_gold, scores.n_correct) == (3, 3, 2)
    assert scores.precision == pytest.approx(2 / 3)
    assert scores.recall == pytest.approx(2 / 3)
    assert scores.f1 == pytest.approx(2 / 3)
    assert scores.per_type["PER"].f1 == 0.0
    assert scores.per_type["LOC"].f1 == 1.0


def test_entity_scores_precision_and_recall_differ():
    gold = [["B-PER", "O", "O", "O"]]
    pred = [["B-PER", "O", "B-LOC", "B-ORG"]]  # 1 right of 3 predicted, 1 of 1 gold
    scores = entity_scores(pred, gold)
    assert scores.precision == pytest.approx(1 / 3)
    assert scores.recall == 1.0
    assert scores.f1 == pytest.approx(0.5)


def test_entity_scores_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="sentence 0"):
        entity_scores([["O"]], [["O", "O"]])


# ------------------------------------------------------------------------------ SQuAD
def test_normalize_answer_official_rules():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear and THE fig") == "apple pear and fig"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match_and_token_f1():
    assert exact_match("the Denver Broncos", "Denver Broncos") == 1.0
    assert exact_match("Denver", "Denver Broncos") == 0.0
    # pred {denver broncos team} vs gold {denver broncos}: P 2/3 R 1 → F1 0.8
    assert token_f1("Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0
    assert token_f1("x", "") == 0.0


def test_squad_scores_max_over_gold_and_unanswerable():
    gold = {"q1": ["Denver Broncos", "Broncos"], "q2": [], "q3": ["in 1990"], "q4": ["Paris"]}
    preds = {"q1": "Broncos", "q2": "", "q3": "1990 season"}  # q4 missing: scores 0
    scores = squad_scores(preds, gold)
    # EM: q1 1, q2 1, q3 0, q4 0 → 50; F1: q1 1, q2 1, q3 {1990} vs {in 1990}... P 1/2 R 1/2 → 0.5
    assert scores.exact_match == pytest.approx(50.0)
    assert scores.f1 == pytest.approx(100 * (1 + 1 + 0.5 + 0) / 4)
    assert scores.has_ans_total == 3 and scores.no_ans_total == 1
    assert scores.no_ans_exact_match == 100.0


def test_squad_unanswerable_with_an_answer_predicted_scores_zero():
    assert squad_scores({"q": "something"}, {"q": []}).f1 == 0.0


def test_chinese_answers_scored_on_characters():
    assert cjk_tokens("北京大学, 2008年") == ["北", "京", "大", "学", "2008", "年"]
    # pred 北京 vs gold 北京大学: P 2/2, R 2/4 → F1 2/3 (word-level would give 0)
    scores = squad_scores({"q": "北京"}, {"q": ["北京大学"]})
    assert scores.f1 == pytest.approx(100 * 2 / 3)
    assert scores.exact_match == 0.0
    # punctuation is ignored for exact match too
    assert squad_scores({"q": "北京大学。"}, {"q": ["北京大学"]}).exact_match == 100.0
    # forcing English rules on Chinese text gives the word-level result
    assert squad_scores({"q": "北京"}, {"q": ["北京大学"]}, language="en").f1 == 0.0
