"""Configuration enters at the top (docs/architecture.md, STYLE.md): the CLI, or the Python
API's caller, makes the Context and the Settings once and hands them down. No module of
`pipeline/` or `registry/` outside `pipeline/cli/` calls `Settings.from_env(` or `Context(`,
except the tops listed here, each with why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOPS = {
    # a Ray task's entry point is its node's top: the driver's Context and Settings do not
    # travel to the node, which reads its own environment (its Pythons, its registry URL)
    ("pipeline/executors/ray_tasks.py", "Settings.from_env"): "a Ray node's own settings",
    ("pipeline/executors/ray_tasks.py", "Context"): "a Ray node's own Context",
    # `enginectl info` reports the configuration itself, from the env mapping it is handed
    ("pipeline/info.py", "Settings.from_env"): "info reads the environment it reports",
    # pull and serve are a deploy node's top and the documented Python API hands them a
    # Context alone: the node's own Pythons are read for its toolchain fingerprint
    ("pipeline/deploy/node.py", "Settings.from_env"): "a deploy node's own toolchain",
}


def _calls(path: Path) -> list[tuple[str, int]]:
    """`Settings.from_env(...)` and `Context(...)` calls in *path*: (name, line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Context":
            found.append(("Context", node.lineno))
        elif (isinstance(func, ast.Attribute) and func.attr == "from_env"
              and isinstance(func.value, ast.Name) and func.value.id == "Settings"):
            found.append(("Settings.from_env", node.lineno))
    return found


def test_settings_and_context_are_made_only_at_the_top() -> None:
    misplaced = []
    seen = set()
    for package in ("pipeline", "registry"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith("pipeline/cli/"):
                continue
            for call, line in _calls(path):
                if (name, call) in TOPS:
                    seen.add((name, call))
                else:
                    misplaced.append(f"{name}:{line}: {call}(...)")
    assert misplaced == [], "configuration made midway; take it as a parameter instead"
    assert seen == set(TOPS), f"a listed top no longer makes it: {set(TOPS) - seen}"


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from x import Context, Settings\n"
                       "def f():\n    return Settings.from_env(), Context(readonly=True)\n")
    assert _calls(planted) == [("Settings.from_env", 3), ("Context", 3)]
