"""Shared by every data reader, and free of torch so preparation workers start fast.

`DataReport` counts what reading an input kept and skipped, with the first problems verbatim
(file and line, what is wrong, the fix), so bad rows are reported without stopping the run.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

log = logging.getLogger(__name__)


# How many bad-row messages a report keeps verbatim; all are counted.
MAX_MESSAGES = 20


# ---------------------------------------------------------------------------------------------
# text files
# ---------------------------------------------------------------------------------------------
def read_text(path: str | os.PathLike) -> str:
    """The whole text of a UTF-8 file (a byte-order mark dropped), or ValueError naming the file,
    line and column of the first byte that is not UTF-8 text, and the fix.

    A labelled file in another encoding is wrong as a whole (every accented row would be skipped,
    biasing the data), so it is refused rather than read line by line as a corpus is.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; pass a data file")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}; check the path")
    raw = path.read_bytes()
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise ValueError(f"{path} line {line}: binary data (a NUL byte at byte {nul}), not text; "
                         "pass a UTF-8 text file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        start = err.start
        line = raw.count(b"\n", 0, start) + 1
        column = start - (raw.rfind(b"\n", 0, start) + 1) + 1
        raise ValueError(f"{path} line {line}: not UTF-8 text (byte 0x{raw[start]:02x} at column "
                         f"{column}); re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


# ---------------------------------------------------------------------------------------------
# JSON Lines
# ---------------------------------------------------------------------------------------------
def json_lines(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, None) for each non-blank line that parses as JSON, or (line number,
    None, what is wrong) for one that does not; blank lines are skipped silently."""
    for line_no, line in lines:
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line), None
        except json.JSONDecodeError as err:
            yield line_no, None, err.msg


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """"1 line", "2 lines"; `plural_form` where adding "s" is wrong ("2 lines too long")."""
    return f"{n} {noun if n == 1 else plural_form or noun + 's'}"


# ---------------------------------------------------------------------------------------------
# bad-row reporting
# ---------------------------------------------------------------------------------------------
@dataclass
class DataReport:
    """What reading one input produced: rows kept, rows skipped and why (first few verbatim)."""

    source: str
    n_kept: int = 0
    n_skipped: int = 0
    messages: list[str] = field(default_factory=list)
    # Problems in rows that were kept (e.g. a SQuAD eval answer at a wrong offset: only its text
    # is scored); counted and the first few kept verbatim, like `messages`.
    n_noted: int = 0
    notes: list[str] = field(default_factory=list)
    # Count and keep messages without logging them: a second pass over a file already reported,
    # or a rank > 0 of a torchrun job reading the file rank 0 reports.
    quiet: bool = False

    def skip(self, where: str, why: str, unit: str = "row") -> None:
        """Count one skipped row; `where` is "file:line", `why` says what is wrong and the fix.
        unit: what was skipped, for the log line ("row", "line", or "file" for a whole file)."""
        self.n_skipped += 1
        if len(self.messages) < MAX_MESSAGES:  # the rest are counted, not logged one by one
            self.messages.append(f"{where}: {why}")
            if not self.quiet:
                log.warning("%s: %s (%s skipped)", where, why, unit)

    def skip_problem(self, where: str, problem: str, detail: str = "") -> None:
        """`skip` with the problem named apart from its detail ("invalid JSON", "Expecting value"),
        for reports that count rows per problem (`inference.files.RecordReport`)."""
        self.skip(where, f"{problem}: {detail}" if detail else problem)

    def note(self, where: str, why: str) -> None:
        """Count one problem in a row that is kept anyway, and log the first few."""
        self.n_noted += 1
        if len(self.notes) < MAX_MESSAGES:
            self.notes.append(f"{where}: {why}")
            log.warning("%s: %s (row kept)", where, why)

    def summary(self) -> str:
        text = (f"{self.source}: {plural(self.n_kept, 'row')} kept, {self.n_skipped} skipped")
        if self.messages:
            text += "; first problems: " + " | ".join(self.messages[:3])
        if self.n_noted:
            text += f"; {plural(self.n_noted, 'row')} kept with a problem, first: {self.notes[0]}"
        return text

    def to_dict(self) -> dict:
        out = {"source": self.source, "n_kept": self.n_kept, "n_skipped": self.n_skipped,
               "messages": self.messages}
        if self.n_noted:
            out.update(n_noted=self.n_noted, notes=self.notes)
        return out

    def require_rows(self) -> None:
        """Raise when nothing usable was read: training on an empty set would only mislead."""
        if self.n_kept == 0:
            detail = (f"; {plural(self.n_skipped, 'row')} skipped, e.g. {self.messages[0]}"
                      if self.messages else "")
            raise ValueError(f"{self.source}: no usable rows{detail}")
