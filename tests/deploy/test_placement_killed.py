"""A fill killed at any step is finished by the same command run again: the real CLI is
SIGKILLed by strace(1) on entry to one chosen system call (`-e inject=…:signal=KILL:when=N`:
the call never runs), for each rename, unlink and rmdir of the fill's last stage (of a run
of the same call, the first two: before any and half way), then run again without strace.
Into a real tmpfs mount (a Kubernetes volume: filled entry by entry behind the marker) and
into a plain directory (renamed in whole). After each run again the target holds the new
artifact, its marker is final, no staging directory is left, and nothing outside the target
changed. A kill while blobs download: test_force_volumes.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from registry.ops.marker import MARKER, SERVE_FILE
from tests.cli_forkserver import ENGINECTL
from tests.deploy.test_placement import mount_tmpfs, outside, unmount
from tests.deploy.user_cli import SERVER, run, snapshot

CALLS = "rename,unlink,unlinkat,rmdir"
"""What a placement does to the target, system call by system call."""
NAMES = sorted([MARKER, SERVE_FILE, "config.json", "rank0.engine", "rank1.engine",
                "tokenizer"])

# a laptop without strace skips them; CI (CI=true) fails instead, as for a missing server
pytestmark = pytest.mark.skipif(shutil.which("strace") is None and os.environ.get("CI") != "true",
                                reason="needs strace(1)")


def _traced(env: dict[str, str], argv: list[str], trace: Path) -> list[str]:
    """The calls (CALLS) the main thread of enginectl *argv* makes, in order."""
    done = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={CALLS}",
                           ENGINECTL, *argv], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    main = min(int(line.split(" ", 1)[0]) for line in lines)  # its threads come after it
    return [line.split(" ", 1)[1].strip() for line in lines
            if int(line.split(" ", 1)[0]) == main]


def _killed_at(env: dict[str, str], argv: list[str], call: tuple[str, int]) -> None:
    """enginectl *argv* SIGKILLed on entry to the *call* (a system call's name and which of
    its calls, 1-based: strace counts each call apart, per thread) of its main thread
    (worker threads of a cache-hit fill make none of CALLS)."""
    name, nth = call
    done = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={name}",
                           "-e", f"inject={name}:signal=KILL:when={nth}", ENGINECTL, *argv],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (-9, 137), (call, done.returncode, done.stderr)


def _steps(calls: list[str], target: Path) -> list[tuple[str, int]]:
    """The calls of the fill's last stage, from its first on the target's marker (or on the
    target itself) to the end (the staging directory removed), each as `_killed_at` takes
    it."""
    touching = [i for i, call in enumerate(calls)
                if re.search(rf'"{re.escape(str(target))}(/{re.escape(MARKER)})?"', call)]
    names = [call.split("(", 1)[0] for call in calls]
    kept = [i for i in range(touching[0], len(calls))  # of a run of one call, its first two:
            if i < touching[0] + 2 or names[i] != names[i - 2] or names[i] != names[i - 1]]
    return [(names[i], names[:i + 1].count(names[i])) for i in kept]  # before and half way


def _check_placed(target: Path, digest: str, *, by: str) -> None:
    names = sorted(p.name for p in target.iterdir() if p.name != "lost+found")
    expected = NAMES if by == "pull" else [n for n in NAMES if n != SERVE_FILE]
    assert names == expected
    marker = json.loads((target / MARKER).read_text())
    assert (marker["by"], marker["digest"], "filling" in marker) == (by, digest, False)


def _every_step(user: dict[str, str], tmp_path: Path, target: Path, verb: str,
                extra: list[str]) -> None:
    """Kill `verb X -o target` at each step of its last stage, then run it again; X and Y
    take turns, so each killed fill replaces the other."""
    digests = [user["ENGINE_A"], user["ENGINE_B"]]
    for digest in (*digests, digests[0]):  # both in the cache, as in every run below
        run(user, verb, digest, "-o", str(target), *extra, "--force")
    trace = tmp_path / "home" / "trace"
    calls = _traced(user, [verb, digests[1], "-o", str(target), *extra], trace)
    trace.unlink()
    steps = _steps(calls, target)
    before = outside(tmp_path, target)
    assert len(steps) >= 3, calls
    for turn, step in enumerate(steps):
        digest = digests[turn % 2]
        argv = [verb, digest, "-o", str(target), *extra]
        _killed_at(user, argv, step)
        run(user, *argv)
        _check_placed(target, digest, by=verb)
        assert not [p for p in (*target.iterdir(), *target.parent.iterdir())
                    if ".pull-" in p.name], step
        assert outside(tmp_path, target) == before, step


def test_a_pull_into_a_volume_killed_at_each_step_is_finished_by_the_next(
    user: dict[str, str], tmp_path: Path
) -> None:
    """The init container's case: killed after `serve.json` was removed, half the old files
    removed or half the new ones moved in, the next pull (a restart) finishes it."""
    volume = tmp_path / "volume"
    if not mount_tmpfs(volume):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        (volume / "lost+found").mkdir()
        _every_step(user, tmp_path, volume, "pull", ["--executable", SERVER])
        assert (volume / "lost+found").is_dir()
    finally:
        unmount(volume)


def test_a_fetch_into_a_volume_killed_at_each_step_is_finished_by_the_same_fetch(
    user: dict[str, str], tmp_path: Path
) -> None:
    volume = tmp_path / "volume"
    if not mount_tmpfs(volume):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        _every_step(user, tmp_path, volume, "fetch", ["--force"])
    finally:
        unmount(volume)


def test_a_pull_into_a_directory_killed_at_each_step_is_finished_by_the_next(
    user: dict[str, str], tmp_path: Path
) -> None:
    """Between setting the old content aside and renaming the new one in, the target is
    gone: the next pull puts the old content back, proves it, and replaces it."""
    _every_step(user, tmp_path, tmp_path / "models", "pull", ["--executable", SERVER])
    assert snapshot(tmp_path / "models")  # the last run left it filled


def test_a_pull_killed_with_a_warm_cache_half_replaced_is_finished_by_the_next(
    user: dict[str, str], tmp_path: Path
) -> None:
    """The init container's crash loop: a volume an earlier pull filled with a warm cache in
    `.warm` (grown by the runtime since; the marker written as such a pull writes it), a pull
    of another artifact killed after `serve.json` was removed, as it removes `.warm`. The
    next pull finishes it: the marker names `.warm` as a warm cache the store has."""
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.ops.publish import publish

    volume = tmp_path / "volume"
    if not mount_tmpfs(volume):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        a, b = user["ENGINE_A"], user["ENGINE_B"]
        files = tmp_path / "home" / "warm"
        (files / "trtllm").mkdir(parents=True)
        (files / "trtllm" / "autotuner.json").write_text('{"gemm:m=1": {}}')
        with Context(RegistryConfig.from_env(user)) as ctx:
            warm = publish(ctx, files, kind="warm-cache", status="ready",
                           labels={"model": "m", "artifact": a}).digest
        shutil.rmtree(files)
        extra = ["--executable", SERVER, "--no-warm"]
        run(user, "pull", b, "-o", str(volume), *extra)  # both in the cache
        run(user, "pull", a, "-o", str(volume), *extra)
        (volume / ".warm" / "trtllm").mkdir(parents=True)
        (volume / ".warm" / "trtllm" / "autotuner.json").write_text('{"grown": "by the runtime"}')
        marker = json.loads((volume / MARKER).read_text())
        marker["entries"].append(".warm")
        marker["writable"] = {".warm": warm}
        (volume / MARKER).write_text(json.dumps(marker))
        before = outside(tmp_path, volume)
        argv = ["pull", b, "-o", str(volume), *extra]
        _killed_at(user, argv, ("unlinkat", 1))  # serve.json gone, `.warm` half way out
        left = sorted(p.name for p in volume.iterdir())
        assert SERVE_FILE not in left
        assert ".warm" in left
        run(user, *argv)
        _check_placed(volume, b, by="pull")
        assert outside(tmp_path, volume) == before
    finally:
        unmount(volume)
