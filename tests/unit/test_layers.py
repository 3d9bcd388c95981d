"""The house's shape: few loose modules at the top of each package, and import contracts
(pyproject's [tool.importlinter]) that fail when a wrong import is planted, counting one
under `if TYPE_CHECKING` as well."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

LOOSE_MODULES_AT_MOST = 8


@pytest.mark.parametrize("package", ["registry", "pipeline"])
def test_few_loose_modules_at_the_top(package: str) -> None:
    """Modules sit in rooms (subpackages); a package's top keeps at most a few shared ones."""
    loose = sorted(p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= LOOSE_MODULES_AT_MOST, loose


PLANTED = {
    # path: (the line planted after the module's `from __future__` import, the contract)
    "registry/sql/rows.py": (
        "import registry.store.base",
        ("SQL is functions over a session: it imports neither the operations, the context "
        "nor the store")),
    "registry/store/ranges.py": (
        "import registry.sql.rows",
        ("the store moves bytes: it imports no SQL (nor the operations or the context above "
        "it)")),
    "registry/identity/layout.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import registry.sql.db",
        "the identity layer (what an artifact is) imports neither the store nor SQL"),
}


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}, capture_output=True,
        text=True, check=False, timeout=300)


def test_contracts_fail_on_a_planted_import(tmp_path: Path) -> None:
    for name in ("registry", "pipeline"):
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout[-3000:]
    for path, (line, _) in PLANTED.items():
        target = tmp_path / path
        text = target.read_text()
        future = "from __future__ import annotations\n"
        assert future in text, path
        target.write_text(text.replace(future, f"{future}{line}\n", 1))
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    out = " ".join(broken.stdout.split())
    for path, (_, contract) in PLANTED.items():
        assert f"{contract} BROKEN" in out, (path, broken.stdout[-3000:])
        module = path.removesuffix(".py").replace("/", ".")
        assert module in out, (path, broken.stdout[-3000:])
