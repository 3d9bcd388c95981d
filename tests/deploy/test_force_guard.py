"""What `pull -o DIR` and `fetch -o DIR` may replace (issue 21, points 2, 4 and 9), as a
user types it: `--force` replaces only a directory pull or fetch filled, or an empty one;
the store, the cache, enginectl's home, $HOME, the working directory and every folder above
them are refused in one line, exit 2, nothing touched; `-o` is a path, never a template; a
name too long for the file system is one line, exit 2. `serve` re-proves the files of its
serving directory as the fetch cache proves its entries. On the file store and SQLite: what
is tested is the target, not the store. A pull killed while it filled a mount point (a
Kubernetes volume): test_force_volumes.py."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pipeline.deploy.pull import select
from pipeline.deploy.runtime import find_runtime
from pipeline.deploy.serve import prepare, serving_dir
from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import ManifestError
from registry.identity.digest import sha256_of
from registry.identity.manifest import check_path
from registry.ops.marker import MARKER, SERVE_FILE
from tests.deploy.user_cli import SERVER, run, snapshot

LONG = "x" * 300


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
    assert argv[argv.index("--tokenizer") + 1] == str(dest / "tokenizer")
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


    # pull's marker named it, so the fetch after it took it away


