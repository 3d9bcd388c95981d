"""Settings as docs/configuration.md says (issue 21, point 9): a setting that cannot be used is one
line naming the variable and its value, exit 2, before anything is created — a relative
ENGINECTL_HOME used to exit 1 with "unexpected ValueError", a home or cache that is a file
passed `info` with exit 0, and a registry URL that is not one exited 4 as if the database
were down."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "llama70b-h100.yaml"


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "ENGINECTL_VLLM_PYTHON": "python3"}
    for name in ("ENGINECTL_WORK_DIR", "ENGINECTL_REGISTRY_URL", "ENGINECTL_STORE_URL"):
        env.pop(name, None)
    return {**env, **settings}


def refused(env: dict[str, str], cwd: Path, *args: str) -> str:
    """Run enginectl in *cwd*; it must exit 2 with one error line, which is returned."""
    done = run_cli([ENGINECTL, *args], env=env, cwd=cwd, timeout=120)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("enginectl: error: "), done.stderr
    assert "unexpected" not in done.stderr
    return done.stderr


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """An empty working directory: a relative setting would have made something here."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


@pytest.mark.parametrize("variable", ["ENGINECTL_HOME", "ENGINECTL_CACHE_DIR",
                                      "ENGINECTL_WORK_DIR"])
def test_a_relative_directory_setting_is_refused(tmp_path: Path, cwd: Path,
                                                 variable: str) -> None:
    env = _env(tmp_path, **{variable: "relative/place"})
    for args in (["info"], ["ls"], ["plan", str(RECIPE)]):
        if (variable, args[0]) in (("ENGINECTL_CACHE_DIR", "ls"), ("ENGINECTL_CACHE_DIR", "plan"),
                                   ("ENGINECTL_WORK_DIR", "ls")):
            continue  # a command that does not use the setting
        line = refused(env, cwd, *args)
        assert f"{variable}='relative/place' is not an absolute path" in line
    assert list(cwd.iterdir()) == []
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("variable", ["ENGINECTL_HOME", "ENGINECTL_CACHE_DIR"])
def test_info_refuses_a_home_or_cache_that_is_a_file(tmp_path: Path, cwd: Path,
                                                     variable: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = refused(_env(tmp_path, **{variable: str(blocker)}), cwd, "info")
    assert f"{blocker} cannot be a directory" in line
    assert f"point {variable} at a directory" in line
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("url", ["notaurl", "mysql://me:secret@db/enginectl",
                                 "/var/lib/enginectl/registry.db"])
def test_a_registry_url_that_is_not_one_is_bad_usage_not_an_outage(
    tmp_path: Path, cwd: Path, url: str
) -> None:
    env = _env(tmp_path, ENGINECTL_REGISTRY_URL=url)
    for args in (["info"], ["ls"], ["show", "m/prod"], ["fetch", "m/prod", "-o", "out"],
                 ["db", "upgrade"], ["plan", str(RECIPE)]):
        line = refused(env, cwd, *args)
        assert "ENGINECTL_REGISTRY_URL=" in line
        assert "is not a registry URL" in line
        assert "secret" not in line
        assert url.replace(":secret", ":***") in line
    assert list(cwd.iterdir()) == []
    assert not (tmp_path / "home").exists()
