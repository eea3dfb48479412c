"""The shape of the code: modules stay one concern each, and private names stay in their module.

The import layers themselves are import-linter's contract (pyproject.toml, `make lint`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bertkit

SOURCE = Path(bertkit.__file__).parent
# Past this a module is usually two concerns (docs/design.md, "Where a new capability goes").
MAX_LINES = 600


def modules() -> list[Path]:
    found = sorted(SOURCE.rglob("*.py"))
    assert len(found) > 50, f"found only {len(found)} modules under {SOURCE}"
    return found


def test_no_module_is_longer_than_one_concern():
    long = {str(p.relative_to(SOURCE)): n for p in modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_private_names_do_not_cross_modules():
    """`_name` is private to its module: no `from bertkit.x import _name`, no `x._name` on a
    bertkit module imported under a name."""
    crossings = []
    for path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported_modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bertkit"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        crossings.append(f"{path.relative_to(SOURCE)}:{node.lineno} imports {alias.name}")
                    imported_modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("bertkit"):
                        imported_modules.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in imported_modules):
                crossings.append(f"{path.relative_to(SOURCE)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not crossings, "private names used outside their module: " + "; ".join(crossings)


def test_comments_cite_no_issue_numbers():
    """A comment says what was measured or decided, not where it was once asked for: an issue
    number means nothing to a reader of the code (the issue tracker is not part of the tree)."""
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = [f"{path.relative_to(SOURCE)}:{n}" for path in modules()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "issue numbers in the source (say what was measured instead): " + ", ".join(found)
