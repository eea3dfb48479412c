"""Shared by every data reader, and free of torch so preparation workers start fast.

`DataReport` counts what reading an input kept and skipped, with the first problems verbatim
(file and line, what is wrong, the fix), so bad rows are reported without stopping the run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value the losses skip

# How many bad-row messages a report keeps verbatim; all are counted.
MAX_MESSAGES = 20


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

    def skip(self, where: str, why: str) -> None:
        """Count one skipped row; `where` is "file:line", `why` says what is wrong and the fix."""
        self.n_skipped += 1
        if len(self.messages) < MAX_MESSAGES:  # the rest are counted, not logged one by one
            self.messages.append(f"{where}: {why}")
            log.warning("%s: %s (row skipped)", where, why)

    def summary(self) -> str:
        text = f"{self.source}: {self.n_kept} rows kept, {self.n_skipped} skipped"
        if self.messages:
            text += "; first problems: " + " | ".join(self.messages[:3])
        return text

    def to_dict(self) -> dict:
        return {"source": self.source, "n_kept": self.n_kept, "n_skipped": self.n_skipped,
                "messages": self.messages}

    def require_rows(self) -> None:
        """Raise when nothing usable was read: training on an empty set would only mislead."""
        if self.n_kept == 0:
            detail = f"; {self.n_skipped} rows skipped, e.g. {self.messages[0]}" if self.messages else ""
            raise ValueError(f"{self.source}: no usable rows{detail}")
