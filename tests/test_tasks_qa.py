"""SQuAD data: reading v1.1 / v2.0 files, sliding-window features, answer targets, span decoding."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.data.formats.qa import QAExample, QASettings, decode_answers, qa_features, read_squad


def squad_file(path, qas, context, version="1.1"):
    data = {"version": version, "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


CONTEXT = "The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel's company."


def test_read_v11_skips_misplaced_answers_in_training_only(tmp_path):
    qas = [{"id": "a", "question": "Where is the tower?", "answers": [{"text": "Paris", "answer_start": 23}]},
           {"id": "b", "question": "When?", "answers": [{"text": "1889", "answer_start": 3}]},
           {"id": "c", "question": "  ", "answers": [{"text": "1889", "answer_start": 46}]}]
    path = squad_file(tmp_path / "train.json", qas, CONTEXT)
    examples, report, is_v2 = read_squad(path, training=True)
    assert [e.id for e in examples] == ["a"] and not is_v2
    assert report.n_skipped == 2
    # the message names file, line of the question id, the answer and where it really is
    line = path.read_text().splitlines().index('       "id": "b",') + 1
    assert report.messages[0].startswith(f"{path}:{line} (question id 'b'): answer '1889' is not at "
                                         "answer_start 3 (it occurs at 46)")
    assert "empty question" in report.messages[1]
    examples, report, _ = read_squad(path, training=False)  # offsets do not matter for scoring
    assert [e.id for e in examples] == ["a", "b"]


def test_read_v20_and_bad_json(tmp_path):
    qas = [{"id": "a", "question": "Who?", "answers": [], "is_impossible": True},
           {"id": "a", "question": "Again?", "answers": [], "is_impossible": True}]
    examples, report, is_v2 = read_squad(squad_file(tmp_path / "v2.json", qas, CONTEXT, "v2.0"), training=True)
    assert is_v2 and examples[0].is_impossible and examples[0].answers == []
    assert "repeated question id" in report.messages[0]
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [\n  {]\n}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json:2: not valid JSON"):
        read_squad(bad, training=True)


def long_example(n_words: int = 60, answer_at: int = 47) -> QAExample:
    words = [f"word{i}" for i in range(n_words)]
    words[answer_at:answer_at + 2] = ["golden", "gate"]
    context = " ".join(words)
    start = context.index("golden gate")
    return QAExample("q", "which bridge is named here in this long question text?", context,
                     [("golden gate", start)])


def test_windows_targets_and_offsets(pieces):
    example = long_example()
    settings = QASettings(max_seq_length=32, doc_stride=8, max_query_length=5)
    encoded = qa_features([example], pieces, settings, training=True)
    ctx_pieces = len(encoded.offsets[0])
    assert len(encoded.features) > 3
    head = 1 + 5 + 1  # [CLS] + question cut to 5 pieces + [SEP]
    starts = [f["span"][0] for f in encoded.features]
    assert starts == list(range(0, 8 * len(starts), 8))  # window starts are doc_stride apart
    assert encoded.features[-1]["span"][1] == ctx_pieces
    hits = 0
    for f in encoded.features:
        assert len(f["input_ids"]) <= 32 and f["context_start"] == head
        assert f["token_type_ids"] == [0] * head + [1] * (len(f["input_ids"]) - head)
        s, e = f["start_positions"], f["end_positions"]
        if s == 0:
            assert e == 0
            continue
        hits += 1
        offsets = encoded.offsets[0][f["span"][0] - head:]  # feature position → passage piece
        assert example.context[offsets[s][0]:offsets[e][1]] == "golden gate"
    assert hits >= 1
    # windows that cut the answer, or lack it, point at [CLS]
    assert sum(f["start_positions"] == 0 for f in encoded.features) >= 1


def test_decode_picks_the_best_valid_span_from_the_max_context_window(pieces):
    example = long_example()
    settings = QASettings(max_seq_length=32, doc_stride=8, max_query_length=5, max_answer_length=4)
    encoded = qa_features([example], pieces, settings, training=False)
    target = qa_features([example], pieces, settings, training=True).features
    starts, ends = [], []
    for f, t in zip(encoded.features, target):
        s, e = torch.zeros(len(f["input_ids"])), torch.zeros(len(f["input_ids"]))
        if t["start_positions"]:
            s[t["start_positions"]], e[t["end_positions"]] = 5.0, 5.0
        # a tempting but too long span (more than max_answer_length pieces): must be ignored
        s[f["context_start"]], e[len(f["input_ids"]) - 2] = 9.0, 9.0
        starts.append(s)
        ends.append(e)
    (pred,) = decode_answers(starts, ends, [example], encoded, settings, allow_null=False)
    assert pred.text == "golden gate"
    assert pred.score == pytest.approx(10.0)
    assert pred.null_score_diff is None
    assert pred.nbest[0]["text"] == "golden gate"
    assert sum(c["probability"] for c in pred.nbest) == pytest.approx(1.0)


def test_null_answer_through_the_threshold(pieces):
    example = QAExample("q", "where?", CONTEXT, [])
    settings = QASettings(max_seq_length=64)
    encoded = qa_features([example], pieces, settings, training=False)
    (f,) = encoded.features
    s, e = torch.zeros(len(f["input_ids"])), torch.zeros(len(f["input_ids"]))
    paris = next(i for i, (a, b) in enumerate(encoded.offsets[0]) if CONTEXT[a:b] == "Paris")
    s[f["context_start"] + paris], e[f["context_start"] + paris] = 2.0, 2.0  # span score 4
    s[0], e[0] = 3.0, 3.0  # null score 6: diff 2
    (pred,) = decode_answers([s], [e], [example], encoded, settings, allow_null=True)
    assert pred.text == "" and pred.null_score_diff == pytest.approx(2.0)
    settings.null_score_diff_threshold = 2.5  # a higher threshold lets the span through
    (pred,) = decode_answers([s], [e], [example], encoded, settings, allow_null=True)
    assert pred.text == "Paris"
    assert {c["text"] for c in pred.nbest} >= {"", "Paris"}


def test_answer_with_accents_maps_back_to_original_characters(pieces):
    context = "Café Müller opened in Zürich."
    example = QAExample("q", "where?", context, [("Zürich", context.index("Zürich"))])
    encoded = qa_features([example], pieces, QASettings(max_seq_length=48), training=True)
    (f,) = encoded.features
    s, e = f["start_positions"] - f["context_start"], f["end_positions"] - f["context_start"]
    assert context[encoded.offsets[0][s][0]:encoded.offsets[0][e][1]] == "Zürich"
