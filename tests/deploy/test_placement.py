"""What a marker someone else wrote makes `pull`, `serve -o` and `fetch` remove: nothing that
is not proven enginectl's (`registry.ops.target`), as a user types it, into a real tmpfs
mount where the test may mount one (as root) and a plain directory otherwise. Every test
checks that nothing outside the target changed. A fill killed at each of its steps:
test_placement_killed.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import DiskFullError
from registry.ops.adopt import import_artifact
from registry.ops.fetch import fetch
from registry.ops.marker import MARKER, MARKER_SCHEMA, SERVE_FILE
from registry.sql import records
from tests.deploy.user_cli import SERVER, run, snapshot
from tests.integration.engines import engine_spec, make_engine
from tests.integration.s3server import S3Server


def mount_tmpfs(path: Path, size: str = "16m") -> bool:
    """A tmpfs at *path* (a volume, as Kubernetes mounts one); False where this process may
    not mount (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Path]:
    """The `-o` directory: a tmpfs mount point (a volume, filled entry by entry: where the
    reproductions deleted), or a plain directory where this process may not mount. A plain
    directory's swap: test_force_guard.py, test_placement_killed.py."""
    path = tmp_path / "target"
    if shutil.which("mount") is not None and mount_tmpfs(path):
        yield path
        unmount(path)
    else:
        path.mkdir(exist_ok=True)
        yield path


def outside(tmp_path: Path, target: Path) -> dict[str, bytes | None]:
    """Everything under *tmp_path* but the target and what enginectl keeps for itself (its
    home and the fetch cache): what no command here may change."""
    return {k: v for k, v in snapshot(tmp_path).items()
            if k.split("/", 1)[0] not in (target.name, "home", "cache")}


def marker(target: Path, **fields: object) -> None:
    data = {"schema": MARKER_SCHEMA, "by": "pull", "digest": None, "entries": [], **fields}
    (target / MARKER).write_text(json.dumps(data))


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.mkdir()
    (path / "thesis.tex").write_text("years of work")
    return path


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_marker_naming_a_path_outside_the_target_is_refused(
    user: dict[str, str], tmp_path: Path, target: Path, where: str
) -> None:
    kept = victim(tmp_path)
    name = "../victim" if where == "relative" else str(kept)
    marker(target, entries=[name])
    before, inside = outside(tmp_path, target), snapshot(target)
    for verb, extra in (("pull", ["--executable", SERVER]), ("fetch", ["--force"])):
        refused = run(user, verb, user["ENGINE_A"], "-o", str(target), *extra, code=2)
        assert f"names {name!r}, which is not a name in it" in refused.stderr
    assert outside(tmp_path, target) == before
    assert snapshot(target) == inside


def test_a_marker_naming_the_users_files_removes_none_of_them(
    user: dict[str, str], tmp_path: Path, target: Path
) -> None:
    """The user's files, named by a marker `by: pull` (pull) or `by: fetch` (fetch --force),
    with the digest of a real artifact whose names they share but not its content."""
    (target / "notes.txt").write_text("mine")
    (target / "config.json").write_text('{"mine": true}')
    (target / "tokenizer").mkdir()
    (target / "tokenizer" / "vocab.txt").write_text("my own vocabulary")
    before = outside(tmp_path, target)
    for by, verb, extra in (("pull", "pull", ["--executable", SERVER]),
                            ("fetch", "fetch", ["--force"])):
        marker(target, by=by, digest=user["ENGINE_A"],
               entries=["notes.txt", "config.json", "tokenizer"])
        inside = snapshot(target)
        refused = run(user, verb, user["ENGINE_B"], "-o", str(target), *extra, code=2)
        assert "names 'notes.txt', which no artifact it records has" in refused.stderr
        marker(target, by=by, digest=user["ENGINE_A"], entries=["config.json", "tokenizer"])
        (target / "notes.txt").unlink()
        inside = snapshot(target)
        refused = run(user, verb, user["ENGINE_B"], "-o", str(target), *extra, code=2)
        assert "so it is not what enginectl placed there" in refused.stderr
        assert snapshot(target) == inside
        (target / "notes.txt").write_text("mine")
    assert outside(tmp_path, target) == before


def test_a_file_of_the_right_size_is_proven_by_its_bytes_under_verify_strict(
    user: dict[str, str], tmp_path: Path, target: Path
) -> None:
    run(user, "pull", user["ENGINE_A"], "-o", str(target), "--executable", SERVER)
    rank0 = target / "rank0.engine"
    honest = rank0.read_bytes()
    rank0.unlink()  # the user's own file, of the same size, in its place
    rank0.write_bytes(bytes(reversed(honest)))
    before, inside = outside(tmp_path, target), snapshot(target)
    refused = run(user, "pull", user["ENGINE_B"], "-o", str(target), "--executable", SERVER,
                  "--verify", "strict", code=2)
    assert "'rank0.engine' in it holds other bytes than the artifact's" in refused.stderr
    assert snapshot(target) == inside
    rank0.unlink()
    rank0.write_bytes(honest)  # its own bytes again: replaced
    run(user, "pull", user["ENGINE_B"], "-o", str(target), "--executable", SERVER,
        "--verify", "strict")
    assert json.loads((target / SERVE_FILE).read_text())["digest"] == user["ENGINE_B"]
    assert outside(tmp_path, target) == before


def test_a_serve_json_alone_vouches_for_nothing(
    user: dict[str, str], tmp_path: Path, target: Path
) -> None:
    (target / SERVE_FILE).write_text(json.dumps({"schema": "enginectl.serve/v1"}))
    (target / "notes.txt").write_text("mine")
    before, inside = outside(tmp_path, target), snapshot(target)
    for verb, extra in (("pull", ["--executable", SERVER]), ("fetch", ["--force"]),
                        ("serve", ["--executable", "true"])):
        refused = run(user, verb, user["ENGINE_A"], "-o", str(target), *extra, code=2)
        assert f"holds no earlier {verb}" in refused.stderr
    assert snapshot(target) == inside
    assert outside(tmp_path, target) == before


def test_serve_o_places_where_pull_o_would(
    user: dict[str, str], tmp_path: Path, target: Path
) -> None:
    """`serve -o DIR` takes DIR by pull's rule and fills it as pull does (marker, serve.json,
    the same files); a second start finds it complete and serves it as it is; a pull
    replaces it."""
    before = outside(tmp_path, target)
    run(user, "serve", user["ENGINE_A"], "-o", str(target), "--executable", "true")
    served = {k: v for k, v in snapshot(target).items() if k != SERVE_FILE}
    placed = json.loads((target / MARKER).read_text())
    assert (placed["by"], placed["digest"]) == ("pull", user["ENGINE_A"])
    assert json.loads((target / SERVE_FILE).read_text())["model_dir"] == str(target)
    rank0 = (target / "rank0.engine").stat().st_ino
    run(user, "serve", user["ENGINE_A"], "-o", str(target), "--executable", "true")
    assert (target / "rank0.engine").stat().st_ino == rank0  # complete: served as it is

    pulled = tmp_path / "pulled"
    run(user, "pull", user["ENGINE_A"], "-o", str(pulled), "--executable", "true")
    assert {k: v for k, v in snapshot(pulled).items() if k != SERVE_FILE} == served
    shutil.rmtree(pulled)
    run(user, "pull", user["ENGINE_B"], "-o", str(target), "--executable", SERVER)
    assert json.loads((target / SERVE_FILE).read_text())["digest"] == user["ENGINE_B"]
    assert outside(tmp_path, target) == before


def test_pulling_a_deleted_artifact_is_exit_4(user: dict[str, str], tmp_path: Path) -> None:
    """A gc-deleted artifact is a state of the registry (as a quarantined one is): exit 4,
    with or without --allow-unready, nothing placed."""
    with Context(RegistryConfig.from_env(user)) as ctx, ctx.registry.session() as session:
        records.set_status(session, user["ENGINE_A"], "deleted", None)
    before = snapshot(tmp_path)
    for verb, extra in (("pull", ["--executable", SERVER]), ("pull", ["--allow-unready",
                                                                      "--executable", SERVER]),
                        ("fetch", [])):
        refused = run(user, verb, user["ENGINE_A"], "-o", str(tmp_path / "out"), *extra,
                      code=4)
        assert f"artifact {user['ENGINE_A']} is deleted" in refused.stderr
    assert snapshot(tmp_path) == before


def test_a_full_disk_is_exit_4_naming_the_path(user: dict[str, str], tmp_path: Path) -> None:
    """A target (pull, fetch) or fetch cache on a disk too small for the artifact (~100 kB):
    exit 4 naming where, as it was before; a full disk is the machine's fault."""
    small = tmp_path / "small"
    if not mount_tmpfs(small, size="64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        target = small / "model"
        for verb, extra in (("pull", ["--executable", SERVER]), ("fetch", [])):
            refused = run(user, verb, user["ENGINE_A"], "-o", str(target), *extra, code=4)
            assert f"no space left on the device of {target} (the target directory)" \
                in refused.stderr
            assert list(small.iterdir()) == []
        cache = small / "cache"
        before = snapshot(tmp_path)
        refused = run({**user, "ENGINECTL_CACHE_DIR": str(cache)}, "fetch", user["ENGINE_B"],
                      "-o", str(tmp_path / "out"), code=4)
        assert f"no space left on the device of {cache} (the fetch cache)" in refused.stderr
        assert not (tmp_path / "out").exists()
        assert {k: v for k, v in snapshot(tmp_path).items()
                if not k.startswith("small/")} == before
    finally:
        unmount(small)


def test_a_directory_pulled_before_markers_recorded_their_sources_is_replaced(
    user: dict[str, str], tmp_path: Path, target: Path
) -> None:
    """A node upgraded under its volume: the marker an older pull wrote names the entries and
    the artifact only; its serve.json's `sources` (the entry's checkpoint) are proven as the
    marker's would be, so the next pull replaces it instead of refusing in a crash loop."""
    from tests.deploy import artifacts

    with Context(RegistryConfig.from_env(user)) as ctx:
        entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                     artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    run(user, "pull", entry, "-o", str(target), "--executable", SERVER)
    old = json.loads((target / MARKER).read_text())
    assert "model.safetensors" in old["entries"]  # the checkpoint's, at the top
    (target / MARKER).write_text(json.dumps({k: old[k] for k in ("schema", "by", "digest",
                                                                   "entries")}))
    before = outside(tmp_path, target)
    run(user, "pull", user["ENGINE_A"], "-o", str(target), "--executable", SERVER)
    assert json.loads((target / SERVE_FILE).read_text())["digest"] == user["ENGINE_A"]
    assert not (target / "model.safetensors").exists()
    assert outside(tmp_path, target) == before


def test_a_full_fetch_cache_on_s3_is_exit_4_naming_it(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Downloads from S3 (ranged GETs into the cache's temp files) into a full disk: the
    fetch cache named, a DiskFullError (exit 4), not an unexpected OSError."""
    small = tmp_path / "small"
    if not mount_tmpfs(small, size="64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        def config(cache: Path) -> RegistryConfig:
            return RegistryConfig(
                home=tmp_path / "home", store_url=f"s3://{s3_bucket}/full",
                s3_endpoint_url=s3_server.endpoint_url,
                registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=cache)

        with Context(config(tmp_path / "cache0")) as ctx:
            digest = import_artifact(ctx, make_engine(tmp_path / "engine"),
                                     engine_spec()).digest
        with Context(config(small / "cache")) as ctx, \
                pytest.raises(DiskFullError, match="the fetch cache") as caught:
            fetch(ctx, digest, tmp_path / "out")
        assert caught.value.exit_code == 4
        assert caught.value.path == small / "cache"
        assert not (tmp_path / "out").exists()
    finally:
        unmount(small)


def test_a_users_file_named_like_a_staging_directory_is_the_users(
    user: dict[str, str], tmp_path: Path
) -> None:
    """Only a directory that holds a fill's lock file (and nothing else of anyone's) is a
    staging directory: a file or folder of the user's named `.DIR.pull-…`, in DIR or beside
    it, is never removed, and in DIR it is refused as anything else the marker does not name."""
    plain = tmp_path / "models"
    run(user, "pull", user["ENGINE_A"], "-o", str(plain), "--executable", SERVER)
    (plain / ".models.pull-notes").write_text("mine")
    beside = tmp_path / ".models.pull-vm-1-keep"
    beside.mkdir()
    (beside / "tree").mkdir()
    (beside / "tree" / "thesis.tex").write_text("years of work")
    before, inside = outside(tmp_path, plain), snapshot(plain)
    assert ".models.pull-vm-1-keep/tree/thesis.tex" in before
    refused = run(user, "pull", user["ENGINE_B"], "-o", str(plain), "--executable", SERVER,
                  code=2)
    assert "'.models.pull-notes' in it was not written by enginectl" in refused.stderr
    assert snapshot(plain) == inside
    (plain / ".models.pull-notes").unlink()
    run(user, "pull", user["ENGINE_B"], "-o", str(plain), "--executable", SERVER)
    assert outside(tmp_path, plain) == before
