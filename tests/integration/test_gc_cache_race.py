"""`gc --grace 0` never takes the fetch cache's temp file of a fetch in progress.

A fill writes its blob to a `.tmp-<hex>` file it holds under a lock (`registry.store.cache`); gc
removes only unlocked ones older than its cutoff. Here a fetch stalls mid-blob (the faulty
proxy sends half a GET's body, then waits), `enginectl gc --grace 0s` runs as a user runs
it, and the fetch then completes; the temp file of a killed fill is removed. (Before, gc at
grace 0 removed the stalled fill's temp file and the fetch failed.)
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from registry.config import RegistryConfig
from registry.context import Context
from registry.ops.adopt import import_artifact
from registry.ops.fetch import fetch
from registry.store.cache import NEW_GRACE, BlobCache, _writing
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import engine_spec, make_engine
from tests.integration.faulty_proxy import Fault, FaultyProxy
from tests.integration.s3server import S3Server


def _context(tmp_path: Path, store_url: str, endpoint: str) -> Context:
    return Context(RegistryConfig(
        home=tmp_path / "home", store_url=store_url, s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache"))


def _env(tmp_path: Path, store_url: str, endpoint: str) -> dict[str, str]:
    """What a user's shell holds for the same store, registry and cache."""
    return {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
            "ENGINECTL_STORE_URL": store_url, "ENGINECTL_S3_ENDPOINT_URL": endpoint,
            "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'r.db'}",
            "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}


def test_gc_at_grace_zero_leaves_a_stalled_fetch_s_cache_temp_file_alone(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    store_url = f"s3://{s3_bucket}/gc-cache-race"
    source = make_engine(tmp_path / "engine")
    direct = _context(tmp_path, store_url, s3_server.endpoint_url)
    published = import_artifact(direct, source, engine_spec())
    direct.close()
    rank1 = next(f for f in published.manifest.files if f.path == "rank1.engine")
    name = rank1.xxh3.hex[2:]  # the blob's name, in its GET's path
    killed = tmp_path / "cache" / "xxh3-128" / "00" / ".tmp-killed"  # a fill's, long dead
    killed.parent.mkdir(parents=True)
    killed.write_bytes(b"half a blob")
    os.utime(killed, (time.time() - 3600, time.time() - 3600))
    paused: list[str] = []

    def plan(_n: int, method: str, path: str, _wanted: str | None) -> Fault:
        if method == "GET" and name in path and not paused:
            paused.append(path)
            return "pause"
        return "pass"

    failed: list[BaseException] = []
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        context = _context(tmp_path, store_url, proxy.endpoint_url)

        def fetching() -> None:
            try:
                fetch(context, published.digest, tmp_path / "out")
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                failed.append(exc)

        worker = threading.Thread(target=fetching)
        worker.start()
        assert proxy.holding.wait(120)
        stalled = list((tmp_path / "cache" / "xxh3-128" / rank1.xxh3.hex[:2]).glob(".tmp-*"))
        assert len(stalled) == 1
        done = run_cli([ENGINECTL, "gc", "--grace", "0s", "--json"],
                       env=_env(tmp_path, store_url, s3_server.endpoint_url), timeout=300)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout)["partial_writes"] == 1  # the killed fill's only
        assert not killed.exists()
        assert stalled[0].exists()
        proxy.resume.set()
        worker.join(120)
        context.close()
    assert not worker.is_alive()
    assert failed == []
    assert (tmp_path / "out" / "rank1.engine").read_bytes() == \
        (source / "rank1.engine").read_bytes()
    assert list((tmp_path / "cache" / "xxh3-128").glob("*/.tmp-*")) == []


def test_gc_at_grace_zero_removes_the_cache_temp_file_of_a_killed_fetch(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """`enginectl fetch`, stalled mid-blob, is killed (SIGKILL: no cleanup runs); the locks
    on its temp files die with it, so `gc --grace 0s` removes them all."""
    store_url = f"s3://{s3_bucket}/gc-cache-killed"
    direct = _context(tmp_path, store_url, s3_server.endpoint_url)
    published = import_artifact(direct, make_engine(tmp_path / "engine"), engine_spec())
    direct.close()
    rank1 = next(f for f in published.manifest.files if f.path == "rank1.engine")
    name = rank1.xxh3.hex[2:]

    def plan(_n: int, method: str, path: str, _wanted: str | None) -> Fault:
        return "pause" if method == "GET" and name in path else "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        env = _env(tmp_path, store_url, proxy.endpoint_url)
        fetching = subprocess.Popen([ENGINECTL, "fetch", published.digest, "-o",
                                     str(tmp_path / "out")], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert proxy.holding.wait(120)
            shard = tmp_path / "cache" / "xxh3-128" / rank1.xxh3.hex[:2]
            # rank1's fill; another file's fill in flight lands here too when its random
            # bytes hash to the same first byte (~1 % of runs)
            stalled = list(shard.glob(".tmp-*"))
            assert stalled
        finally:
            fetching.kill()
            fetching.wait(60)
    left = list((tmp_path / "cache").rglob(".tmp-*"))  # its other fills in flight, too
    assert set(stalled) & set(left)  # rank1's: nothing cleaned up after the kill
    done = run_cli([ENGINECTL, "gc", "--grace", "0s", "--json"],
                   env=_env(tmp_path, store_url, s3_server.endpoint_url), timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["partial_writes"] == len(left)
    assert list((tmp_path / "cache").rglob(".tmp-*")) == []


def test_a_temp_file_is_never_seen_unlocked_while_its_writer_lives(tmp_path: Path) -> None:
    """A writer names its temp file `.tmp-` only once it holds the lock (created as `.new-`),
    so gc at grace 0 cannot take one in the instant between creating and locking it; a
    `.new-` file left by a writer killed in that instant goes once older than NEW_GRACE."""
    cache = BlobCache(tmp_path / "cache")
    shard = tmp_path / "cache" / "xxh3-128" / "ab"
    shard.mkdir(parents=True)
    killed_new, fresh_new = shard / ".new-killed", shard / ".new-fresh"
    killed_new.write_bytes(b"")
    fresh_new.write_bytes(b"")
    old = time.time() - NEW_GRACE.total_seconds() - 60
    os.utime(killed_new, (old, old))
    with _writing(shard) as temp:
        assert temp.name.startswith(".tmp-")
        assert temp.exists()
        assert not list(shard.glob(f".new-{temp.name[5:]}"))  # renamed, not copied
        assert cache.remove_partial(datetime.now(UTC)) == 1  # the killed .new- only
        assert [path.name for path in sorted(shard.iterdir())] == [".new-fresh", temp.name]
    assert not temp.exists()
