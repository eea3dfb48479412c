"""Okapi BM25 (Robertson & Zaragoza 2009), small and exact: for mining hard negatives to train a
reranker, and as the lexical baseline. Not a search engine: scores are computed with one pass
over the query terms' postings.

idf = ln(1 + (N - df + 0.5) / (df + 0.5)) (the Lucene form, never negative); k1 1.5 and b 0.75
(rank_bm25's BM25Okapi defaults; Lucene uses k1 1.2). Tokens: lowercase word characters; CJK
text (no spaces) as character bigrams, which is what BM25 over Chinese usually indexes.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens; a run of CJK characters becomes its character bigrams."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if _CJK.search(word) and len(word) > 1:
            out.extend(a + b for a, b in zip(word, word[1:]))
        else:
            out.append(word)
    return out


@dataclass
class BM25:
    k1: float = 1.5
    b: float = 0.75
    postings: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    lengths: np.ndarray | None = None

    @classmethod
    def fit(cls, documents: Sequence[str], k1: float = 1.5, b: float = 0.75) -> "BM25":
        index = cls(k1, b)
        lengths = []
        for doc, text in enumerate(documents):
            counts = Counter(tokenize(text))
            lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                index.postings[term].append((doc, tf))
        index.lengths = np.asarray(lengths, dtype=np.float32)
        return index

    def scores(self, query: str) -> np.ndarray:
        """(N,) BM25 score of every document for `query`."""
        n = len(self.lengths)
        out = np.zeros(n, dtype=np.float32)
        norm = self.k1 * (1 - self.b + self.b * self.lengths / max(float(self.lengths.mean()), 1e-9))
        for term in set(tokenize(query)):
            posting = self.postings.get(term)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            docs = np.fromiter((d for d, _ in posting), dtype=np.int64, count=len(posting))
            tf = np.fromiter((t for _, t in posting), dtype=np.float32, count=len(posting))
            out[docs] += idf * tf * (self.k1 + 1) / (tf + norm[docs])
        return out

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
