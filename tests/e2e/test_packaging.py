"""The wheel a deploy node installs must carry the migrations: without them the first write
to a registry (import, tag, build) fails with "enginectl's migrations are missing"."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_the_migrations_and_a_fresh_registry_migrates_from_it(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"  # built from a copy: a build leaves build/ and egg-info behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("pipeline", "registry", "migrations"):
        shutil.copytree(REPO / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", str(source), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("enginectl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    versions = sorted(p.name for p in (REPO / "migrations" / "versions").glob("*.py"))
    assert {"registry/migrations/env.py", "registry/migrations/script.py.mako"} <= names
    assert {f"registry/migrations/versions/{v}" for v in versions} <= names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    script = (
        "import sys, registry.db as db\n"
        "assert db.__file__.startswith(sys.argv[1]), db.__file__\n"
        "db.open_registry(sys.argv[2]).close()\n"
        "print(db.current(sys.argv[2]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(target), url], cwd=tmp_path,
                          env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True, timeout=120)
    from registry.db import HEAD

    assert done.stdout.strip() == HEAD
