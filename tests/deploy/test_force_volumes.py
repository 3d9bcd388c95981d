"""What a pull or fetch killed while it filled a mount point (a Kubernetes volume: a tmpfs in a
user and mount namespace) leaves, and that the next one clears it and never blocks on it
(issue 21, point 9). The rest of what `-o DIR` may replace: test_force_guard.py."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from registry.identity.digest import digest_file
from registry.identity.layout import blob_name
from registry.ops.marker import MARKER, SERVE_FILE
from tests.deploy.user_cli import ENGINECTL, SERVER


def _in_namespace(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """*script* run by sh as root of a user and mount namespace (a tmpfs stands in for a
    volume); skipped where user namespaces are not allowed."""
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0 and done.stderr.startswith("unshare:"):
        pytest.skip(f"user namespaces are not allowed here: {done.stderr.strip()}")
    return done


def _killed_then_again(tmp_path: Path, command: str, *, again: str) -> str:
    """The script that runs *command* (its `{volume}`: a fresh tmpfs) in a new PID namespace,
    kills it while it fills the volume (a blob of the store is a FIFO, so its read blocks until
    the kill), prints what it left, and runs it again (*again* appended) the same way: both
    runs have PID 1, so the second finds the first's staging directory under its own PID."""
    volume = tmp_path / "volume"
    volume.mkdir()
    weights = tmp_path / "engine-A" / "rank0.engine"
    blob = tmp_path / "home" / "store" / blob_name(digest_file(weights).xxh3)
    v, b = shlex.quote(str(volume)), shlex.quote(str(blob))
    run = f"unshare --pid --fork {command.format(volume=v)}"
    return f"""
        set -e
        mount -t tmpfs none {v}
        mv {b} {b}.real && mkfifo {b}
        {run} & U=$!
        i=0
        until ls -A {v} | grep -q '^[.]volume[.]pull-'; do
            i=$((i + 1)); [ $i -lt 1200 ] || exit 9; sleep 0.1
        done
        C=$(cat /proc/$U/task/$U/children)
        kill -9 $C
        wait $U || true
        echo "left: $(ls -A {v} | tr '\\n' ' ')"
        rm {b} && mv {b}.real {b}
        {run} {again}
        ls -A {v}
    """


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_pull_killed_while_it_filled_a_volume_is_cleared_by_the_next_one(
    user: dict[str, str], tmp_path: Path
) -> None:
    """An init container killed while it pulls into its volume is restarted: its next pull
    runs as the same PID (1, in a fresh PID namespace) and finds the killed one's staging
    directory inside the volume. The killed pull is stopped for certain by a blob of the
    store that is a FIFO: its read blocks until the kill."""
    command = f"{ENGINECTL} pull {user['ENGINE_A']} -o {{volume}} --executable {SERVER}"
    script = _killed_then_again(tmp_path, command, again="--json")
    done = _in_namespace(script, user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("left: .volume.pull-")  # what the kill left
    assert json.loads(lines[1])["digest"] == user["ENGINE_A"]
    assert sorted(lines[2:]) == sorted([MARKER, SERVE_FILE, "config.json", "rank0.engine",
                                        "rank1.engine", "tokenizer"])


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_fill_of_a_volume_stopped_half_way_does_not_block_the_next_pull(
    user: dict[str, str], tmp_path: Path
) -> None:
    """A volume (with the `lost+found` of its file system) is pulled into; a second pull
    stops half way through moving the new files in (stood in for by a folder of the old
    content that is itself a mount point, so removing it fails, as a kill would stop it):
    `serve.json` is gone and only part of the old files. The next pull into it goes ahead,
    and `lost+found` is left where it is."""
    volume = tmp_path / "volume"
    volume.mkdir()
    v = shlex.quote(str(volume))
    pull = f"{ENGINECTL} pull --executable {SERVER} -o {v}"
    script = f"""
        set -e
        mount -t tmpfs none {v}
        mkdir {v}/lost+found
        {pull} {user['ENGINE_A']} >/dev/null
        mount -t tmpfs none {v}/tokenizer
        if {pull} {user['ENGINE_B']} 2>/dev/null; then exit 8; fi
        echo "left: $(ls -A {v} | tr '\\n' ' ')"
        umount {v}/tokenizer
        {pull} {user['ENGINE_B']} --json
        ls -A {v}
    """
    done = _in_namespace(script, user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    assert SERVE_FILE not in lines[0].split()  # the stopped pull left no serve.json
    assert json.loads(lines[1])["digest"] == user["ENGINE_B"]
    assert sorted(lines[2:]) == sorted([MARKER, SERVE_FILE, "config.json", "lost+found",
                                         "rank0.engine", "rank1.engine", "tokenizer"])


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_fetch_force_into_a_volume_replaces_what_fetch_or_pull_put_there(
    user: dict[str, str], tmp_path: Path
) -> None:
    """A volume (a mount point, with its `lost+found`) cannot be renamed over: `fetch -o`
    fills it in place, and `fetch --force` replaces an earlier fetch or pull in it."""
    volume = tmp_path / "volume"
    volume.mkdir()
    v = shlex.quote(str(volume))
    fetch = f"{ENGINECTL} fetch -o {v}"
    script = f"""
        set -e
        mount -t tmpfs none {v}
        mkdir {v}/lost+found
        {fetch} {user['ENGINE_A']} >/dev/null
        echo "A: $(cat {v}/{MARKER} | tr -d '\\n ')"
        {fetch} {user['ENGINE_B']} --force >/dev/null
        echo "B: $(cat {v}/{MARKER} | tr -d '\\n ')"
        {ENGINECTL} pull {user['ENGINE_A']} -o {v} --force --executable {SERVER} >/dev/null
        {fetch} {user['ENGINE_B']} --force >/dev/null
        mountpoint -q {v}
        ls -A {v}
    """
    done = _in_namespace(script, user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    for line, digest in zip(lines[:2], (user["ENGINE_A"], user["ENGINE_B"]), strict=True):
        marker = json.loads(line.split(": ", 1)[1])
        assert (marker["by"], marker["digest"], "filling" in marker) == ("fetch", digest, False)
    assert sorted(lines[2:]) == sorted([MARKER, "config.json", "lost+found", "rank0.engine",
                                        "rank1.engine", "tokenizer"])  # no serve.json: the


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_fetch_killed_while_it_filled_a_volume_is_cleared_by_the_next_one(
    user: dict[str, str], tmp_path: Path
) -> None:
    """As for pull: the killed fetch (stopped for certain by a blob of the store that is a
    FIFO) leaves its staging directory in the volume; the next fetch, with the same PID in a
    fresh PID namespace, clears it and fills the volume."""
    command = f"{ENGINECTL} fetch {user['ENGINE_A']} -o {{volume}}"
    script = _killed_then_again(tmp_path, command, again="--json >/dev/null")
    done = _in_namespace(script, user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("left: .volume.pull-")  # what the kill left
    assert sorted(lines[1:]) == sorted([MARKER, "config.json", "rank0.engine", "rank1.engine",
                                        "tokenizer"])
