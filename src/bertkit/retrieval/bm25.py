"""Okapi BM25 (Robertson & Zaragoza 2009) over bertkit's tokens, scored by `bm25s`: for hybrid
search, mining hard negatives to train a reranker, and as the lexical baseline.

The definition (unchanged from bertkit's own earlier implementation, which the tests keep as the
oracle): score(q, d) = Σ over the distinct query terms t of
idf(t) · tf · (k1 + 1) / (tf + k1 · (1 − b + b · |d| / avgdl)), with Lucene's idf
ln(1 + (N − df + 0.5) / (df + 0.5)) (never negative, unlike rank_bm25's, which floors it);
k1 1.5 and b 0.75 (rank_bm25's BM25Okapi defaults; Lucene uses k1 1.2). bm25s' "lucene" method
computes the same sum without the constant factor (k1 + 1), which `scores` puts back so that the
numbers stay those of the definition. Tokens: lowercase word characters; CJK text (no spaces) as
character bigrams (`cjk="bigram"`, the default: what BM25 over Chinese usually indexes, and it
needs no dictionary) or as jieba's words (`cjk="jieba"`, its precise mode), recorded with the
index so that queries are cut the same way. On zh-news-retrieval (300 paragraphs, 40 test queries,
`bench/retrieval_multi.py --set zh-news-retrieval --docs 300 --queries 40`, 2026-12-07) bigrams
scored MRR@10 0.636 and jieba's words 0.551, so bigrams stay the default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import numpy as np

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SETTINGS = "bertkit_bm25.json"
CJK_MODES = ("bigram", "jieba")


def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary loads once per process, with a notice on stderr
    return jieba


def check_cjk(cjk: str) -> str:
    if cjk not in CJK_MODES:
        raise ValueError(f"unknown CJK tokenization {cjk!r} for BM25; choose one of {', '.join(CJK_MODES)}")
    return cjk


def tokenize(text: str, cjk: str = "bigram") -> list[str]:
    """Lowercase word tokens; a run of CJK characters becomes its character bigrams (cjk="bigram")
    or jieba's words (cjk="jieba")."""
    out: list[str] = []
    cut = _jieba().lcut if cjk == "jieba" else None
    for word in _WORD.findall(text.lower()):
        if not (_CJK.search(word) and len(word) > 1):
            out.append(word)
        elif cut is not None:
            out.extend(w for w in cut(word) if w.strip())
        else:
            out.extend(a + b for a, b in zip(word, word[1:]))
    return out


class BM25:
    """A BM25 index of documents (or passages), rows in the order they were given."""

    def __init__(self, model, k1: float, b: float, cjk: str = "bigram"):
        self.model, self.k1, self.b, self.cjk = model, k1, b, cjk

    @classmethod
    def fit(cls, documents: Iterable[str], k1: float = 1.5, b: float = 0.75, cjk: str = "bigram") -> "BM25":
        import bm25s

        tokens = [tokenize(text, check_cjk(cjk)) for text in documents]
        if not tokens:
            raise ValueError("BM25 needs at least one document")
        # bm25s builds its vocabulary from string tokens; an empty document is a row of zeros.
        model = bm25s.BM25(method="lucene", idf_method="lucene", k1=k1, b=b)
        model.index(tokens, show_progress=False)
        return cls(model, k1, b, cjk)

    def __len__(self) -> int:
        return int(self.model.scores["num_docs"])

    def scores(self, query: str) -> np.ndarray:
        """(N,) float32 BM25 score of every document for `query` (the definition above)."""
        ids = sorted({self.model.vocab_dict[t] for t in tokenize(query, self.cjk) if t in self.model.vocab_dict})
        if not ids:
            return np.zeros(len(self), dtype=np.float32)
        return (self.model.get_scores_from_ids(ids) * (self.k1 + 1)).astype(np.float32)

    def top_k(self, query: str, k: int) -> list[int]:
        """The k best documents, best first (ties by position)."""
        return self.top_k_scored(query, k)[0]

    def top_k_scored(self, query: str, k: int) -> tuple[list[int], list[float]]:
        """`top_k`'s documents and their scores."""
        s = self.scores(query)
        k = min(k, len(s))
        part = np.argpartition(-s, k - 1)[:k]
        rows = sorted(part.tolist(), key=lambda i: (-s[i], i))
        return rows, s[rows].tolist()

    def save(self, directory: str | Path) -> None:
        """bm25s' own files (NumPy arrays without pickle, JSON vocabulary) plus k1 and b."""
        directory = Path(directory)
        self.model.save(str(directory), allow_pickle=False)
        (directory / _SETTINGS).write_text(json.dumps({"k1": self.k1, "b": self.b, "cjk": self.cjk}), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> "BM25":
        import bm25s

        directory = Path(directory)
        settings = json.loads((directory / _SETTINGS).read_text(encoding="utf-8"))
        return cls(bm25s.BM25.load(str(directory), mmap=True, allow_pickle=False), settings["k1"], settings["b"],
                   settings.get("cjk", "bigram"))
