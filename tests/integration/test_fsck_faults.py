"""`fsck --repair` condemns a blob only on the proof fetch needs (issue 21, item 7).

A size the store reports that is not the manifest's (a HEAD's Content-Length, a LIST
answer's `<Size>`) is a suspicion: the blob is read back whole, and set aside only when
those bytes fail their digest and the server's stored checksum vouches for them. A good
blob the store lies about is reported and kept; a truncated one is still set aside.
Through the faulty proxy in front of the real S3 test server,
with `enginectl` run as a user runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.identity.layout import blob_name
from registry.ops.adopt import import_artifact
from registry.ops.damage import iter_damaged
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.integration.engines import engine_spec, make_engine, overwrite
from tests.integration.faulty_proxy import Fault, FaultyProxy
from tests.integration.s3server import S3Server


def _context(tmp_path: Path, store_url: str, endpoint: str) -> Context:
    return Context(RegistryConfig(
        home=tmp_path / "home", store_url=store_url, s3_endpoint_url=endpoint,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache"))


def _fsck(tmp_path: Path, store_url: str, endpoint: str, *args: str,
          code: int) -> dict[str, list[str]]:
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_STORE_URL": store_url, "ENGINECTL_S3_ENDPOINT_URL": endpoint,
           "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'r.db'}",
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = run_cli([ENGINECTL, "fsck", *args, "--json"], env=env, timeout=300)
    assert done.returncode == code, (done.stdout, done.stderr)
    report: dict[str, list[str]] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("lies", ["first head", "every head"])
def test_fsck_repair_keeps_a_good_blob_the_store_gives_the_wrong_size_of(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, lies: str
) -> None:
    """Every HEAD and LIST answer says each object is a byte larger than it is: the first
    one of each blob only (the fresh reads then hash its bytes right), or every one (the
    fresh reads fail, which proves nothing). fsck --repair reports the wrong size and exits
    4, but sets nothing aside; fsck without the proxy finds the store whole. (Before, the
    wrong size alone sent every blob to `damaged/`.)"""
    store_url = f"s3://{s3_bucket}/size-{lies.replace(' ', '-')}"
    direct = _context(tmp_path, store_url, s3_server.endpoint_url)
    published = import_artifact(direct, make_engine(tmp_path / "engine"), engine_spec())
    blobs = {f.xxh3 for f in published.manifest.files}
    headed: set[str] = set()

    def plan(_n: int, method: str, path: str, _wanted: str | None) -> Fault:
        if "list-type=" in path:
            return "size"
        if method != "HEAD" or "/blobs/" not in path:
            return "pass"
        if lies == "every head" or path not in headed:
            headed.add(path)
            return "size"
        return "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        report = _fsck(tmp_path, store_url, proxy.endpoint_url, "--repair", code=4)
    assert proxy.faults.count("size") >= len(blobs)
    assert len(report["unrepaired"]) == len(blobs)
    assert all("wrong size" in problem for problem in report["unrepaired"])
    assert not any("moved the damaged blob" in line for line in report["repairs"])
    assert sum("kept blob" in line for line in report["repairs"]) == len(blobs)
    assert list(iter_damaged(direct.store)) == []
    assert direct.store.missing_blobs({f.xxh3: f.size for f in published.manifest.files}) \
        == set()
    direct.close()
    assert _fsck(tmp_path, store_url, s3_server.endpoint_url, code=0)["problems"] == []


def test_fsck_repair_still_sets_aside_a_truncated_blob_beside_a_good_one_listed_wrong(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The first HEAD of each blob says it is a byte larger than it is; one blob really is
    truncated in the store. fsck --repair reads both back whole: the truncated one fails
    its digest with the server's checksum of it matching, and is set aside; the good one
    is kept."""
    store_url = f"s3://{s3_bucket}/size-and-truncated"
    direct = _context(tmp_path, store_url, s3_server.endpoint_url)
    published = import_artifact(direct, make_engine(tmp_path / "engine"), engine_spec())
    rank0, rank1 = (next(f for f in published.manifest.files if f.path == name)
                    for name in ("rank0.engine", "rank1.engine"))
    overwrite(direct, blob_name(rank0.xxh3), (tmp_path / "engine" / "rank0.engine")
               .read_bytes()[:1000])
    headed: set[str] = set()

    def plan(_n: int, method: str, path: str, _wanted: str | None) -> Fault:
        if method == "HEAD" and "/blobs/" in path and path not in headed:
            headed.add(path)
            return "size"
        return "pass"

    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        report = _fsck(tmp_path, store_url, proxy.endpoint_url, "--repair", code=4)
    assert proxy.faults.count("size") == len(published.manifest.files)
    moved = [line for line in report["repairs"] if "moved the damaged blob" in line]
    assert len(moved) == 1
    assert str(rank0.xxh3) in moved[0]
    assert not direct.store.has_blob(rank0.xxh3)
    assert direct.store.has_blob(rank1.xxh3)
    assert [d.key.original for d in iter_damaged(direct.store)] == [blob_name(rank0.xxh3)]
    direct.close()
