"""Input files of the engine's file path, streamed as `Record`s: one usable row each.

Formats (`fmt`, or from the suffix with "auto"):
  txt     one text per line (.txt, .text);
  jsonl   one JSON object per line, its `text_field` (and `pair_field`) strings, or with
          `words_field` a list of pre-split words (.jsonl, .ndjson, .json);
  csv/tsv a header row naming the columns, then one row per record (.csv, .tsv; quoted fields may
          span lines, `Record.line` is where the row starts);
  conll   one token per line (token, then optional columns, the tag last: ignored), a blank line
          between sentences; a sentence is one record of pre-split words (.conll);
  squad   a SQuAD-format JSON file: each question is a record, its context the pair, its id kept
          (never by suffix: .json means JSON Lines; name it with fmt="squad").
Rows are read by `data.rows` (line by line; a SQuAD file, one JSON document, is read whole).
Blank lines are skipped silently. Bad rows (not UTF-8, invalid JSON, not an object, a missing or
non-string field, empty text, a wrong column count, malformed CSV, text over `max_chars`, a broken
CoNLL sentence) are named as file:line in the report, counted per problem and skipped.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from bertkit.data.formats.ner import conll_sentences, join_words
from bertkit.data.formats.qa import read_squad
from bertkit.data.report import DataReport
from bertkit.data.rows import check_text_file, read_header, read_rows, text_lines

FORMATS = ("auto", "txt", "jsonl", "csv", "tsv", "conll", "squad")
SUFFIX_FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl",
                  ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".conll": "conll"}
# The suffix that stands for each format, where a caller names the format of a file whose suffix
# says nothing (`--input-format`): SQuAD's is .json.
FORMAT_SUFFIXES = {"txt": ".txt", "jsonl": ".jsonl", "csv": ".csv", "tsv": ".tsv", "conll": ".conll",
                   "squad": ".json"}
# A "text" longer than this is a dump (minified JSON, base64, a table on one line), not a
# sentence or document; one such row would also hold more memory than a whole chunk should.
DEFAULT_MAX_CHARS = 1_000_000


@dataclass
class Record:
    """One usable input row."""

    line: int  # 1-based line of the source file where the row starts
    text: str  # the text; for pre-split words, the words joined (`data.tasks.ner.join_words`)
    pair: str | None = None  # the second text of a pair (classify pairs, rerank, a QA context)
    extra: dict[str, Any] = field(default_factory=dict)  # the row's other fields, e.g. "id"
    words: list[str] | None = None  # pre-split words (CoNLL, or jsonl with `words_field`)


@dataclass
class RecordReport(DataReport):
    """A `DataReport` that also counts the skipped rows per problem ("invalid JSON": 3, ...)."""

    problems: Counter = field(default_factory=Counter)

    def skip_problem(self, where: str, problem: str, detail: str = "") -> None:
        self.problems[problem] += 1
        self.skip(where, f"{problem}: {detail}" if detail else problem)

    def summary(self) -> str:
        text = f"{self.source}: {self.n_kept} rows kept, {self.n_skipped} skipped"
        if self.problems:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.problems.items()))
            text += f" ({kinds}); first problems: " + " | ".join(self.messages[:3])
        return text

    def to_dict(self) -> dict:
        return {**super().to_dict(), "problems": dict(sorted(self.problems.items()))}


def record_format(path: str | os.PathLike, fmt: str = "auto") -> str:
    """One of FORMATS but "auto": `fmt` itself, or from the file suffix when fmt is "auto"."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass an input file ({', '.join(SUFFIX_FORMATS)})")
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        named = "|".join(f for f in FORMATS if f != "auto")
        raise ValueError(f"{path}: cannot tell the format from suffix {suffix!r} (known: "
                         f"{', '.join(SUFFIX_FORMATS)}); rename the file, or name its format with "
                         f"--input-format {named} (fmt= in Python)")
    return SUFFIX_FORMATS[suffix]


def read_records(path: str | os.PathLike, *, fmt: str = "auto", text_field: str = "text",
                 pair_field: str | None = None, words_field: str | None = None,
                 report: DataReport | None = None, max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[Record]:
    """Stream the usable rows of an input file as `Record`s, in file order (see the module
    docstring for the formats and what is skipped).

    Raises FileNotFoundError / ValueError at once for a missing file, an unknown format, a binary
    file or a header without `text_field`; ValueError at the end when no row was usable.
    """
    path = Path(path)
    kind = record_format(path, fmt)
    if not path.is_file():
        raise FileNotFoundError(f"no such input file: {path}")
    if kind in ("txt", "conll") and pair_field is not None:
        raise ValueError(f"{path}: a {kind} file holds single texts, so pair field {pair_field!r} "
                         "cannot be read from it; give pairs as jsonl, csv or tsv")
    check_text_file(path)
    if report is None:
        report = RecordReport(str(path))
    if kind in ("csv", "tsv"):  # a header without the text column fails now, not at the first row
        read_header(path, kind, _required(text_field, pair_field))
    return _records(path, kind, text_field, pair_field, words_field, report, max_chars)


def _required(text_field: str, pair_field: str | None) -> dict[str, str]:
    required = {text_field: "pass --text-field with one of them"}
    if pair_field is not None:
        required[pair_field] = "pass --pair-field with one of them"
    return required


def _records(path: Path, kind: str, text_field: str, pair_field: str | None, words_field: str | None,
             report: DataReport, max_chars: int) -> Iterator[Record]:
    kept = 0
    if kind == "txt":
        rows = _txt_records(path, report, max_chars)
    elif kind == "conll":
        rows = _conll_records(path, report)
    elif kind == "squad":
        rows = _squad_records(path, report)
    else:
        rows = _row_records(path, kind, report, text_field, pair_field, words_field, max_chars)
    for record in rows:
        kept += 1
        report.n_kept += 1
        yield record
    if kept == 0:
        detail = ""
        if report.messages:
            detail = f"; {report.n_skipped} rows skipped, e.g. {report.messages[0]}"
        raise ValueError(f"{path}: no usable rows{detail}")


def _txt_records(path: Path, report: DataReport, max_chars: int) -> Iterator[Record]:
    for line_no, line in text_lines(path, report, encoding="skip"):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if len(text) > max_chars:
            report.skip_problem(f"{path}:{line_no}", "text too long", f"{len(text)} characters > {max_chars}")
            continue
        yield Record(line_no, text)


def _row_records(path: Path, kind: str, report: DataReport, text_field: str, pair_field: str | None,
                 words_field: str | None, max_chars: int) -> Iterator[Record]:
    required = _required(text_field, pair_field) if words_field is None else {}
    for line_no, row in read_rows(path, report, fmt=kind, required=required, encoding="skip",
                                  max_field_chars=max_chars):
        where = f"{path}:{line_no}"
        if kind in ("csv", "tsv") and (None in row or None in row.values()):
            fields = len(row) - (None in row) - sum(v is None for v in row.values()) + len(row.get(None) or [])
            separator = "commas" if kind == "csv" else "tabs"
            report.skip_problem(where, "wrong column count",
                                f"{fields} fields, the header has {len(row) - (None in row)}; quote fields "
                                f"that contain {separator}")
            continue
        record = (_words_record(row, line_no, where, report, words_field) if words_field is not None
                  else _text_record(row, line_no, where, report, text_field, pair_field, max_chars))
        if record is not None:
            yield record


def _text_record(row: dict[str, Any], line_no: int, where: str, report: DataReport,
                 text_field: str, pair_field: str | None, max_chars: int) -> Record | None:
    """The Record of one parsed row, or None after reporting what is wrong with it."""
    values = []
    for name, flag, role in ((text_field, "--text-field", "text"), (pair_field, "--pair-field", "pair")):
        if name is None:
            values.append(None)
            continue
        if name not in row:
            report.skip_problem(where, f"missing {role} field",
                                f"no {name!r} (found: {', '.join(sorted(map(str, row))) or 'nothing'}); "
                                f"pass {flag}")
            return None
        value = row[name]
        if not isinstance(value, str):
            report.skip_problem(where, f"{role} not a string",
                                f"{name!r} holds {type(value).__name__} {_short(value)}; expected a string")
            return None
        if not value.strip():
            report.skip_problem(where, f"empty {role}", f"{name!r} is empty")
            return None
        if len(value) > max_chars:
            report.skip_problem(where, f"{role} too long", f"{len(value)} characters > {max_chars}")
            return None
        values.append(value)
    extra = {k: v for k, v in row.items() if k != text_field and k != pair_field}
    return Record(line_no, values[0], values[1], extra)


def _words_record(row: dict[str, Any], line_no: int, where: str, report: DataReport,
                  words_field: str) -> Record | None:
    """A record of pre-split words from a list field (`words_field`)."""
    words = row.get(words_field)
    if not isinstance(words, list) or not words:
        report.skip_problem(where, "missing words field",
                            f"no non-empty list {words_field!r} (found: {', '.join(sorted(map(str, row)))}); "
                            "pass --tokens-key")
        return None
    if any(not isinstance(w, str) or not w.strip() for w in words):
        report.skip_problem(where, "bad word", f"every item of {words_field!r} must be a non-empty string")
        return None
    extra = {k: v for k, v in row.items() if k != words_field}
    return Record(line_no, join_words(words).text, None, extra, words=list(words))


def _conll_records(path: Path, report: DataReport) -> Iterator[Record]:
    for sentence in conll_sentences(path, report, labelled=False, encoding="skip"):
        if isinstance(sentence, tuple):
            where, problem = sentence
            report.skip_problem(where, "bad CoNLL sentence", problem)
            continue
        line = int(sentence.where.rsplit(":", 1)[1])
        yield Record(line, join_words(sentence.words).text, None, {}, words=sentence.words)


def _squad_records(path: Path, report: DataReport) -> Iterator[Record]:
    examples, _, _ = read_squad(path, training=False, report=report)
    report.n_kept -= len(examples)  # counted again as records below, as every format's are
    for example in examples:
        yield Record(example.line, example.question, example.context, {"id": example.id})


def _short(value: Any) -> str:
    return json.dumps(value)[:40]
