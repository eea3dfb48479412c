"""Classification / pair data: reading, bad rows, labels, truncation, windows and their aggregation."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.data.formats.classify import (
    ClassifyColumns,
    ClassifyExample,
    LabelSpace,
    _truncate_pair,
    aggregate_windows,
    classify_features,
    read_classify,
)
from bertkit.data.formats.common import window_spans


def test_csv_bad_rows_are_counted_skipped_and_located(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('text,label\n"good, film",pos\nonly text\n,neg\n"multi\nline",neg\n  \nok,pos\n',
                    encoding="utf-8")
    examples, report = read_classify(path)
    assert [(e.text, e.label) for e in examples] == [("good, film", "pos"), ("multi\nline", "neg"),
                                                     ("ok", "pos")]
    assert report.n_kept == 3 and report.n_skipped == 2
    assert f"{path}:3: missing 'label'" in report.messages[0]
    assert f"{path}:4: empty text" in report.messages[1]
    assert examples[2].where == f"{path}:8"  # the quoted newline counts as a line


def test_header_without_the_column_names_the_fix(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("sentence\tlabel\nhello\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no column 'text'.*--text-column"):
        read_classify(path)
    examples, _ = read_classify(path, columns=ClassifyColumns(text="sentence"))
    assert examples[0].text == "hello" and examples[0].label == "1"


def test_jsonl_pairs_and_unusable_file(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"a": "x", "b": "y", "y": 1}, {"a": "x", "y": 0}, "not json {"]
    path.write_text("\n".join(json.dumps(r) if isinstance(r, dict) else r for r in rows), encoding="utf-8")
    examples, report = read_classify(path, pair=True, columns=ClassifyColumns("a", "b", "y"))
    assert [(e.text, e.text_pair, e.label) for e in examples] == [("x", "y", "1")]
    assert report.n_skipped == 2
    empty = tmp_path / "e.jsonl"
    empty.write_text("{}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no usable rows"):
        read_classify(empty)


def test_label_space_order_regression_and_reuse():
    ex = lambda label: ClassifyExample("t", None, label)  # noqa: E731
    assert LabelSpace.infer([ex("10"), ex("2"), ex("0")]).names == ["0", "2", "10"]  # numeric order
    assert LabelSpace.infer([ex("neg"), ex("pos"), ex("neg")]).names == ["neg", "pos"]
    assert LabelSpace.infer([ex(0.5), ex("1")]).regression  # a non-integer number: regression
    assert LabelSpace.infer([ex("1"), ex("0")], "regression").regression
    # a fine-tuned model's own labels keep their ids; placeholder LABEL_i maps are not reused
    assert LabelSpace.infer([ex("pos"), ex("neg")], known={"pos": 0, "neg": 1}).names == ["pos", "neg"]
    assert LabelSpace.infer([ex("b"), ex("a")], known={"LABEL_0": 0, "LABEL_1": 1}).names == ["a", "b"]
    with pytest.raises(ValueError, match="single label"):
        LabelSpace.infer([ex("a"), ex("a")])
    with pytest.raises(ValueError, match="not a number"):
        LabelSpace.infer([ex("a"), ex("1")], "regression")


def test_unknown_label_in_eval_is_an_error_naming_row_and_labels():
    space = LabelSpace(["neg", "pos"])
    bad = [ClassifyExample("t", None, "pos", "dev.csv:2"), ClassifyExample("t", None, "neutral", "dev.csv:3")]
    with pytest.raises(ValueError, match=r"dev.csv:3: label 'neutral'.*known: 'neg', 'pos'"):
        space.encode(bad, "dev.csv")


def test_truncate_pair_takes_from_the_longer_first():
    assert _truncate_pair(3, 4, 10) == (3, 4)
    assert _truncate_pair(2, 20, 10) == (2, 8)
    assert _truncate_pair(20, 3, 10) == (7, 3)
    assert _truncate_pair(20, 20, 10) == (5, 5)


def test_features_truncate_and_mark_segments(pieces):
    examples = [ClassifyExample("one two three four five six seven", "alpha beta", "x")]
    (f,) = classify_features(examples, pieces, 8, label_ids=[1])
    assert len(f["input_ids"]) == 8
    assert f["input_ids"][0] == pieces.cls_id and f["input_ids"].count(pieces.sep_id) == 2
    # [CLS] a a a [SEP] b b [SEP]: the longer first text lost tokens, the pair kept both
    assert f["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert f["labels"] == 1


def test_windows_cover_a_long_text(pieces):
    text = " ".join(f"w{i}" for i in range(30))
    n = len(pieces.encode([text])[0].ids)
    features = classify_features([ClassifyExample(text, None, None)], pieces, 10, windows=True, stride=4)
    spans = window_spans(n, 8, 4)
    assert len(features) == len(spans) > 1
    body = pieces.encode([text])[0].ids
    for f, (s, e) in zip(features, spans):
        assert f["input_ids"] == [pieces.cls_id] + body[s:e] + [pieces.sep_id]
        assert f["example"] == 0


def test_aggregate_windows_is_the_mean_of_probabilities():
    features = [{"example": 0}, {"example": 1}, {"example": 1}]
    logits = [torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0]), torch.tensor([0.0, 4.0])]
    scores = aggregate_windows(logits, features, 2, regression=False)
    p1, p2 = torch.tensor([2.0, 0.0]).softmax(0), torch.tensor([0.0, 4.0]).softmax(0)
    assert torch.allclose(scores[0], torch.tensor([0.5, 0.5]))
    assert torch.allclose(scores[1], (p1 + p2) / 2)
    reg = aggregate_windows([torch.tensor([1.0]), torch.tensor([3.0])], [{"example": 0}, {"example": 0}], 1,
                            regression=True)
    assert reg.tolist() == [[2.0]]


def test_window_spans_follow_run_squad():
    # starts every `stride` items until a window reaches the end; the last may be shorter
    assert window_spans(10, 4, 3) == [(0, 4), (3, 7), (6, 10)]
    assert window_spans(3, 4, 2) == [(0, 3)]
    assert window_spans(0, 4, 2) == [(0, 0)]
    with pytest.raises(ValueError, match="doc stride 5"):
        window_spans(10, 4, 5)


# ------------------------------------------------------------------------- ambiguous label files
def _examples(labels):
    return [ClassifyExample("t", None, label, f"train.csv:{i + 2}") for i, label in enumerate(labels)]


def test_a_few_non_integers_among_integers_are_refused_with_the_fix():
    labels = ["0", "1", "2"] * 10 + [2.5]  # 1 of 31: a typo, or regression targets?
    with pytest.raises(ValueError, match=r"column 'label': 1 of 31 labels are non-integer numbers "
                                         r"\(train.csv:32 \(2.5\)\).*--problem-type regression"):
        LabelSpace.infer(_examples(labels))
    assert LabelSpace.infer(_examples(labels), "regression").regression
    assert LabelSpace.infer(_examples(labels), "single_label_classification").names == ["0", "1", "2", "2.5"]
    # Scores such as STS-B's (mostly non-integers, some whole numbers) are regression.
    assert LabelSpace.infer(_examples([0.4, "5", 3.8, 1.2, "0", 2.6])).regression


def test_numbers_mixed_with_names_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"column 'y' mixes numbers and names as labels: 1 number "
                                         r"\(e.g. '1' at train.csv:5\) and 3 names.*--problem-type "
                                         "single_label_classification"):
        LabelSpace.infer(_examples(["pos", "neg", "pos", "1"]), column="y")
    with pytest.raises(ValueError, match="mixes numbers and names"):
        LabelSpace.infer(_examples(["pos", "neg", 0.5]))
    assert LabelSpace.infer(_examples(["pos", "neg", "1"]), "single_label_classification").names == \
        ["1", "neg", "pos"]


def test_what_was_inferred_is_said():
    assert LabelSpace.infer(_examples(["pos", "neu", "neg"])).describe() == \
        "labels: 3 classes (neg, neu, pos) from column 'label'"
    assert LabelSpace.infer(_examples([0.5, 1.5])).describe("y").startswith(
        "regression: numeric labels from column 'y'")
    many = LabelSpace.infer(_examples([str(i) for i in range(30)]))
    assert "(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, …)" in many.describe()
    assert "--problem-type regression" in many.describe()


def test_a_row_with_an_extra_field_is_refused_naming_it(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("text,label\nfine,pos\ngood, film,pos\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:3: 3 fields where the header has 2 \('text', "
                                         r"'label'\); the extra field is 'pos'.*must be quoted"):
        read_classify(path)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("text\tlabel\nfine\tpos\textra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.tsv:2: 3 fields.*extra field is 'extra'"):
        read_classify(tsv)


def test_pair_task_and_single_texts_do_not_mix(tmp_path):
    single = tmp_path / "single.jsonl"
    single.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="no row has a second text .*'text_pair'.*--task classify"):
        read_classify(single, pair=True)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("text,text_pair,label\na,b,x\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.csv:2: a second text in column 'text_pair'.*--task pair"):
        read_classify(pairs)
    assert read_classify(pairs, pair=True)[0][0].text_pair == "b"
