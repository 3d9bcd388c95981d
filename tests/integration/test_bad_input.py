"""Bad input on the store and registry side, as a user types it (issue 10, items 10-12):
one line, the right exit code, nothing touched; and Ctrl-C of a fetch (item 9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import stderr_of, with_default_signals, without_store_note
from tests.integration.engines import make_engine
from tests.integration.s3server import S3Server


def run(env: dict[str, str], *args: str, code: int = 0, cwd: Path | None = None,
        began: bool = False) -> subprocess.CompletedProcess[str]:
    """Run enginectl; a failure is one error line, alone unless the command *began* its
    work (then the note naming the store and registry comes first)."""
    done = run_cli([ENGINECTL, *args], env=env, timeout=300, cwd=cwd)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    if code:
        error = stderr_of(done) if began else done.stderr
        assert error.count("\n") == 1, done.stderr
        assert error.startswith("enginectl: error: "), done.stderr
        assert "Traceback" not in done.stderr
    return done


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under *root* with its bytes (None for folders): what "untouched" means."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not p.name.endswith(("-wal", "-shm"))}


@pytest.fixture
def home(tmp_path: Path) -> tuple[dict[str, str], str]:
    """A user with one ready artifact; (environment, its digest)."""
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path / "user")}
    (tmp_path / "user").mkdir()
    engine = make_engine(tmp_path / "engine")
    done = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
               "--gpu", "h100", "--ready", "--json")
    return env, json.loads(done.stdout)["digest"]


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("target", ["sub/..", ".", "..", "sub/../..", "/", "~", "HOME",
                                    "STORE", "STORE/blobs", "CACHE", "CACHE/xxh3-128/x",
                                    "/proc/self/cwd/model", "/proc/enginectl", "/sys/x"])
def test_fetch_refuses_a_target_it_must_never_replace(
    home: tuple[dict[str, str], str], tmp_path: Path, target: str, force: bool
) -> None:
    env, digest = home
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    places = {"~": str(tmp_path / "user"), "HOME": str(tmp_path / "home"),
              "STORE": str(tmp_path / "home" / "store"), "CACHE": str(tmp_path / "cache")}
    for name, value in places.items():
        target = target.replace(name, value, 1) if target.startswith(name) else target
    before = _tree(tmp_path)
    refused = run(env, "fetch", digest, "-o", target, *(["--force"] if force else []),
                  code=2, cwd=work)
    assert "refusing to fetch into" in refused.stderr
    after = _tree(tmp_path)
    assert {k for k in set(before) | set(after) if before.get(k) != after.get(k)} == set()


def test_fetch_into_a_fresh_folder_of_the_working_directory_works(
    home: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, digest = home
    work = tmp_path / "work"
    work.mkdir()
    run(env, "fetch", digest, "-o", "model", cwd=work)
    assert (work / "model" / "rank0.engine").is_file()


def test_a_file_name_that_is_not_utf8_is_refused_on_import(
    home: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, _ = home
    engine = make_engine(tmp_path / "odd")
    with open(os.fsencode(engine) + b"/caf\xe9.bin", "wb") as handle:  # noqa: PTH123 - bytes path
        handle.write(b"latin-1 name")
    listed = run(env, "ls", "--json").stdout
    refused = run(env, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
                  "--gpu", "h100", code=4)
    assert "not valid UTF-8" in refused.stderr
    assert "caf\\xe9.bin" in refused.stderr
    assert run(env, "ls", "--json").stdout == listed


@pytest.mark.parametrize("grace", ["99999999999999d", "36501d", "-1d", "7 days"])
def test_gc_refuses_a_grace_it_cannot_use(home: tuple[dict[str, str], str], grace: str) -> None:
    env, _ = home
    refused = run(env, "gc", "--grace", grace, code=2)
    assert f"--grace {grace!r}" in refused.stderr


def test_an_s3_endpoint_that_is_not_a_url_is_refused(
    home: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, digest = home
    env = {**env, "ENGINECTL_STORE_URL": "s3://bucket/prefix",
           "ENGINECTL_S3_ENDPOINT_URL": "not-a-url"}
    for args in (["fetch", digest, "-o", str(tmp_path / "out")], ["gc", "--dry-run"],
                 ["import", str(tmp_path / "engine"), "--kind", "trtllm-engine", "--model",
                  "m", "--gpu", "h100"]):
        refused = run(env, *args, code=2)
        assert "ENGINECTL_S3_ENDPOINT_URL 'not-a-url'" in refused.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variable", ["ENGINECTL_HOME", "ENGINECTL_CACHE_DIR"])
def test_a_home_or_cache_that_is_a_file_is_refused(
    home: tuple[dict[str, str], str], tmp_path: Path, variable: str
) -> None:
    env, digest = home
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {**env, variable: str(blocker)}
    for args in (["ls"], ["fetch", digest, "-o", str(tmp_path / "out")]):
        if variable == "ENGINECTL_CACHE_DIR" and args == ["ls"]:
            continue  # ls needs no cache
        refused = run(env, *args, code=2)
        assert variable in refused.stderr
        assert str(blocker) in refused.stderr
    assert blocker.read_text() == "not a directory"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("alias", ["a/../b", "a/./b", "../prod", "a//b", "Prod", "a/"])
def test_an_alias_with_a_bad_part_is_refused(home: tuple[dict[str, str], str],
                                             alias: str) -> None:
    env, digest = home
    refused = run(env, "tag", digest, alias, code=2)
    assert f"alias {alias!r} is not a valid name" in refused.stderr
    assert json.loads(run(env, "ls", "--json").stdout)[0]["aliases"] == []


def test_a_fetch_of_damaged_bytes_exits_4(home: tuple[dict[str, str], str],
                                          tmp_path: Path) -> None:
    env, digest = home
    blobs = tmp_path / "home" / "store" / "blobs"
    victim = max((p for p in blobs.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    refused = run(env, "fetch", digest, "-o", str(tmp_path / "out"), code=4, began=True)
    assert "integrity check failed" in refused.stderr
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_a_fetch_at_once_and_a_rerun_resumes(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The server stalls in the middle of the big blob's body and keeps the connection
    open: Ctrl-C still ends the fetch (exit 130), while the body is held, with the target
    as it was and a message saying what the cache kept; a re-run then fetches it all."""
    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.identity.layout import blob_name
    from registry.ops.adopt import ImportSpec, import_artifact
    from tests.integration.faulty_proxy import Fault, FaultyProxy

    engine = make_engine(tmp_path / "engine")
    (engine / "rank0.engine").write_bytes(os.urandom(6 << 20))
    store_url = f"s3://{s3_bucket}/ctrl-c"
    config = RegistryConfig(home=tmp_path / "home", store_url=store_url,
                            s3_endpoint_url=s3_server.endpoint_url,
                            registry_url=f"sqlite:///{tmp_path / 'home' / 'registry.db'}",
                            cache_dir=tmp_path / "cache")
    ctx = Context(config)
    published = import_artifact(ctx, engine, ImportSpec(kind="trtllm-engine", model="m",
                                                        gpu="h100", status="ready"))
    ctx.close()
    big = next(f for f in published.manifest.files if f.path == "rank0.engine")

    def plan(_n: int, method: str, path: str, _range: str | None) -> Fault:
        held = urlsplit(path).path.endswith(blob_name(big.xxh3))  # a presigned GET has a query
        return "hold" if method == "GET" and held else "pass"

    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_STORE_URL": store_url, "ENGINECTL_CACHE_DIR": str(tmp_path / "cache")}
    target = tmp_path / "out"
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        proc = subprocess.Popen(
            with_default_signals([ENGINECTL, "fetch", published.digest, "-o", str(target)]),
            text=True,
            env={**env, "ENGINECTL_S3_ENDPOINT_URL": proxy.endpoint_url},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proxy.holding.wait(120), "the fetch never reached the big blob"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)  # a guard against a hang, not a timing
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not proxy.released.is_set()  # it ended while the body was still held open
    assert proc.returncode == 130, stderr
    assert without_store_note(stderr).count("\n") == 1, stderr
    assert f"interrupted: {target} was left as it was" in stderr  # not its staged tree
    assert str(tmp_path / "cache") in stderr
    assert "again to resume" in stderr
    assert not target.exists()
    assert not list(tmp_path.glob(".out.*"))  # no staging left beside the target
    again = json.loads(run({**env, "ENGINECTL_S3_ENDPOINT_URL": s3_server.endpoint_url},
                           "fetch", published.digest, "-o", str(target), "--json").stdout)
    assert again["downloaded_bytes"] + again["cached_bytes"] == published.manifest.size
    assert (target / "rank0.engine").read_bytes() == (engine / "rank0.engine").read_bytes()


def test_ctrl_c_stops_an_s3_import_at_once_and_a_rerun_uploads_the_rest(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The server stops reading the big blob's upload: Ctrl-C still ends the import (exit
    130) while the upload is held, nothing is registered, the message says how many blobs
    are in the store, and a re-run uploads only what is missing."""
    from registry.identity.digest import digest_file
    from registry.identity.layout import blob_name
    from tests.integration.faulty_proxy import Fault, FaultyProxy

    engine = make_engine(tmp_path / "engine")
    (engine / "rank0.engine").write_bytes(os.urandom(6 << 20))
    big = digest_file(engine / "rank0.engine", with_sha256=False).xxh3

    def plan(_n: int, method: str, path: str, _range: str | None) -> Fault:
        return "hold" if method == "PUT" and blob_name(big) in path else "pass"

    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_STORE_URL": f"s3://{s3_bucket}/ctrl-c",
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache")}
    argv = [ENGINECTL, "import", str(engine), "--kind", "trtllm-engine", "--model", "m",
            "--gpu", "h100", "--json"]
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        proc = subprocess.Popen(with_default_signals(argv), text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env={**env, "ENGINECTL_S3_ENDPOINT_URL": proxy.endpoint_url})
        try:
            assert proxy.holding.wait(120), "the import never reached the big blob"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)  # a guard against a hang, not a timing
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert not proxy.released.is_set()  # it ended while the upload was still held
    assert proc.returncode == 130, stderr
    assert without_store_note(stderr).count("\n") == 1, stderr
    assert "interrupted: nothing was registered" in stderr
    assert "again to upload only the rest" in stderr
    env["ENGINECTL_S3_ENDPOINT_URL"] = s3_server.endpoint_url
    assert json.loads(run(env, "ls", "--json").stdout) == []
    again = json.loads(run(env, *argv[1:]).stdout)
    assert again["registered"]
    assert again["blobs_uploaded"] >= 1  # the big one at least (the rest may have landed)
    run(env, "fsck")
