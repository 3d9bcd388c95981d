"""The README and docs/ name modules where they are: every `registry/….py` or `pipeline/….py`
path a page names exists, and every dotted `registry.…`/`pipeline.…` name is a module or
package (or a name defined at the top of one), so a page cannot keep a module's old place
after it moves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PATH = re.compile(r"(?<![\w./-])((?:registry|pipeline)/[\w/]*\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:registry|pipeline)(?:\.\w+)+)")
FILE_NAMES = ("registry.db",)
"""Dotted names that are files, not modules (the embedded registry's SQLite file)."""


def unknown_module(dotted: str, root: Path = ROOT) -> str | None:
    """Why *dotted* names no module, package or top-level name of one; None when it does."""
    parts = dotted.split(".")
    for count in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:count])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() \
            else base / "__init__.py"
        if not source.is_file():
            continue
        rest = parts[count:]
        if not rest:
            return None
        defined = re.compile(rf"^(?:def|class)\s+{rest[0]}\b|^{rest[0]}\s*[:=]"
                             rf"|^(?:from\s+\S+\s+)?import\s.*\b{rest[0]}\b", re.MULTILINE)
        if len(rest) <= 2 and defined.search(source.read_text(encoding="utf-8")):
            return None
        return f"{'.'.join(parts[:count])} defines no {rest[0]}"
    return "no such module"


def misplaced(name: str, text: str, root: Path = ROOT) -> list[str]:
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            if not (root / match.group(1)).exists():
                problems.append(f"{name}:{number}: {match.group(1)} does not exist")
        for match in DOTTED.finditer(line):
            dotted = match.group(1)
            if dotted.startswith(FILE_NAMES):
                continue
            why = unknown_module(dotted, root)
            if why is not None:
                problems.append(f"{name}:{number}: {dotted}: {why}")
    return problems


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_page_names_is_there(path: Path) -> None:
    assert misplaced(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")) == []


def test_a_moved_module_is_caught() -> None:
    text = ("Writes go through `registry/sql/history.py` (`registry.sql.history.put`);\n"
            "`registry.ops.history.set_status_and_record` and `pipeline/cli/base.py` stay.\n"
            "`registry.ops.history.nothing_here` and the file `registry.db` beside it.\n")
    assert misplaced("docs/x.md", text) == [
        "docs/x.md:1: registry/sql/history.py does not exist",
        "docs/x.md:1: registry.sql.history.put: registry.sql defines no history",
        ("docs/x.md:3: registry.ops.history.nothing_here: registry.ops.history defines no "
        "nothing_here"),
    ]
