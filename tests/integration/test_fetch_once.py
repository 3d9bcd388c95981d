"""A directory of the work folder that several processes share (a build's fetched input, a
smoke's model) is fetched once: a second fetcher waits for the first, then uses its copy.

Two builds of one machine that read the same input used to race: the second found the
first's copy placed mid-way and stopped with "not empty" (seen in
tests/integration/test_timing_cache.py's two builds at once), or replaced it under the first
one's running tool."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from registry.config import RegistryConfig
from registry.context import Context
from registry.filelock import flock
from registry.identity.manifest import Manifest
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.fetch import load_manifest
from registry.ops.fetch_files import fetch_once


def published(tmp_path: Path) -> tuple[Context, Manifest]:
    ctx = Context(RegistryConfig(
        home=tmp_path / "home", store_url=(tmp_path / "store").as_uri(), s3_endpoint_url=None,
        registry_url=f"sqlite:///{tmp_path / 'registry.db'}", cache_dir=tmp_path / "cache"))
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (source / "model.safetensors").write_bytes(b"weights" * 1000)
    spec = ImportSpec(kind="hf-checkpoint", model="m", status="ready")
    return ctx, load_manifest(ctx, import_artifact(ctx, source, spec).digest)


def waiting_for(lock: Path) -> bool:
    """Whether some process or thread waits for the flock of *lock* (/proc/locks marks a
    blocked request with `->`)."""
    inode = f":{lock.stat().st_ino} "
    return any("->" in line and inode in line
               for line in Path("/proc/locks").read_text().splitlines())


def test_a_second_fetcher_waits_for_the_first_and_uses_its_copy(tmp_path: Path) -> None:
    ctx, manifest = published(tmp_path)
    dest = tmp_path / "work" / "inputs" / "0123456789abcdef"
    lock = dest.parent / f".{dest.name}.lock"
    asked = threading.Event()

    def manifest_read() -> Manifest:
        asked.set()
        return manifest

    with ThreadPoolExecutor(1) as pool, flock(lock):  # the first fetcher, mid-way
        second = pool.submit(fetch_once, ctx.store, manifest_read, dest, cache=ctx.cache)
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing
        while not waiting_for(lock):
            assert not second.done(), second.result()  # it must wait, not fetch or fail
            assert time.monotonic() < deadline, "the second fetcher never asked for the lock"
            time.sleep(0.01)  # and leave the core to it
        dest.mkdir()  # the first one's copy, placed whole
        (dest / "placed-by").write_text("the first fetcher")
    assert second.result(timeout=60) == dest
    assert not asked.is_set()  # it used the first one's copy and read no manifest
    assert sorted(p.name for p in dest.iterdir()) == ["placed-by"]
    ctx.close()


def test_the_first_fetcher_places_every_file(tmp_path: Path) -> None:
    ctx, manifest = published(tmp_path)
    dest = tmp_path / "work" / "inputs" / "0123456789abcdef"
    assert fetch_once(ctx.store, lambda: manifest, dest, cache=ctx.cache) == dest
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]
    assert fetch_once(ctx.store, lambda: 1 / 0, dest, cache=ctx.cache) == dest  # type: ignore[arg-type,return-value]
    ctx.close()
