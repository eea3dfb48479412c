"""Built-in labelled sets: fixed disjoint splits, deduplication, the People's Daily conversion."""

from __future__ import annotations

import collections
import json

import pytest

from bertkit.data import labelled
from bertkit.data.formats.classify import read_classify
from bertkit.data.formats.ner import read_ner, tag_problem
from bertkit.data.labelled import (
    char_bio,
    entity_words,
    load_labelled,
    parse_pos_line,
    resolve_builtin,
    split_items,
    write_labelled,
)


def keys(name, split):
    items = load_labelled(name, split)
    return [tuple(x.words) if name == "zh-ner" else x.text for x in items]


@pytest.mark.parametrize("name", list(labelled.LABELLED_SETS))
def test_splits_are_80_10_10_disjoint_and_duplicate_free(name):
    parts = {s: keys(name, s) for s in labelled.SPLITS}
    total = sum(len(p) for p in parts.values())
    for split, fraction in zip(labelled.SPLITS, labelled.SPLIT_FRACTIONS):
        assert abs(len(parts[split]) / total - fraction) < 0.01
    everything = [k for p in parts.values() for k in p]
    assert len(everything) == len(set(everything))  # no duplicates, within or across splits


def test_splits_are_fixed():
    # Rebuilding from the files gives the same split (seeded, sorted first): same first items.
    rebuilt = labelled.LABELLED_SETS["en-news"].loader()["test"]
    assert [e.text for e in rebuilt] == keys("en-news", "test")


def test_zh_sentiment_drops_lines_in_both_files_and_keeps_label_shares():
    train = load_labelled("zh-sentiment", "train")
    by_text = collections.defaultdict(set)
    for split in labelled.SPLITS:
        for e in load_labelled("zh-sentiment", split):
            by_text[e.text].add(e.label)
    assert all(len(labels) == 1 for labels in by_text.values())
    share = lambda items: sum(e.label == "positive" for e in items) / len(items)  # noqa: E731
    assert abs(share(train) - share(load_labelled("zh-sentiment", "test"))) < 0.01  # stratified
    assert 6000 < len(train) < 16000


def test_en_news_has_five_topics():
    dev = load_labelled("en-news", "dev")
    assert sorted({e.label for e in dev}) == ["business", "entertainment", "politics", "sports", "tech"]
    assert all("\n" in e.text for e in dev[:10])  # title and body lines


def test_people_daily_brackets_and_names():
    words = parse_pos_line("[中央/n 人民/n 广播/vn 电台/n]nt 记者/n 江/nr 泽民/nr 李/nr 鹏/nr "
                           "[香港/ns 回归/vn]l 马克思/nr 恩格斯/nr 欧阳/nr 修/nr 北京/ns")
    assert words[0] == ("中央人民广播电台", "nt")
    assert ("香港", "ns") in words  # a non-entity outer tag keeps the inner words
    items = entity_words(words)
    assert [t for t, k in items if k == "PER"] == ["江泽民", "李鹏", "马克思", "恩格斯", "欧阳修"]
    assert ("中央人民广播电台", "ORG") in items and ("北京", "LOC") in items
    chars, tags = char_bio([("在", None), ("江泽民", "PER"), ("说", None)])
    assert chars == ["在", "江", "泽", "民", "说"]
    assert tags == ["O", "B-PER", "I-PER", "I-PER", "O"]


def test_zh_ner_sentences_are_valid_bio_over_characters():
    dev = load_labelled("zh-ner", "dev")
    assert all(len(s.words) == len(s.tags) and all(len(w) == 1 for w in s.words) for s in dev)
    assert all(tag_problem(s.tags, "BIO") is None for s in dev)
    types = collections.Counter(t[2:] for s in dev for t in s.tags if t.startswith("B-"))
    assert set(types) == {"PER", "LOC", "ORG"} and min(types.values()) > 100
    # sentences end at 。！？ (a closing quote may follow)
    ends = collections.Counter(s.words[-1] for s in dev)
    assert ends.most_common(1)[0][0] == "。"


def test_split_items_fractions():
    parts = split_items(range(100))
    assert [len(parts[s]) for s in labelled.SPLITS] == [80, 10, 10]
    assert sorted(parts["train"] + parts["dev"] + parts["test"]) == list(range(100))


def test_resolve_builtin_specs():
    assert resolve_builtin("builtin:zh-ner") == ("zh-ner", "train")
    assert resolve_builtin("builtin:zh-ner:test") == ("zh-ner", "test")
    assert resolve_builtin("data/train.csv") is None
    with pytest.raises(ValueError, match="unknown built-in data set 'nope'"):
        resolve_builtin("builtin:nope")
    with pytest.raises(ValueError, match="unknown split 'val'"):
        resolve_builtin("builtin:en-news:val")


def test_written_files_read_back_in_the_documented_formats(tmp_path):
    paths = write_labelled("en-news", tmp_path)
    examples, report = read_classify(paths["dev"])
    assert report.n_skipped == 0
    assert [(e.text, e.label) for e in examples] == [(e.text, e.label) for e in load_labelled("en-news", "dev")]
    first = json.loads(paths["train"].read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"text", "label"}
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_labelled("en-news", tmp_path)

    paths = write_labelled("zh-ner", tmp_path)
    sentences, report, scheme = read_ner(paths["test"])
    assert scheme == "BIO" and report.n_skipped == 0
    assert [(s.words, s.tags) for s in sentences] == [(s.words, s.tags) for s in load_labelled("zh-ner", "test")]
