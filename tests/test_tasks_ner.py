"""NER data: CoNLL / JSONL reading, tag schemes, word-piece alignment, window stitching, offsets."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.constants import IGNORE_INDEX
from bertkit.data.formats.common import max_context_owner
from bertkit.data.formats.ner import (
    NerSentence,
    detect_scheme,
    entities_with_offsets,
    join_words,
    label_names,
    ner_features,
    read_ner,
    repair_tags,
    split_words,
    stitch_predictions,
    tag_problem,
)


def test_conll_tab_and_space_columns_docstart_and_blank_lines(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text("-DOCSTART- -X- O O\n\nJohn\tB-PER\nlives\tO\n\n\nin NNP I-NP O\nParis NNP I-NP B-LOC\n",
                    encoding="utf-8")
    sentences, report, scheme = read_ner(path)
    assert [(s.words, s.tags) for s in sentences] == [(["John", "lives"], ["B-PER", "O"]),
                                                      (["in", "Paris"], ["O", "B-LOC"])]
    assert sentences[1].where == f"{path}:7"
    assert scheme == "BIO" and report.n_skipped == 0


def test_invalid_bio_sentence_is_skipped_with_its_line_or_repaired(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text("a\tO\nb\tI-PER\n\nc\tB-LOC\n\nd\tPERSON\n\ne\n", encoding="utf-8")
    sentences, report, _ = read_ner(path)
    assert [s.words for s in sentences] == [["c"]]
    assert report.n_skipped == 3
    assert f"{path}:1: word 2: 'I-PER' after 'O' does not continue an entity" in report.messages[0]
    assert "invalid tag 'PERSON'" in report.messages[1]
    assert "no tag column" in report.messages[2]
    repaired, report, _ = read_ner(path, invalid="repair")
    assert repaired[0].tags == ["O", "B-PER"]  # read as conlleval does; malformed tags stay skipped
    assert report.n_skipped == 2


def test_bioes_detection_and_rules():
    bioes = [NerSentence(["a", "b"], ["B-X", "E-X"]), NerSentence(["c"], ["S-Y"])]
    assert detect_scheme(bioes) == "BIOES"
    assert detect_scheme([NerSentence(["a"], ["B-X"])]) == "BIO"
    assert tag_problem(["B-X", "E-X", "S-Y", "O"], "BIOES") is None
    assert "not closed" in tag_problem(["B-X", "O"], "BIOES")
    assert "does not continue" in tag_problem(["S-X", "E-X"], "BIOES")
    assert tag_problem(["B-X", "O"], "BIO") is None
    assert repair_tags(["O", "I-X", "I-X", "B-Y"], "BIOES") == ["O", "B-X", "E-X", "S-Y"]
    assert label_names(bioes, "BIOES") == ["O", "B-X", "I-X", "E-X", "S-X", "B-Y", "I-Y", "E-Y", "S-Y"]


def test_jsonl_reading_and_bad_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"words": ["A", "B"], "ner": ["B-X", "I-X"]}, {"words": ["A"], "ner": ["O", "O"]},
            {"words": [], "ner": []}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    sentences, report, _ = read_ner(path, tokens_key="words", tags_key="ner")
    assert len(sentences) == 1 and report.n_skipped == 2
    assert "1 tokens but 2 tags" in report.messages[0]


def test_first_piece_carries_the_label(pieces):
    sentence = NerSentence(["unaffable", "Johanson", "ran"], ["B-PER", "I-PER", "O"])
    label2id = {"O": 0, "B-PER": 1, "I-PER": 2}
    encoded = ner_features([sentence], pieces, 32, label2id=label2id)
    (f,) = encoded.features
    # [CLS] una ##ffa ##ble johan ##son ran [SEP]
    assert f["labels"] == [IGNORE_INDEX, 1, IGNORE_INDEX, IGNORE_INDEX, 2, IGNORE_INDEX, 0, IGNORE_INDEX]
    assert encoded.first_piece == [[0, 3, 5]]
    with pytest.raises(ValueError, match="tag 'B-LOC' was not in the training data"):
        ner_features([NerSentence(["x"], ["B-LOC"], "f:1")], pieces, 32, label2id=label2id)


def test_max_context_owner_prefers_the_most_central_window():
    spans = [(0, 6), (3, 9), (6, 10)]
    owner = max_context_owner(spans, 10)
    # pos 2: only window 0. pos 4: w0 min(4,1)=1, w1 min(1,4)=1: tie, same length → earlier (w0)
    # pos 5: w0 min(5,0)=0, w1 min(2,3)=2 → w1. pos 7: w1 min(4,1)=1, w2 min(1,2)=1; w1 is longer
    # (6 vs 4 items: +0.06 vs +0.04) → w1. pos 8: w1 0, w2 min(2,1)=1 → w2.
    assert owner == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]


def test_stitching_reads_each_word_from_its_best_window(pieces):
    words = [f"w{i}" for i in range(10)]  # "w0" → w ##0: 2 pieces each
    encoded = ner_features([NerSentence(words, None)], pieces, 8, stride=3)  # windows of 6 pieces
    spans = [f["span"] for f in encoded.features]
    assert spans == [(0, 6), (3, 9), (6, 12), (9, 15), (12, 18), (15, 20)]
    # window f says label f at every position: a word's tag tells which window was used
    logits = [torch.nn.functional.one_hot(torch.full((len(f["input_ids"]),), k), 6).float()
              for k, f in enumerate(encoded.features)]
    tags = stitch_predictions(logits, encoded, {k: f"B-W{k}" for k in range(6)})
    owner = max_context_owner(spans, 20)
    assert tags == [[f"B-W{owner[p]}" for p in encoded.first_piece[0]]]
    assert tags[0][0] == "B-W0" and tags[0][-1] == "B-W5"
    assert len({t for t in tags[0]}) > 2  # interior words do come from interior windows


def test_offsets_for_raw_text_and_for_split_words(pieces):
    (split,) = split_words(pieces, ["Visit New York, 北京!"])
    assert split.words == ["Visit", "New", "York", ",", "北", "京", "!"]
    tags = ["O", "B-LOC", "I-LOC", "O", "B-LOC", "I-LOC", "O"]
    ents = entities_with_offsets(tags, split)
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in ents] == [
        ("LOC", "New York", 6, 14), ("LOC", "北京", 16, 18)]
    chars = join_words(list("江泽民说"))  # character data joins without spaces
    assert entities_with_offsets(["B-PER", "I-PER", "I-PER", "O"], chars)[0]["text"] == "江泽民"
    words = join_words(["in", "New", "York"])
    assert entities_with_offsets(["O", "B-LOC", "I-LOC"], words)[0] == {
        "type": "LOC", "text": "New York", "start": 3, "end": 11, "word_start": 1, "word_end": 3}


def test_word_without_pieces_is_predicted_o(pieces):
    encoded = ner_features([NerSentence(["a", "\u200b", "b"], None)], pieces, 16)
    assert encoded.first_piece == [[0, None, 1]] and encoded.n_words_without_pieces == 1
    logits = [torch.tensor([[0.0, 1.0]] * len(encoded.features[0]["input_ids"]))]
    assert stitch_predictions(logits, encoded, {0: "O", 1: "B-X"}) == [["B-X", "O", "B-X"]]
