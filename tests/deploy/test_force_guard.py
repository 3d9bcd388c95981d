"""What `pull -o DIR` and `fetch -o DIR` may replace (issue 21, points 2, 4 and 9), as a
user types it: `--force` replaces only a directory pull or fetch filled, or an empty one;
the store, the cache, enginectl's home, $HOME, the working directory and every folder above
them are refused in one line, exit 2, nothing touched; `-o` is a path, never a template; a
name too long for the file system is one line, exit 2. A pull killed while it filled a
mount point (a Kubernetes volume) does not block the next one. `serve` re-proves the files
of its serving directory as the fetch cache proves its entries. On the file store and
SQLite: what is tested is the target, not the store."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pipeline.deploy.guard import MARKER
from pipeline.deploy.pull import select
from pipeline.deploy.runtime import find_runtime
from pipeline.deploy.serve import prepare, serving_dir
from pipeline.deploy.target import SERVE_FILE
from registry.config import RegistryConfig
from registry.context import Context
from registry.digest import digest_file, sha256_of
from registry.errors import ManifestError
from registry.layout import blob_key
from registry.manifest import check_path
from tests.helpers import stderr_of
from tests.integration.test_registry_verbs import make_engine

ENGINECTL = str(Path(sys.executable).parent / "enginectl")
SERVER = sys.executable  # stands in for trtllm-serve: pull writes it, never runs it
LONG = "x" * 300


def run(env: dict[str, str], *args: str, code: int = 0,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run enginectl; a failure is one error line (after the note naming the store)."""
    done = subprocess.run([ENGINECTL, *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False, cwd=cwd)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if code:
        error = stderr_of(done)
        assert error.count("\n") == 1, done.stderr
        assert error.startswith("enginectl: error: "), done.stderr
    return done


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under *root* with its bytes (None for folders): what "untouched" means."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not p.name.endswith(("-wal", "-shm"))}


@pytest.fixture
def user(tmp_path: Path) -> dict[str, str]:
    """A user with two ready engines on the file store; its environment, with the digests
    as ENGINE_A and ENGINE_B (not read by enginectl)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINECTL_")}
    env.update(ENGINECTL_HOME=str(tmp_path / "home"), ENGINECTL_CACHE_DIR=str(tmp_path / "cache"),
               HOME=str(tmp_path / "user"), HF_HUB_OFFLINE="1")
    (tmp_path / "user").mkdir()
    (tmp_path / "work" / "sub").mkdir(parents=True)
    for name, seed in (("A", 0), ("B", 1)):
        engine = make_engine(tmp_path / f"engine-{name}", seed=seed)
        done = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
                   "--gpu", "h100", "--ready", "--json")
        env[f"ENGINE_{name}"] = json.loads(done.stdout)["digest"]
    return env


@pytest.mark.parametrize("verb", ["pull", "fetch"])
@pytest.mark.parametrize("target", ["STORE", "STORE/blobs", "HOME", "HOME/models", "CACHE",
                                    "CACHE/models", "~", ".", "..", "sub/.."])
def test_force_never_replaces_the_store_the_cache_a_home_or_the_working_directory(
    user: dict[str, str], tmp_path: Path, verb: str, target: str
) -> None:
    places = {"STORE": str(tmp_path / "home" / "store"), "HOME": str(tmp_path / "home"),
              "CACHE": str(tmp_path / "cache"), "~": str(tmp_path / "user")}
    for name, value in places.items():
        target = target.replace(name, value, 1) if target.startswith(name) else target
    run(user, "fetch", user["ENGINE_A"], "-o", str(tmp_path / "warm"))  # the cache has files
    (tmp_path / "user" / "notes.txt").write_text("mine")
    (tmp_path / "work" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    extra = ["--executable", SERVER] if verb == "pull" else []
    refused = run(user, verb, user["ENGINE_A"], "-o", target, "--force", *extra, code=2,
                  cwd=tmp_path / "work")
    assert f"refusing to {verb} into" in refused.stderr
    after = snapshot(tmp_path)
    assert {k for k in set(before) | set(after) if before.get(k) != after.get(k)} == set()


def test_force_replaces_only_what_pull_or_fetch_filled_or_an_empty_directory(
    user: dict[str, str], tmp_path: Path
) -> None:
    a, b = user["ENGINE_A"], user["ENGINE_B"]
    serve = ["--executable", SERVER]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for verb, extra in (("pull", serve), ("fetch", [])):
        for force in ([], ["--force"]):
            refused = run(user, verb, a, "-o", str(mine), *force, *extra, code=2)
            assert "holds no earlier" in refused.stderr
            assert "--force replaces only a directory pull or fetch filled" in refused.stderr
    assert snapshot(mine) == {"notes.txt": b"keep me"}

    empty = tmp_path / "empty"
    empty.mkdir()
    run(user, "pull", a, "-o", str(empty), *serve)
    assert json.loads((empty / MARKER).read_text())["by"] == "pull"
    run(user, "pull", b, "-o", str(empty), *serve)  # an earlier pull: replaced
    assert json.loads((empty / SERVE_FILE).read_text())["digest"] == b

    fetched = tmp_path / "fetched"
    run(user, "fetch", a, "-o", str(fetched))
    marker = json.loads((fetched / MARKER).read_text())
    assert (marker["by"], marker["digest"]) == ("fetch", a)
    assert sorted(marker["entries"]) == ["config.json", "rank0.engine", "rank1.engine",
                                         "tokenizer"]
    again = run(user, "import", str(fetched), "--kind", "trtllm-engine", "--model", "m",
                "--gpu", "h100", "--json")  # the marker is not the artifact's: same digest
    assert json.loads(again.stdout)["digest"] == a
    refused = run(user, "fetch", b, "-o", str(fetched), code=2)
    assert "pass --force to replace it" in refused.stderr
    refused = run(user, "pull", b, "-o", str(fetched), *serve, code=2)
    assert "pass --force to replace it" in refused.stderr
    run(user, "fetch", b, "-o", str(fetched), "--force")
    run(user, "pull", a, "-o", str(fetched), "--force", *serve)
    assert json.loads((fetched / SERVE_FILE).read_text())["digest"] == a

    (fetched / "notes.txt").write_text("added by hand")  # enginectl did not write this one
    before = snapshot(fetched)
    for verb, extra in (("pull", serve), ("fetch", [])):
        refused = run(user, verb, b, "-o", str(fetched), "--force", *extra, code=2)
        assert "'notes.txt' in it was not written by enginectl" in refused.stderr
    assert snapshot(fetched) == before


def test_output_is_a_path_never_a_template(user: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "models-{port}-{model_dir}"
    done = run(user, "pull", user["ENGINE_A"], "-o", str(dest), "--port", "9005",
               "--executable", SERVER, "--json")
    pulled = json.loads(done.stdout)
    assert pulled["directory"] == str(dest)
    argv = pulled["argv"]
    assert argv[1] == str(dest)  # trtllm-serve's model directory, braces and all
    assert argv[argv.index("--tokenizer") + 1] == str(dest)
    assert argv[argv.index("--port") + 1] == "9005"
    assert json.loads((dest / SERVE_FILE).read_text())["model_dir"] == str(dest)
    assert shlex.split(pulled["command"]) == argv


def test_a_name_too_long_for_the_file_system_is_one_line_and_touches_nothing(
    user: dict[str, str], tmp_path: Path
) -> None:
    before = snapshot(tmp_path)
    for args in (("pull", user["ENGINE_A"], "--executable", SERVER), ("fetch", user["ENGINE_A"])):
        refused = run(user, *args, "-o", str(tmp_path / LONG / "model"), code=2)
        assert "a name of 300 bytes" in refused.stderr
        refused = run(user, *args, "-o", str(tmp_path / ("y" * 250)), code=2)
        assert "a name of 250 bytes" in refused.stderr  # no room for the staging name
    refused = run(user, "import", str(tmp_path / LONG), "--kind", "trtllm-engine", "--model",
                  "m", "--gpu", "h100", code=2)
    assert "a name of 300 bytes" in refused.stderr
    assert snapshot(tmp_path) == before


def test_a_manifest_with_a_name_too_long_is_a_bad_manifest(
    user: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(ManifestError, match="has a name of 300 bytes"):
        check_path(f"tokenizer/{LONG}")
    check_path("é" * 127)  # 254 bytes of UTF-8: a name a file system takes
    with pytest.raises(ManifestError, match="has a name of 256 bytes"):
        check_path("é" * 128)
    # a store that holds one (written by hand: no enginectl writes it): fetch says so
    store = tmp_path / "home" / "store"
    honest = json.loads(next((store / "manifests").rglob("*.json")).read_text())
    honest["files"][0]["path"] = LONG
    data = json.dumps(honest, sort_keys=True, separators=(",", ":")).encode()
    digest = sha256_of(data)
    path = store / "manifests" / "sha256" / f"{digest.hex}.json"
    path.write_bytes(data)
    refused = run(user, "fetch", str(digest), "-o", str(tmp_path / "out"), code=4)
    assert "has a name of 300 bytes" in refused.stderr
    assert not (tmp_path / "out").exists()


NAME = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\:"),
               min_size=1, max_size=140)


@given(st.lists(NAME, min_size=1, max_size=3).map(lambda parts: [p * 2 for p in parts]))
def test_a_manifest_path_is_refused_exactly_when_a_name_is_longer_than_255_bytes(
    parts: list[str]
) -> None:
    assume(all(part not in (".", "..") for part in parts))
    path = "/".join(parts)
    if any(len(part.encode("utf-8")) > 255 for part in parts):
        with pytest.raises(ManifestError, match="has a name of"):
            check_path(path)
    else:
        assert check_path(path) == path


def test_a_directory_where_serve_keeps_its_lock_file_is_one_line(
    user: dict[str, str], tmp_path: Path
) -> None:
    digest = user["ENGINE_A"]
    lock = tmp_path / "home" / "serving" / f".{digest.removeprefix('sha256:')[:16]}.lock"
    lock.mkdir(parents=True)
    refused = run(user, "serve", digest, "--executable", SERVER, code=2)
    assert f"serve keeps its lock file at {lock}" in refused.stderr
    assert "it is a directory" in refused.stderr


def test_serve_re_proves_its_files_as_the_fetch_cache_does(
    user: dict[str, str], tmp_path: Path
) -> None:
    config = RegistryConfig.from_env(user)
    with Context(config) as ctx:
        selection = select(ctx, user["ENGINE_A"])
        runtime = find_runtime(selection.template.runtime, executable=SERVER)
        first = prepare(ctx, selection, runtime, host="127.0.0.1", port=8000)
        directory = serving_dir(ctx, user["ENGINE_A"])
        assert first.directory == directory
        rank0 = directory / "rank0.engine"
        honest = rank0.read_bytes()
        inode = rank0.stat().st_ino

        again = prepare(ctx, selection, runtime, host="127.0.0.1", port=8001)
        assert rank0.stat().st_ino == inode  # unchanged: reused, nothing pulled
        assert again.downloaded_bytes == 0

        rank0.chmod(0o644)  # edited in place, same size (it is the cache's entry too)
        with rank0.open("r+b") as handle:
            handle.write(b"\x00" * 16)
        assert rank0.stat().st_size == len(honest)
        prepare(ctx, selection, runtime, host="127.0.0.1", port=8000)
        assert rank0.read_bytes() == honest

        rank0.unlink()  # replaced by a copy of the same size with other bytes
        rank0.write_bytes(bytes(reversed(honest)))
        prepare(ctx, selection, runtime, host="127.0.0.1", port=8000)
        assert rank0.read_bytes() == honest

        shutil.copyfile(rank0, tmp_path / "copy")  # a copy of the right bytes is kept
        rank0.unlink()
        shutil.copyfile(tmp_path / "copy", rank0)
        inode = rank0.stat().st_ino
        prepare(ctx, selection, runtime, host="127.0.0.1", port=8000)
        assert rank0.stat().st_ino == inode


def _in_namespace(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """*script* run by sh as root of a user and mount namespace (a tmpfs stands in for a
    volume); skipped where user namespaces are not allowed."""
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0 and done.stderr.startswith("unshare:"):
        pytest.skip(f"user namespaces are not allowed here: {done.stderr.strip()}")
    return done


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_pull_killed_while_it_filled_a_volume_is_cleared_by_the_next_one(
    user: dict[str, str], tmp_path: Path
) -> None:
    """An init container killed while it pulls into its volume is restarted: its next pull
    runs as the same PID (1, in a fresh PID namespace) and finds the killed one's staging
    directory inside the volume. The killed pull is stopped for certain by a blob of the
    store that is a FIFO: its read blocks until the kill."""
    volume = tmp_path / "volume"
    volume.mkdir()
    weights = tmp_path / "engine-A" / "rank0.engine"
    blob = tmp_path / "home" / "store" / blob_key(digest_file(weights).xxh3)
    v, b = shlex.quote(str(volume)), shlex.quote(str(blob))
    pull = f"unshare --pid --fork {ENGINECTL} pull {user['ENGINE_A']} -o {v} --executable {SERVER}"
    script = f"""
        set -e
        mount -t tmpfs none {v}
        mv {b} {b}.real && mkfifo {b}
        {pull} & U=$!
        i=0
        until ls -A {v} | grep -q '^[.]volume[.]pull-'; do
            i=$((i + 1)); [ $i -lt 1200 ] || exit 9; sleep 0.1
        done
        C=$(cat /proc/$U/task/$U/children)
        kill -9 $C
        wait $U || true
        echo "left: $(ls -A {v} | tr '\\n' ' ')"
        rm {b} && mv {b}.real {b}
        {pull} --json
        ls -A {v}
    """
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
    # pull's marker named it, so the fetch after it took it away


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_fetch_killed_while_it_filled_a_volume_is_cleared_by_the_next_one(
    user: dict[str, str], tmp_path: Path
) -> None:
    """As for pull: the killed fetch (stopped for certain by a blob of the store that is a
    FIFO) leaves its staging directory in the volume; the next fetch, with the same PID in a
    fresh PID namespace, clears it and fills the volume."""
    volume = tmp_path / "volume"
    volume.mkdir()
    weights = tmp_path / "engine-A" / "rank0.engine"
    blob = tmp_path / "home" / "store" / blob_key(digest_file(weights).xxh3)
    v, b = shlex.quote(str(volume)), shlex.quote(str(blob))
    fetch = f"unshare --pid --fork {ENGINECTL} fetch {user['ENGINE_A']} -o {v}"
    script = f"""
        set -e
        mount -t tmpfs none {v}
        mv {b} {b}.real && mkfifo {b}
        {fetch} & U=$!
        i=0
        until ls -A {v} | grep -q '^[.]volume[.]pull-'; do
            i=$((i + 1)); [ $i -lt 1200 ] || exit 9; sleep 0.1
        done
        C=$(cat /proc/$U/task/$U/children)
        kill -9 $C
        wait $U || true
        echo "left: $(ls -A {v} | tr '\\n' ' ')"
        rm {b} && mv {b}.real {b}
        {fetch} --json >/dev/null
        ls -A {v}
    """
    done = _in_namespace(script, user)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("left: .volume.pull-")  # what the kill left
    assert sorted(lines[1:]) == sorted([MARKER, "config.json", "rank0.engine", "rank1.engine",
                                        "tokenizer"])
