"""Unlabelled text as documents (lists of sentences), for tokenizer training and pre-training.

Sources (`load_corpus`): files, directories (every file below, in sorted order, hidden ones
skipped), glob patterns (`data/*.txt`, `**` allowed), and built-in corpora `builtin:NAME`
(see `bertkit.data.builtin`). Several sources concatenate in the order given.

File formats (`format=`):
  lines       BERT's layout: one sentence per line, a blank line between documents. A line holding
              several sentences is split (set split_sentences=False to keep lines as they are).
  paragraphs  one file = one document; each line / paragraph is split into sentences. (`prepare`
              cuts a document larger than the held-out share into sections, so that a few
              files are not held out whole.)
  jsonl       one JSON object per line = one document; its `text_field` holds a string (split into
              sentences at line breaks and sentence ends) or a list of strings (the sentences).
  auto        jsonl for .jsonl / .json / .ndjson files, lines for everything else.

Sentences are split by `bertkit.util.text.split_sentences` (Chinese and English rules).

Bad input never stops a run: binary files, empty files, lines that are not UTF-8, absurdly long
lines, JSON rows that do not parse or lack the text field are skipped, named by file and line,
counted in `Corpus.stats`, and logged as warnings. A corpus with nothing usable is a ValueError.
"""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from bertkit.data import builtin
from bertkit.data.report import MAX_MESSAGES, DataReport, json_lines, plural
from bertkit.data.rows import decoded_lines
from bertkit.util.text import split_sentences

FORMATS = ("auto", "lines", "paragraphs", "jsonl")
_JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
# A "sentence" longer than this is not text but a dump (minified JSON, base64, a table on one
# line); it would only be truncated into noise, so it is skipped and reported.
DEFAULT_MAX_LINE_CHARS = 100_000
# Bytes inspected to tell a binary file (NUL bytes) from text.
_SNIFF_BYTES = 8192


# ---------------------------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------------------------
# How the summary counts the skip kinds where "kind" + "s" would be wrong: (one, several).
_KIND_NOUNS = {"line too long": ("line too long", "lines too long"),
               "invalid JSON": ("invalid JSON line", "invalid JSON lines"),
               "missing text field": ("line missing the text field", "lines missing the text field")}


@dataclass
class CorpusStats:
    """What reading a corpus produced: counts, and the bad input that was skipped.

    skipped counts problems by kind ("non-UTF-8 line", "binary file", ...); report holds the
    first messages verbatim ("path:line: what is wrong") and the total.
    """

    sources: list[str]
    files: int = 0
    documents: int = 0
    sentences: int = 0
    characters: int = 0
    skipped: Counter = field(default_factory=Counter)
    report: DataReport = field(default_factory=lambda: DataReport("corpus"))

    def skip(self, where: str, kind: str, detail: str = "") -> None:
        """Count one skipped item of `kind` at `where` ("file" or "file:line") and log it."""
        self.skipped[kind] += 1
        unit = "line" if re.search(r":\d+$", where) else "file"  # a whole file has no line number
        self.report.skip(where, f"{kind}{': ' + detail if detail else ''}", unit)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def merge(self, other: "CorpusStats") -> None:
        self.sources += other.sources
        self.files += other.files
        self.documents += other.documents
        self.sentences += other.sentences
        self.characters += other.characters
        self.skipped.update(other.skipped)
        self.report.n_skipped += other.report.n_skipped
        room = max(0, MAX_MESSAGES - len(self.report.messages))
        self.report.messages += other.report.messages[:room]

    def summary(self) -> str:
        text = (f"{', '.join(self.sources)}: {plural(self.files, 'file')}, "
                f"{plural(self.documents, 'document')}, {plural(self.sentences, 'sentence')}, "
                f"{plural(self.characters, 'character')}")
        if self.skipped:
            kinds = ", ".join(plural(n, *_KIND_NOUNS.get(kind, (kind,)))
                              for kind, n in sorted(self.skipped.items()))
            text += f"; skipped {kinds} (first: {self.report.messages[0]})"
        return text

    def to_dict(self) -> dict:
        return {"sources": self.sources, "files": self.files, "documents": self.documents,
                "sentences": self.sentences, "characters": self.characters,
                "skipped": dict(sorted(self.skipped.items())),
                "messages": list(self.report.messages)}


@dataclass
class Corpus:
    """Documents, each a list of sentences (non-empty strings), with the reading stats."""

    documents: list[list[str]]
    stats: CorpusStats

    @classmethod
    def from_documents(cls, documents: Iterable[Sequence[str]],
                       name: str = "documents") -> "Corpus":
        """A corpus from in-memory documents (lists of sentences); empty sentences are dropped."""
        docs = [[s.strip() for s in doc if s and s.strip()] for doc in documents]
        return cls._counted([d for d in docs if d], CorpusStats([name]))

    @classmethod
    def from_texts(cls, texts: Iterable[str], name: str = "texts") -> "Corpus":
        """A corpus from in-memory texts, one document each, split into sentences."""
        docs = [split_sentences(t) for t in texts]
        return cls._counted([d for d in docs if d], CorpusStats([name]))

    @classmethod
    def concat(cls, corpora: Sequence["Corpus"]) -> "Corpus":
        stats = CorpusStats([])
        documents: list[list[str]] = []
        for corpus in corpora:
            documents += corpus.documents
            stats.merge(corpus.stats)
        return cls(documents, stats)

    @classmethod
    def _counted(cls, documents: list[list[str]], stats: CorpusStats) -> "Corpus":
        stats.documents = len(documents)
        stats.sentences = sum(len(d) for d in documents)
        stats.characters = sum(len(s) for d in documents for s in d)
        stats.report.n_kept = stats.documents
        return cls(documents, stats)

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    @property
    def num_sentences(self) -> int:
        return sum(len(d) for d in self.documents)

    def iter_sentences(self) -> Iterator[str]:
        for doc in self.documents:
            yield from doc

    def __len__(self) -> int:
        return len(self.documents)

    def require_text(self) -> "Corpus":
        """Return self, or raise ValueError when no usable sentence was read."""
        if not self.documents:
            raise ValueError(f"no usable text in corpus {self.stats.summary()}; check the paths, "
                             "the --format, and the JSON text field name")
        return self


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def load_corpus(sources: str | os.PathLike | Sequence[str | os.PathLike], *,
                format: str = "auto", text_field: str = "text", split: bool = True,
                max_line_chars: int = DEFAULT_MAX_LINE_CHARS) -> Corpus:
    """Read corpus source(s) into documents; see the module docstring for sources and formats.

    split=False keeps the lines of `lines`-format files as the sentences. Raises
    FileNotFoundError for a source that names nothing, ValueError when nothing usable was read.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; use one of {', '.join(FORMATS)}")
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise ValueError("no corpus sources given; pass a file, directory, glob or builtin:NAME")
    parts = []
    for source in sources:
        text = os.fspath(source)
        if text.startswith("builtin:"):
            parts.append(load_builtin(text[len("builtin:"):]))
            continue
        stats = CorpusStats([text])
        documents: list[list[str]] = []
        for path in resolve_source(text):
            stats.files += 1
            fmt = format if format != "auto" else (
                "jsonl" if path.suffix.lower() in _JSONL_SUFFIXES else "lines")
            documents += _read_file(path, fmt, stats, text_field=text_field, split=split,
                                    max_line_chars=max_line_chars)
        corpus = Corpus._counted(documents, stats)
        parts.append(corpus)
    corpus = parts[0] if len(parts) == 1 else Corpus.concat(parts)
    return corpus.require_text()


def load_builtin(name: str) -> Corpus:
    """The built-in corpus `name` (without the "builtin:" prefix; `data.builtin.BUILTIN_CORPORA`)."""
    if name in builtin.COMBINED:
        return Corpus.concat([load_builtin(part) for part in builtin.COMBINED[name]])
    documents, files = builtin.documents(name)
    corpus = Corpus.from_documents(documents, name=f"builtin:{name}")
    corpus.stats.files = files
    return corpus


def as_corpus(corpus: "Corpus | str | os.PathLike | Sequence[str | os.PathLike]", *,
              format: str = "auto", text_field: str = "text") -> Corpus:
    """A `Corpus` as is, or load the source(s) it names (see `load_corpus`)."""
    if isinstance(corpus, Corpus):
        return corpus.require_text()
    return load_corpus(corpus, format=format, text_field=text_field)


def resolve_source(source: str) -> list[Path]:
    """Files named by one source: a file, a directory (recursive, sorted), or a glob pattern."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise FileNotFoundError(f"corpus directory {path} holds no files")
        return files
    if glob.has_magic(source):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(source), recursive=True)
                       if Path(p).is_file())
        if not files:
            raise FileNotFoundError(f"no files match the corpus pattern {source!r}")
        return files
    hint = ""
    if " " in source.strip() or len(source) > 255:
        hint = " (for in-memory texts pass Corpus.from_texts([...]) instead of strings)"
    raise FileNotFoundError(f"corpus source {source!r} not found; pass a file, a directory, a glob "
                            f"or one of {', '.join('builtin:' + n for n in builtin.BUILTIN_CORPORA)}{hint}")


def _read_file(path: Path, fmt: str, stats: CorpusStats, *, text_field: str, split: bool,
               max_line_chars: int) -> list[list[str]]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as err:
        stats.skip(str(path), "unreadable file", err.strerror or str(err))
        return []
    if size == 0 or (size <= _SNIFF_BYTES and not head.strip()):
        stats.skip(str(path), "empty file")
        return []
    if b"\x00" in head:
        stats.skip(str(path), "binary file", "NUL bytes found; pass text files only")
        return []
    lines = _text_lines(path, stats, max_line_chars)
    if fmt == "jsonl":
        return _jsonl_documents(path, lines, stats, text_field)
    if fmt == "paragraphs":
        doc = [s for _, line in lines for s in split_sentences(line)]
        return [doc] if doc else []
    documents: list[list[str]] = []
    current: list[str] = []
    for _, line in lines:
        if not line.strip():  # blank line: document boundary
            if current:
                documents.append(current)
            current = []
        elif split:
            current += split_sentences(line)
        else:
            current.append(line.strip())
    if current:
        documents.append(current)
    return documents


def _text_lines(path: Path, stats: CorpusStats, max_line_chars: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file, decoding line by line so one bad line costs only itself."""
    for line_no, line, bad in decoded_lines(path):
        if line is None:
            stats.skip(f"{path}:{line_no}", "non-UTF-8 line",
                       f"{bad}; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
            continue
        line = line.rstrip("\r\n")
        if len(line) > max_line_chars:
            stats.skip(f"{path}:{line_no}", "line too long",
                       f"{len(line)} characters > {max_line_chars}")
            continue
        yield line_no, line


def _jsonl_documents(path: Path, lines: Iterable[tuple[int, str]], stats: CorpusStats,
                     text_field: str) -> list[list[str]]:
    documents = []
    for line_no, row, error in json_lines(lines):
        where = f"{path}:{line_no}"
        if error:
            stats.skip(where, "invalid JSON", error)
            continue
        value = row.get(text_field) if isinstance(row, dict) else None
        if isinstance(value, str):
            doc = split_sentences(value)
        elif isinstance(value, list) and all(isinstance(s, str) for s in value):
            doc = [s.strip() for s in value if s.strip()]
        else:
            found = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
            stats.skip(where, "missing text field",
                       f"no string or list of strings under {text_field!r} (found: {found}); "
                       "pass --text-field")
            continue
        if doc:
            documents.append(doc)
    return documents
