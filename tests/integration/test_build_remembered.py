"""A no-op build from the plan a build remembered (`pipeline.planning.plan_cache`) says byte
for byte what a build that plans says, without pydantic; `plan` and a dry run remember
nothing; a corrupt file is planned again; a driver bump still rebuilds; a build that must plan
probes this machine once; vLLM's probe is remembered until what its Python has installed
changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.planning.file_stats import RACY_S
from tests.helpers import FAKES, fake_gpu
from tests.integration.builds import build, write_recipe

# `enginectl ARGS` as the console script runs it; prints its exit code and which heavy
# modules it had loaded on its last line of stderr
RUN_AND_LIST = (
    "import json, sys\nfrom pipeline.cli import entry\nsys.argv[0] = 'enginectl'\ncode = 0\n"
    "try:\n    entry()\nexcept SystemExit as exc:\n    code = exc.code\n"
    "heavy = ('pydantic', 'sqlalchemy', 'alembic', 'yaml')\n"
    "sys.stdout.flush()\n"
    "print(json.dumps({'code': code, 'modules': [m for m in heavy if m in sys.modules]}),"
    " file=sys.stderr)\n"
)


def enginectl(env: dict[str, str], *args: str) -> tuple[str, str, dict[str, object]]:
    """(stdout, stderr but its last line, what that line says)."""
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST, *args], env=env, text=True,
                          capture_output=True, timeout=600, check=False)
    err, _, last = done.stderr.rstrip("\n").rpartition("\n")
    told = json.loads(last)
    assert told["code"] in (0, None), (done.stdout, done.stderr)
    return done.stdout, err, told


def plans(env: dict[str, str]) -> Path:
    return Path(env["ENGINECTL_HOME"]) / "work" / ".cache" / "plans"


def settled(tmp_path: Path) -> Path:
    """The toy recipe, its model older than RACY_S (a plan of a model that changed a
    moment ago is not remembered)."""
    recipe = write_recipe(tmp_path)
    time.sleep(RACY_S + 0.1)  # not a timing assertion: the racy rule's own window
    return recipe


def test_a_remembered_noop_says_what_planning_says(env: dict[str, str], tmp_path: Path) -> None:
    recipe = settled(tmp_path)
    build(env, recipe, "--json")
    assert len(list(plans(env).iterdir())) == 1
    for args in (["-q", "build", str(recipe), "--json"], ["-v", "build", str(recipe)]):
        remembered = enginectl(env, *args)
        assert remembered[2]["modules"] == []  # no pydantic, no YAML, no ORM
        for entry in plans(env).iterdir():
            entry.unlink()
        planned = enginectl(env, *args)
        assert "pydantic" in planned[2]["modules"]
        assert remembered[:2] == planned[:2]  # stdout and stderr, byte for byte
        assert len(list(plans(env).iterdir())) == 1  # remembered again
    assert "4 artifacts await a smoke run" in remembered[0]


def test_plan_and_a_dry_run_remember_nothing(env: dict[str, str], tmp_path: Path) -> None:
    recipe = settled(tmp_path)
    enginectl(env, "plan", str(recipe))
    enginectl(env, "build", str(recipe), "--dry-run")
    assert not (Path(env["ENGINECTL_HOME"]) / "work" / ".cache").exists()


@pytest.mark.parametrize("content", [b"", b"\x00garbage", b'{"schema": 1}'])
def test_a_corrupt_remembered_plan_is_planned_again(env: dict[str, str], tmp_path: Path,
                                                    content: bytes) -> None:
    recipe = settled(tmp_path)
    build(env, recipe, "--json")
    before = enginectl(env, "-q", "build", str(recipe), "--json")
    (entry,) = plans(env).iterdir()
    entry.write_bytes(content)
    again = enginectl(env, "-q", "build", str(recipe), "--json")
    assert "pydantic" in again[2]["modules"]
    assert again[:2] == before[:2]
    assert json.loads(entry.read_bytes())["schema"] >= 1  # written whole again


def test_a_driver_bump_rebuilds_what_a_remembered_plan_reused(env: dict[str, str],
                                                             tmp_path: Path) -> None:
    recipe = settled(tmp_path)
    gpu = {**env, **fake_gpu(tmp_path / "gpu", driver="570.124.06")}
    first = json.loads(build(gpu, recipe, "--json", "--only", "*/small/trtllm").stdout)
    assert first["built"] >= 3
    noop = enginectl(gpu, "-q", "build", str(recipe), "--json", "--only", "*/small/trtllm")
    assert noop[2]["modules"] == []
    assert json.loads(noop[0])["built"] == 0
    fake_gpu(tmp_path / "gpu", driver="575.57.08")
    bumped = json.loads(build(gpu, recipe, "--json", "--only", "*/small/trtllm").stdout)
    rebuilt = {s["stage"] for s in bumped["stages"] if s["status"] == "built"}
    assert "build" in rebuilt  # the engine is keyed with the driver


def _logging_nvidia_smi(directory: Path, log: Path) -> Path:
    """A directory whose `nvidia-smi` writes its arguments to *log*, then runs the stand-in."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n'
                       f'exec "{FAKES / "bin" / "nvidia-smi"}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    return directory


def test_a_build_that_must_plan_takes_the_probe_its_first_try_took(
        env: dict[str, str], tmp_path: Path) -> None:
    """A build first tries the remembered no-op, which probes this machine; when it must plan
    after all, it takes that probe instead of asking nvidia-smi and both Pythons again."""
    recipe = settled(tmp_path)
    log = tmp_path / "nvidia-smi.log"
    logged = {**env, "PATH": f"{_logging_nvidia_smi(tmp_path / 'bin', log)}{os.pathsep}"
                             f"{env['PATH']}"}
    build(logged, recipe, "--json")

    def probes_by_a_noop() -> int:
        log.write_text("", encoding="utf-8")
        out, _, _ = enginectl(logged, "-q", "build", str(recipe), "--json")
        assert json.loads(out)["built"] == 0
        return sum("--query-gpu=name,driver_version" in line
                   for line in log.read_text(encoding="utf-8").splitlines())

    remembered = probes_by_a_noop()
    for entry in plans(env).iterdir():
        entry.unlink()
    planned = probes_by_a_noop()  # the first try misses: the build plans from the recipe
    assert remembered >= 1
    assert planned == remembered


def _fake_vllm_python(root: Path, version: str) -> Path:
    """A venv whose site-packages has a `vllm` package of *version* (metadata alone)."""
    if not (root / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                       timeout=120)
    (site,) = (root / "lib").glob("python3*/site-packages")
    for old in site.glob("vllm-*.dist-info"):
        for item in old.iterdir():
            item.unlink()
        old.rmdir()
    (site / "vllm").mkdir(exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "RECORD").write_text("vllm/__init__.py,,\n")
    return root / "bin" / "python"


PROBE = ("import sys\nfrom pathlib import Path\n"
         "from pipeline.host.runtimes import remembered_vllm_in\n"
         "print(remembered_vllm_in(sys.argv[1], Path(sys.argv[2])).version)\n")


def test_vllms_probe_is_remembered_until_an_upgrade(tmp_path: Path) -> None:
    python = _fake_vllm_python(tmp_path / "venv", "0.1.0")
    time.sleep(RACY_S + 0.1)
    memo = tmp_path / "memo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    def version() -> str:
        return subprocess.run([sys.executable, "-c", PROBE, str(python), str(memo)], env=env,
                              text=True, capture_output=True, check=True,
                              timeout=120).stdout.strip()

    assert version() == "0.1.0"
    assert len(list((memo / "vllm").iterdir())) == 1  # remembered
    assert version() == "0.1.0"
    _fake_vllm_python(tmp_path / "venv", "0.2.0")  # an upgrade, as pip does it
    assert version() == "0.2.0"
