"""Rows of CSV, TSV and JSON Lines files, streamed: the one reader under bertkit's row files.

Fine-tuning's readers (`data.tasks`) and the inference engine's file path (`inference.files`)
both read rows here, line by line, so a file of any size costs one row's memory:

- `text_lines`: (line number, text) of a UTF-8 file, decoded line by line, a byte-order mark
  dropped. What a line that is not UTF-8 does depends on `encoding`:
    "refuse"  a ValueError naming file, line and column: a labelled file in another encoding is
              wrong as a whole (every accented row would be skipped, biasing the data);
    "skip"    that line alone is reported and skipped: a run over a large input loses one row,
              not the run.
  A file with NUL bytes in its first 8 KiB is refused either way (binary, or UTF-16).
- `read_rows`: (line number, row dict) per row. JSON Lines: one object a line. CSV / TSV: a header
  row naming the columns (blank lines before it are allowed), then one row per record; quoted
  fields may span lines, and the line number is where the row starts. Rows follow
  `csv.DictReader`'s convention: a short row has None for the fields it lacks, a long one lists
  its extra fields under the key None; the caller decides what that means for it.

Blank lines are skipped silently. Bad rows (invalid JSON, not an object, malformed CSV) are reported
through a `DataReport` (file:line, the problem, the fix) and skipped; a header that names a column
twice, or lacks a column the caller requires, is a ValueError at once.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Iterator

from bertkit.data.report import DataReport, json_lines

ROW_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
ENCODINGS = ("refuse", "skip")
SNIFF_BYTES = 8192  # bytes inspected to tell a binary file (NUL bytes) from text


def row_format(path: str | os.PathLike) -> str:
    """'csv', 'tsv' or 'jsonl' from the file suffix; ValueError naming the suffixes understood."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass a data file ({', '.join(ROW_FORMATS)})")
    suffix = Path(path).suffix.lower()
    if suffix not in ROW_FORMATS:
        raise ValueError(f"{path}: cannot tell the format from suffix {suffix!r}; use one of "
                         f"{', '.join(ROW_FORMATS)} (CSV and TSV need a header row)")
    return ROW_FORMATS[suffix]


def check_text_file(path: str | os.PathLike) -> Path:
    """The path of an existing, non-binary file; FileNotFoundError / IsADirectoryError / ValueError
    naming it otherwise."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass a data file")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}; check the path")
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if b"\x00" in head:
        raise ValueError(f"{path} looks binary (NUL bytes in its first {SNIFF_BYTES} bytes); pass a "
                         "UTF-8 text file (a UTF-16 file: re-encode it, e.g. iconv -f utf-16 -t utf-8)")
    return path


def text_lines(path: str | os.PathLike, report: DataReport, *,
               encoding: str = "refuse") -> Iterator[tuple[int, str]]:
    """(line number, text with its line ending) of a UTF-8 file, one line at a time (see the
    module docstring for `encoding`)."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    path = check_text_file(path)
    for line_no, text, bad in decoded_lines(path):
        if text is None:
            if encoding == "refuse":
                raise ValueError(f"{path} line {line_no}: not UTF-8 text ({bad}); re-save the file as "
                                 "UTF-8 (e.g. iconv -f latin1 -t utf-8)")
            report.skip_problem(f"{path}:{line_no}", "non-UTF-8 line",
                                f"{bad}; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
            continue
        if encoding == "refuse" and "\x00" in text:
            raise ValueError(f"{path} line {line_no}: binary data (a NUL byte), not text; pass a "
                             "UTF-8 text file")
        yield line_no, text


def decoded_lines(path: Path) -> Iterator[tuple[int, str | None, str | None]]:
    """(line number, text with its line ending, None) per line of a file, decoded one line at a
    time so that a line in another encoding costs only itself: (line number, None, where its first
    bad byte is) for such a line. A UTF-8 byte-order mark is dropped."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
                raw = raw[3:]
            try:
                yield line_no, raw.decode("utf-8"), None
            except UnicodeDecodeError as err:
                yield line_no, None, f"byte 0x{raw[err.start]:02x} at column {err.start + 1}"


def read_rows(path: str | os.PathLike, report: DataReport, *, fmt: str | None = None,
              required: dict[str, str] | None = None, encoding: str = "refuse",
              max_field_chars: int = 1_000_000) -> Iterator[tuple[int, dict[Any, Any]]]:
    """(line number, row) of every usable row of a CSV / TSV / JSON Lines file, in file order.

    fmt: "csv", "tsv" or "jsonl"; None = from the suffix (`row_format`).
    required: {column: how to name another one} — columns a CSV / TSV header must have, checked
      before the first row ("pass --text-field with one of them"). JSON Lines rows carry their
      own keys, so there the caller checks each row.
    max_field_chars: the longest CSV / TSV field that parses (the csv module's own limit, 128 Ki
      characters, would call long documents malformed); longer ones are reported as malformed.
    """
    kind = fmt or row_format(path)
    if kind in ("csv", "tsv") and csv.field_size_limit() < max_field_chars + 1:
        csv.field_size_limit(max_field_chars + 1)  # only widens what parses
    lines = text_lines(path, report, encoding=encoding)
    if kind == "jsonl":
        return _json_rows(path, lines, report)
    if kind in ("csv", "tsv"):
        return _table_rows(path, lines, report, kind, required or {})
    raise ValueError(f"unknown row format {kind!r}; use csv, tsv or jsonl")


def read_header(path: str | os.PathLike, fmt: str, required: dict[str, str] | None = None) -> list[str]:
    """The header of a CSV / TSV file, checked as `read_rows` checks it, without reading further:
    for callers that want a bad header to fail before they start work."""
    lines = text_lines(path, DataReport(str(path), quiet=True), encoding="skip")
    feed = _LineFeed(lines)
    try:
        return _header(path, feed, csv.reader(feed, delimiter="," if fmt == "csv" else "\t"), fmt,
                       required or {})
    finally:
        lines.close()


def _json_rows(path: str | os.PathLike, lines: Iterator[tuple[int, str]],
               report: DataReport) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, row, error in json_lines(lines):
        where = f"{path}:{line_no}"
        if error:
            report.skip_problem(where, "invalid JSON", error)
        elif not isinstance(row, dict):
            report.skip_problem(where, "not a JSON object",
                                f"got {type(row).__name__}; each line must be an object with named fields")
        else:
            yield line_no, row


class _LineFeed:
    """Decoded lines for `csv.reader`, remembering the line where the current row began."""

    def __init__(self, lines: Iterator[tuple[int, str]]):
        self._lines = lines
        self.start: int | None = None

    def __iter__(self) -> "_LineFeed":
        return self

    def __next__(self) -> str:
        line_no, text = next(self._lines)
        if self.start is None:
            self.start = line_no
        return text

    def take_start(self) -> int:
        start, self.start = self.start, None
        return start or 0


def _table_rows(path: str | os.PathLike, lines: Iterator[tuple[int, str]], report: DataReport,
                kind: str, required: dict[str, str]) -> Iterator[tuple[int, dict[Any, Any]]]:
    feed = _LineFeed(lines)
    reader = csv.reader(feed, delimiter="," if kind == "csv" else "\t")
    header = _header(path, feed, reader, kind, required)
    while header:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            report.skip_problem(f"{path}:{feed.take_start()}", f"malformed {kind.upper()}", str(err))
            continue
        line_no = feed.take_start()
        if not any(x.strip() for x in fields):
            continue
        row: dict[Any, Any] = dict(zip(header, fields + [None] * (len(header) - len(fields))))
        if len(fields) > len(header):
            row[None] = fields[len(header):]
        yield line_no, row


def _header(path: str | os.PathLike, feed: _LineFeed, reader: Any, kind: str,
            required: dict[str, str]) -> list[str]:
    """The header row (blank lines before it skipped), checked; [] for an empty file."""
    header: list[str] = []
    while not header:
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return []  # nothing usable: the caller's report says so at the end
        except csv.Error as err:
            raise ValueError(f"{path}:{feed.take_start()}: malformed {kind.upper()} header "
                             f"({err})") from None
        feed.take_start()
        if header and not any(header):
            header = []
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        raise ValueError(f"{path}: the header names column(s) {', '.join(map(repr, duplicates))} more "
                         "than once; give every column its own name")
    for name, fix in required.items():
        if name not in header:
            raise ValueError(f"{path}: no column {name!r} in the header ({', '.join(header)}); {fix}")
    return header
