"""What each command does not use, it does not import: SQLAlchemy's ORM, boto3 and botocore,
pydantic, torch and Ray stay off the paths of the everyday commands, which is most of what
keeps each one's fixed cost low (bench/command_cost.py measures the time; this checks the
imports, never a time). Each command runs as the console script runs it, in a fresh Python,
against a registry of its own (SQLite, a `file://` store) holding one tiny artifact, and then
lists which of those modules it had loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

HEAVY = ("sqlalchemy", "sqlalchemy.orm", "alembic", "boto3", "botocore", "pydantic", "torch",
         "ray")

# the console script's function, then which of HEAVY it had loaded (its exit code too)
RUN_AND_LIST_MODULES = (
    "import json, sys\nfrom pipeline.cli import entry\n"
    "out = sys.argv.pop(1)\nsys.argv[0] = 'enginectl'\ncode = 0\n"
    "try:\n    entry()\nexcept SystemExit as exc:\n    code = exc.code\n"
    f"heavy = {HEAVY!r}\n"
    "with open(out, 'w') as sink:\n"
    "    json.dump({'code': code, 'modules': sorted(m for m in heavy if m in sys.modules)},"
    " sink)\n"
)

ON_THE_DRIVER: frozenset[str] = frozenset()
"""Commands that read the registry on the database driver alone: none of HEAVY."""
RECIPE = frozenset({"pydantic"})
"""`plan` validates the recipe with pydantic's models, and only that."""
CORE = frozenset({"sqlalchemy"})
"""Commands that write through SQLAlchemy Core without its ORM (`import`'s publish:
`registry.sql.tables` on `Registry.connection`)."""

COMMANDS: dict[str, tuple[list[str], frozenset[str]]] = {
    "--help": (["--help"], ON_THE_DRIVER),
    "ls": (["ls"], ON_THE_DRIVER),
    "ls --json": (["ls", "--json", "--status", "ready"], ON_THE_DRIVER),
    "info": (["info"], ON_THE_DRIVER),
    "fetch": (["fetch", "DIGEST", "-o", "OUT"], ON_THE_DRIVER),
    "pull": (["pull", "DIGEST", "-o", "OUT", "--executable", sys.executable], ON_THE_DRIVER),
    "plan": (["plan", str(ROOT / "recipes" / "llama70b-h100.yaml")], RECIPE),
    "show": (["show", "DIGEST"], ON_THE_DRIVER),
    "show --json": (["show", "DIGEST", "--json"], ON_THE_DRIVER),
    "resolve": (["resolve", "--model", "m", "--gpu", "cpu", "--allow-unproven"], ON_THE_DRIVER),
    "resolve --explain": (["resolve", "--model", "m", "--gpu", "cpu", "--explain",
                           "--allow-unproven", "--json"],
                          ON_THE_DRIVER),
    "import": (["import", "NEW", "--kind", "vllm", "--model", "m"], CORE),
}


def _tiny(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"tag": tag}))
    (path / "notes.txt").write_text(tag)
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], str, Path]:
    """(environment, digest of a ready artifact fetched once, a folder for new paths)."""
    tmp = tmp_path_factory.mktemp("commands")
    (tmp / "user").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env.update(HOME=str(tmp / "user"), ENGINECTL_HOME=str(tmp / "home"),
               ENGINECTL_CACHE_DIR=str(tmp / "cache"), HF_HUB_OFFLINE="1")
    enginectl = str(Path(sys.executable).parent / "enginectl")
    done = subprocess.run([enginectl, "-q", "import", str(_tiny(tmp / "first", "first")),
                           "--kind", "vllm", "--model", "m", "--ready", "--json"],
                          env=env, capture_output=True, text=True, check=True, timeout=120)
    digest = json.loads(done.stdout)["digest"]
    subprocess.run([enginectl, "-q", "fetch", digest, "-o", str(tmp / "warm")], env=env,
                   capture_output=True, check=True, timeout=120)
    return env, digest, tmp


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_imports_only_what_it_uses(
        user: tuple[dict[str, str], str, Path], name: str) -> None:
    env, digest, tmp = user
    argv, allowed = COMMANDS[name]
    here = tmp / name.replace(" ", "_").strip("-")
    argv = [{"DIGEST": digest, "OUT": str(here / "out")}.get(a, a) for a in argv]
    if "NEW" in argv:
        argv[argv.index("NEW")] = str(_tiny(here / "new", name))
    listing = tmp / f"{here.name}.json"
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES, str(listing), "-q",
                           *argv], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    found = json.loads(listing.read_text())
    assert found["code"] in (0, None), (done.stdout, done.stderr)
    assert set(found["modules"]) <= allowed, f"{name} imported {found['modules']}"


def test_a_noop_build_imports_none_of_them(tmp_path: Path) -> None:
    """`build` with nothing to do takes the plan the build before it remembered
    (`pipeline.planning.plan_cache`) and reads the registry on the driver: no pydantic."""
    import time

    from pipeline.planning.file_stats import RACY_S
    from tests.helpers import builder_env
    from tests.integration.builds import write_recipe

    recipe = write_recipe(tmp_path)
    time.sleep(RACY_S + 0.1)  # a model written a moment ago is too new to remember a plan of
    env = builder_env(tmp_path, f"sqlite:///{tmp_path / 'home' / 'registry.db'}")
    enginectl = str(Path(sys.executable).parent / "enginectl")
    subprocess.run([enginectl, "-q", "build", str(recipe), "--json"], env=env,
                   capture_output=True, check=True, timeout=600)
    listing = tmp_path / "build.json"
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES, str(listing), "-q",
                           "build", str(recipe), "--json"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    found = json.loads(listing.read_text())
    assert found["code"] in (0, None), (done.stdout, done.stderr)
    assert json.loads(done.stdout)["built"] == 0
    assert set(found["modules"]) <= ON_THE_DRIVER, f"a no-op build imported {found['modules']}"
