"""Corpus reading: formats, sentence splitting, bad input reported by file and line, built-ins."""

from __future__ import annotations

import json
import logging
import re

import pytest

from bertkit.data.builtin import BUILTIN_CORPORA, peoples_daily_words
from bertkit.data.corpus import Corpus, load_builtin, load_corpus
from bertkit.util.text import split_sentences


def test_english_sentences_keep_abbreviations_together():
    text = ('Mr. Smith met Dr. Jones in Washington on Monday. He said "Hi!" Then he left... '
            "Prices fell 3.5% to $1.13bn, e.g. in the U.S. market. J. K. Rowling wrote it. "
            "Is it done? Yes.")
    assert split_sentences(text) == [
        "Mr. Smith met Dr. Jones in Washington on Monday.",
        'He said "Hi!"',
        "Then he left...",
        "Prices fell 3.5% to $1.13bn, e.g. in the U.S. market.",
        "J. K. Rowling wrote it.",
        "Is it done?",
        "Yes.",
    ]


def test_chinese_sentences_and_line_breaks():
    assert split_sentences("我喜欢你。你呢？“好的！”他说……然后走了；完了\n新的一行") == [
        "我喜欢你。", "你呢？", "“好的！”", "他说……", "然后走了；", "完了", "新的一行"]
    assert split_sentences("  \n \n") == []


def test_lines_paragraphs_and_jsonl_formats(tmp_path):
    (tmp_path / "a.txt").write_text("First sentence.\nSecond one. Third one.\n\n\nDoc two.\n",
                                    encoding="utf-8")
    lines = load_corpus(tmp_path / "a.txt")
    assert lines.documents == [["First sentence.", "Second one.", "Third one."], ["Doc two."]]
    assert load_corpus(tmp_path / "a.txt", split=False).documents[0] == [
        "First sentence.", "Second one. Third one."]
    paragraphs = load_corpus(tmp_path / "a.txt", format="paragraphs")
    assert paragraphs.documents == [["First sentence.", "Second one.", "Third one.", "Doc two."]]

    rows = [{"body": "One. Two."}, {"body": ["already", "split"]}, {"body": ""}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    jsonl = load_corpus(tmp_path / "b.jsonl", text_field="body")
    assert jsonl.documents == [["One.", "Two."], ["already", "split"]]
    assert jsonl.stats.documents == 2 and jsonl.stats.sentences == 4


def test_directories_globs_and_several_sources(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt", ".hidden.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"From {name}.\n", encoding="utf-8")
    directory = load_corpus(tmp_path)
    assert [d[0] for d in directory.documents] == ["From a.txt.", "From b.txt.", "From sub/c.txt."]
    pattern = load_corpus(str(tmp_path / "*.txt"))
    assert [d[0] for d in pattern.documents] == ["From a.txt.", "From b.txt."]
    both = load_corpus([tmp_path / "a.txt", str(tmp_path / "sub" / "*.txt")])
    assert both.num_documents == 2 and both.stats.files == 2
    with pytest.raises(FileNotFoundError, match="not found"):
        load_corpus(tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match="no files match"):
        load_corpus(str(tmp_path / "*.md"))


def test_bad_input_is_named_counted_and_skipped(tmp_path, caplog):
    good = tmp_path / "good.txt"
    good.write_bytes("Fine line.\ncaf\xe9 in latin-1 next\n".encode("utf-8")
                     + "Caf\xe9 au lait.\n".encode("latin-1") + b"Back to fine.\n"
                     + b"x" * 300 + b"\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary\x00" * 10)
    (tmp_path / "rows.jsonl").write_text('{"text": "Kept row."}\n{broken\n{"other": 1}\n',
                                         encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        corpus = load_corpus(tmp_path, max_line_chars=200)
    assert corpus.documents == [["Fine line.", "café in latin-1 next", "Back to fine."],
                                ["Kept row."]]
    stats = corpus.stats
    assert dict(stats.skipped) == {"non-UTF-8 line": 1, "line too long": 1, "empty file": 1,
                                   "binary file": 1, "invalid JSON": 1, "missing text field": 1}
    assert stats.num_skipped == 6 and stats.files == 4
    messages = "\n".join(stats.report.messages)
    assert f"{good}:3: non-UTF-8 line: byte 0xe9" in messages
    assert f"{good}:5: line too long" in messages
    assert f"{tmp_path / 'rows.jsonl'}:2: invalid JSON" in messages
    assert f"{tmp_path / 'rows.jsonl'}:3: missing text field" in messages
    assert f"{tmp_path / 'blob.bin'}: binary file" in messages
    assert f"{good}:3" in caplog.text  # logged as a warning, too
    assert "skipped" in stats.summary()


def test_nothing_usable_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n   \n", encoding="utf-8")
    (tmp_path / "rows.jsonl").write_text('{"title": "no text"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="no usable text.*skipped"):
        load_corpus(tmp_path)
    with pytest.raises(ValueError, match="no usable text"):
        Corpus.from_texts(["", "  "]).require_text()


def test_builtin_corpora():
    bbc = load_builtin("bbc-news")
    assert bbc.num_documents == 2225 and bbc.stats.files == 2225
    assert bbc.documents[0][0] == "Ad sales boost Time Warner profit"  # title first
    # sports/199.txt is Windows-1252: its pound sign is decoded, not dropped.
    assert any("£15.8m" in s for doc in bbc.documents for s in doc)

    daily = load_corpus("builtin:peoples-daily")
    assert 3000 < daily.num_documents < 3400
    assert daily.stats.characters > 1_800_000
    assert daily.documents[0][0].startswith("迈向充满希望的新世纪")  # word/POS joined into text
    assert not any(re.search(r"/[A-Za-z]", s) for doc in daily.documents[:50] for s in doc)
    words = peoples_daily_words()
    assert words[1][:3] == ["中共中央", "总书记", "、"]

    reviews = load_builtin("zh-reviews")
    texts = ["".join(doc) for doc in reviews.documents]
    assert len(texts) == len(set(texts)) > 15000  # deduplicated across pos.txt and neg.txt

    both = load_corpus("builtin:zh")
    assert both.num_documents == daily.num_documents + reviews.num_documents
    assert set(BUILTIN_CORPORA) == {"peoples-daily", "zh-reviews", "bbc-news", "zh"}
    with pytest.raises(ValueError, match="builtin:bbc-news"):
        load_corpus("builtin:wikipedia")
