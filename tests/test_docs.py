"""The documentation stays true to the code: every `bertkit …` command shown in a fenced code block
of README.md or docs/*.md parses with the real CLI parser, and every relative link in those pages
points at a file (and heading) that exists.

A command is found the way a reader would type it: `$ ` prompts, `\\` line continuations, trailing
`# comments`, `VAR=value` prefixes, pipes and `&&` / `;` chains (only the bertkit part is parsed),
`torchrun … -m bertkit.cli …` and `python -m bertkit …` forms. `$VARS`, `${VARS}`, `$(…)` and
backtick substitutions become a placeholder word. Output is not a command: in a ```console block
only `$ ` lines (and their continuations) are, and so in any shell block that uses prompts at all.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = "PLACEHOLDER"  # what a $VAR or $(…) becomes: one ordinary word
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "zsh", "console", "shell-session"}
CHAINS = {"|", "||", "&&", ";", "&"}  # separate commands on one line
REDIRECTS = {">", ">>", "<", ">&", "&>", "<<", "<<<"}  # each takes the next word as its target
WRAPPERS = {"time", "nohup", "exec", "env"}  # words that run the command after them


@dataclass(frozen=True)
class Command:
    page: Path
    line: int  # 1-based line of the command's first line in the page
    text: str  # the command as written (continuations joined)
    argv: tuple[str, ...]  # what bertkit's parser receives
    problem: str | None = None  # the line could not be split into shell words

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


# ------------------------------------------------------------------------------------------------
# Markdown: fenced blocks
# ------------------------------------------------------------------------------------------------
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, 1-based line of the block's first content line, its lines) of each fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language = match.group(2), match.group(3).lower()
        start, i = i + 1, i + 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        blocks.append((language, start + 1, lines[start:i]))
        i += 1  # past the closing fence
    return blocks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line outside fenced blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            out.append((number, line))
    return out


# ------------------------------------------------------------------------------------------------
# Shell: logical lines, substitutions, words
# ------------------------------------------------------------------------------------------------
def logical_lines(lines: list[str], first: int, prompted: bool) -> list[tuple[int, str]]:
    """Join `\\` continuations: (line number of the first physical line, the joined text)."""
    out: list[tuple[int, str]] = []
    open_line = False
    for offset, raw in enumerate(lines):
        line = raw.rstrip()
        starts_prompt = line.lstrip().startswith("$ ")
        if open_line and not (prompted and starts_prompt):
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip().removesuffix("\\"))
        else:
            out.append((first + offset, line.removesuffix("\\")))
        open_line = line.endswith("\\")
    return out


def _close_paren(text: str, i: int) -> int:
    """Index just past the `)` closing a `$(` whose content starts at i (quotes respected)."""
    depth, quote = 1, None
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")


def substitute(line: str) -> str:
    """Shell text → text for shlex: `$(…)`, backticks and $VARS become PLACEHOLDER (not inside
    single quotes, as the shell does), and a `#` comment (at the start of a word, outside quotes)
    is cut off."""
    out, i, quote = [], 0, None
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
            out.append(c)
            i += 1
        elif c == "\\" and i + 1 < len(line):
            out.append(line[i:i + 2])
            i += 2
        elif c == "'" and quote is None:
            quote = "'"
            out.append(c)
            i += 1
        elif c == '"':
            quote = None if quote == '"' else '"'
            out.append(c)
            i += 1
        elif c == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith("$(", i):
            i = _close_paren(line, i + 2)
            out.append(PLACEHOLDER)
        elif c == "`":
            end = line.find("`", i + 1)
            i = len(line) if end < 0 else end + 1
            out.append(PLACEHOLDER)
        elif (match := VARIABLE.match(line, i)):
            out.append(PLACEHOLDER)
            i = match.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def words(line: str) -> list[str]:
    """The shell words of a substituted line, with `|`, `&&`, `;`, `>` … as words of their own."""
    line = re.sub(r"(?<!\S)\d*>&\d+(?!\S)", " ", line)  # 2>&1: no word of the command
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # comments are already cut, and only at a word's start
    return list(lexer)


def bertkit_argv(tokens: list[str]) -> list[list[str]]:
    """The arguments given to bertkit by each command of a chain that runs it."""
    found, segment = [], []
    for token in [*tokens, ";"]:
        if token not in CHAINS:
            segment.append(token)
            continue
        plain, skip = [], False
        for word in segment:  # drop redirections and their targets
            if skip:
                skip = False
            elif word in REDIRECTS:
                skip = True
            else:
                plain.append(word)
        k = 0
        while k < len(plain) and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", plain[k]) or plain[k] in WRAPPERS):
            k += 1
        if k < len(plain) and (plain[k] == "bertkit" or plain[k].endswith("/bertkit")):
            found.append(plain[k + 1:])
        else:
            for j, word in enumerate(plain[:-1]):
                if word == "-m" and plain[j + 1] in ("bertkit", "bertkit.cli"):
                    found.append(plain[j + 2:])
                    break
        segment = []
    return found


def commands_in(page: Path, text: str | None = None) -> list[Command]:
    """Every bertkit command in the page's fenced shell blocks."""
    text = page.read_text(encoding="utf-8") if text is None else text
    found = []
    for language, first, lines in fenced_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        prompted = language == "console" or any(line.lstrip().startswith("$ ") for line in lines)
        for number, line in logical_lines(lines, first, prompted):
            stripped = line.strip()
            if prompted:
                if not stripped.startswith("$ "):
                    continue  # output
                stripped = stripped[2:]
            if "bertkit" not in stripped:
                continue
            try:
                tokens = words(substitute(stripped))
            except ValueError as error:  # an unclosed quote
                found.append(Command(page, number, stripped, (), f"not shell words: {error}"))
                continue
            for argv in bertkit_argv(tokens):
                found.append(Command(page, number, stripped, tuple(argv)))
    return found


def strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser and its subcommands' without prefix matching: a page must spell a flag in full,
    or a renamed flag that still starts with the page's spelling would pass unnoticed."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                strict(sub)
    return parser


def parse(argv: tuple[str, ...]) -> str | None:
    """None when bertkit's parser accepts argv, else what it said."""
    from bertkit.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            strict(build_parser()).parse_args(list(argv))
    except SystemExit as stop:  # argparse: 2 for a bad command line, 0 after --help / --version
        if stop.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {stop.code}"
    except Exception as error:  # noqa: BLE001 — a type= converter that raised: report it as such
        return f"{type(error).__name__}: {error}"
    return None


COMMANDS = [command for page in PAGES for command in commands_in(page)]


def test_commands_are_found():
    """The check cannot pass by finding nothing: the README and the docs both show commands."""
    pages = {command.page for command in COMMANDS}
    assert ROOT / "README.md" in pages, "no bertkit command found in README.md's code blocks"
    assert pages - {ROOT / "README.md"}, "no bertkit command found in docs/*.md"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where() for c in COMMANDS])
def test_command_parses(command: Command):
    error = command.problem or parse(command.argv)
    if error is not None:
        pytest.fail(f"{command.where()}: `{command.text}` does not parse: {error}", pytrace=False)


# ------------------------------------------------------------------------------------------------
# The extraction itself, on a page written for the test
# ------------------------------------------------------------------------------------------------
SAMPLE = """\
# A page

```console
$ M=$(python -c "import os; print(os.getcwd() + '/model')")
$ bertkit embed $M "a text" \\
    --precision int8   # a comment
3 embeddings of size 384
bertkit serve this-line-is-output
```

```bash
bertkit info base | head -3 && echo done; .venv/bin/bertkit datasets
BERTKIT_MALLOC=default torchrun --nproc_per_node=2 -m bertkit.cli pretrain --data d/ --out "${RUN}/x"
# bertkit not-a-command: a comment line
pip install 'bertkit[serve]'
```

```python
import bertkit  # not shell
```
"""


def test_extraction_handles_prompts_continuations_chains_and_substitutions(tmp_path):
    page = tmp_path / "sample.md"
    found = commands_in(page, SAMPLE)
    assert [(c.line, c.argv) for c in found] == [
        (5, ("embed", PLACEHOLDER, "a text", "--precision", "int8")),
        (12, ("info", "base")),
        (12, ("datasets",)),
        (13, ("pretrain", "--data", "d/", "--out", f"{PLACEHOLDER}/x")),
    ]
    assert all(parse(c.argv) is None for c in found)


def test_a_renamed_flag_is_caught(tmp_path):
    page = tmp_path / "renamed.md"
    [command] = commands_in(page, "```bash\nbertkit embed MODEL 'a text' --precission int8\n```\n")
    error = parse(command.argv)
    assert error is not None and "--precission" in error
    # a flag renamed to a longer name that starts with the old one is caught too
    [command] = commands_in(page, "```bash\nbertkit embed MODEL 'a text' --max-batch-token 64\n```\n")
    assert parse(command.argv) is not None


# ------------------------------------------------------------------------------------------------
# Links
# ------------------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)*?\1")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids of a page: lowercase, punctuation dropped, spaces → '-', repeats -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image in the page's prose (code excluded)."""
    out = []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        out += [(number, m.group(1)) for m in LINK.finditer(line)]
        out += [(number, m.group(1)) for m in REFERENCE.finditer(line)]
    return out


LINKS = [(page, number, target) for page in PAGES for number, target in links(page)
         if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not files


def test_links_are_found():
    assert any(page == ROOT / "README.md" for page, _, _ in LINKS), "no relative link in README.md"


@pytest.mark.parametrize("page, line, target", LINKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}:{t}" for p, n, t in LINKS])
def test_link_resolves(page: Path, line: int, target: str):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    where = f"{page.relative_to(ROOT)}:{line}"
    if not file.exists():
        pytest.fail(f"{where}: link target {target} does not exist", pytrace=False)
    if anchor and file.suffix == ".md":
        if anchor not in anchors(file):
            pytest.fail(f"{where}: no heading #{anchor} in {file.relative_to(ROOT)}", pytrace=False)
