"""BM25 over Chinese text cut into jieba's words (`--bm25-cjk jieba`) against the definition over
the same words, recorded with the index and used again for its queries and updates."""

from __future__ import annotations

import json
import math
from collections import Counter

import jieba
import numpy as np
import pytest

from bertkit.retrieval.bm25 import BM25, tokenize
from bertkit.retrieval.index import open_index

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")
CHINESE = ["人民日报报道，北京今日天气晴朗。", "今日股市上涨，北京市场活跃。", "球队赢得比赛，球迷欢呼。",
           "天气预报说明天北京有雨。", "市场价格上涨，股市活跃", "the 北京 team wins"]


def reference(tokens: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """The definition (bm25.py's docstring) over given tokens."""
    lengths = np.array([len(t) for t in tokens], dtype=np.float64)
    norm = k1 * (1 - b + b * lengths / lengths.mean())
    out = np.zeros(len(tokens))
    for term in set(query):
        df = sum(term in t for t in tokens)
        idf = math.log(1 + (len(tokens) - df + 0.5) / (df + 0.5))
        for d, t in enumerate(tokens):
            tf = Counter(t)[term]
            out[d] += idf * tf * (k1 + 1) / (tf + norm[d]) if tf else 0.0
    return out


def test_jieba_tokens_and_scores(tmp_path):
    assert tokenize("北京天气", "jieba") == jieba.lcut("北京天气") == ["北京", "天气"]
    assert tokenize("北京天气") == ["北京", "京天", "天气"]  # the default stays bigrams
    assert tokenize("The 北京 team", "jieba") == ["the", "北京", "team"]
    index = BM25.fit(CHINESE, cjk="jieba")
    index.save(tmp_path / "bm25")
    loaded = BM25.load(tmp_path / "bm25")
    assert loaded.cjk == "jieba"
    tokens = [tokenize(t, "jieba") for t in CHINESE]
    for query in ("北京天气", "股市上涨", "球队比赛", "火星"):
        want = reference(tokens, tokenize(query, "jieba"))
        np.testing.assert_allclose(loaded.scores(query), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown CJK tokenization 'mecab'"):
        BM25.fit(CHINESE, cjk="mecab")


def test_index_records_the_cjk_mode(tmp_path):
    from bertkit import cli
    from bertkit.retrieval.search import Searcher

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}, ensure_ascii=False) + "\n"
                              for i, t in enumerate(CHINESE)), encoding="utf-8")
    model = tiny_encoder(tmp_path / "bi")
    assert cli.main(["index", str(corpus), "--model", str(model), "--out", str(tmp_path / "ix"), "--no-progress",
                     "--bm25-cjk", "jieba"]) == 0
    assert open_index(tmp_path / "ix").meta["bm25_cjk"] == "jieba"
    hits = Searcher.open(tmp_path / "ix").search("股市上涨", top_k=2, systems=["bm25"])[0]
    assert [h.id for h in hits] == ["d1", "d4"]
    assert cli.main(["index", "--out", str(tmp_path / "ix"), "--delete", "d0"]) == 0
    assert BM25.load(tmp_path / "ix" / "bm25").cjk == "jieba"
