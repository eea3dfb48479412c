"""docs/benchmarks.md stays what its header says: each bench's latest figures, not a lab notebook.

Every `## ` section (its heading up to the next `## ` or `# ` heading, fenced code included) is at
most MAX_LINES lines, and no commit hash is quoted: older figures and their commits live in git.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 40
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
# a 7-40 character hex word (not part of a longer word, number or path) ...
HEX_WORD = re.compile(r"(?<![\w.\-/])[0-9a-f]{7,40}(?![\w\-/])")


def sections(text: str) -> list[tuple[str, int, int]]:
    """(heading, 1-based first line, line count) of every `## ` section; `#` lines inside fenced
    blocks are shell comments, not headings."""
    lines, fence, starts = text.splitlines(), None, []
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and re.match(r"^#{1,2} ", line):
            starts.append((number, line))
    starts.append((len(lines) + 1, ""))
    return [(heading, start, end - start) for (start, heading), (end, _) in zip(starts, starts[1:])
            if heading.startswith("## ")]


def hash_like(text: str) -> list[str]:
    """Words that read as commit hashes: 7-40 hex characters, at least one digit and one letter."""
    return [word for word in HEX_WORD.findall(text)
            if re.search(r"\d", word) and re.search(r"[a-f]", word)]


def test_every_section_is_short():
    found = sections(PAGE.read_text(encoding="utf-8"))
    assert found, "no `## ` section found in docs/benchmarks.md"
    long = [f"{heading!r} (line {start}): {count} lines" for heading, start, count in found
            if count > MAX_LINES]
    assert not long, (f"docs/benchmarks.md sections over {MAX_LINES} lines (keep only the latest "
                      "table, its command, machine and date; design notes go to docs/design.md): "
                      + "; ".join(long))


def test_no_commit_hashes():
    text = PAGE.read_text(encoding="utf-8")
    where = [f"line {number}: {word}" for number, line in enumerate(text.splitlines(), 1)
             for word in hash_like(line)]
    assert not where, ("docs/benchmarks.md quotes commit hashes (the history stays in git): "
                       + "; ".join(where))


def test_the_checks_catch_what_they_are_for():
    notebook = "## a\n" + "x\n" * MAX_LINES + "## b\n```bash\n# a comment, no heading\n```\n"
    assert [(h, n) for h, _, n in sections(notebook)] == [("## a", MAX_LINES + 1), ("## b", 4)]
    assert hash_like("on commit 31c037f (`dd71821`), c118545 before; " + "a1" * 20) == [
        "31c037f", "dd71821", "c118545", "a1" * 20]
    # ordinary words and numbers are not hashes
    assert hash_like("decade 1,000,000 2026-12-02 1e-5 0.99566 facade bf16 int8 deadbeef 1234567 "
                     "e5a1.npy v2.0 1.2e-3") == []
