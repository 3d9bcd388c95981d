"""What a scheduler installs is what these tests run: a wheel built from the files a clean clone
has (git's files, never the checkout's build leftovers), installed non-editable in a
fresh virtualenv, its `enginectl` run from a directory that is not the checkout.

An editable install hid a missing package once (`enginectl nightly --help` ended in
`ModuleNotFoundError: pipeline.nightly` from the wheel): nothing here may import the checkout.
The fresh venv gets its third-party packages from the test's own environment through a `.pth`
line (paths added that way are plain entries, so the editable install's own `.pth` finder in
that directory is never run), which keeps the test offline and fast.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT


def _tracked(*paths: str) -> list[str]:
    """The files a clean clone holds once the working tree is committed (tracked, or new and
    not ignored), under *paths*."""
    argv = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths]
    done = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True)
    return [name for name in done.stdout.split("\0") if name]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh venv it is installed in)."""
    top = tmp_path_factory.mktemp("wheel")
    source = top / "clone"
    for name in _tracked():  # what a clean clone holds, as the working tree has it now
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", str(source), "-w", str(top / "dist")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (top / "dist").glob("enginectl-*.whl")
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return wheel, venv


def test_the_wheel_holds_every_module_and_the_migrations(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {name for name in _tracked("pipeline", "registry") if name.endswith(".py")}
    assert modules - names == set()
    migrations = {f"registry/{name}" for name in _tracked("migrations")}
    assert {"registry/migrations/env.py", "registry/migrations/script.py.mako"} <= migrations
    assert migrations - names == set()
    assert {"pipeline/py.typed", "registry/py.typed"} <= names


def _enginectl(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = cwd / "home"
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home),
        "ENGINECTL_HOME": str(home / "enginectl"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8",
    }
    return subprocess.run([str(venv / "bin" / "enginectl"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_installed_wheel_runs_from_outside_the_checkout(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, venv = installed
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    recipe = str(recipes / "llama70b-h100.yaml")

    script = "import pipeline, registry; print(pipeline.__file__); print(registry.__file__)"
    located = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path,
                             capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin"})
    for path in located.stdout.split():
        assert path.startswith(str(venv)), path  # the wheel's modules, never the checkout's

    for args in (("--help",), ("nightly", "--help"), ("plan", recipe, "--json"),
                 ("db", "upgrade"), ("info",), ("ls",), ("nightly", "--dry-run", recipe)):
        done = _enginectl(venv, tmp_path, *args)
        output = done.stdout + done.stderr
        assert "Traceback" not in output, (args, output)
        assert "ModuleNotFoundError" not in output, (args, output)
        assert done.returncode == 0, (args, output)


def test_a_fresh_registry_migrates_from_the_installed_wheel(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, venv = installed
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    script = (
        "import sys, registry.sql.db as db, registry.sql.schema as schema\n"
        "assert db.__file__.startswith(sys.argv[1]), db.__file__\n"
        "db.open_registry(sys.argv[2]).close()\n"
        "print(schema.current(sys.argv[2]))\n"
    )
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script, str(venv), url],
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True, timeout=120)
    from registry.sql.schema import HEAD

    assert done.stdout.strip() == HEAD
