"""Damage heals, and the fetch cache never serves edited bytes (issue 10, items 2 and 3).

Every case as a user meets it, through the CLI, on every store × database: a fetched file
edited in place; a flipped byte, a truncated blob and an edited manifest in the store, each
then healed by publishing the same content again (and fsck clean), with `fsck --repair`
saying what it did.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from registry.context import Context
from registry.identity.digest import Digest
from registry.identity.layout import blob_name, manifest_name
from registry.ops.adopt import ImportSpec, import_artifact
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import stderr_of
from tests.integration.engines import make_engine, overwrite

SPEC = ImportSpec(kind="trtllm-engine", model="m", gpu="h100", status="ready")


@pytest.fixture
def env(ctx: Context, tmp_path: Path) -> dict[str, str]:
    """What a user's shell holds for *ctx*'s store and registry, with the same cache."""
    values = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
              "ENGINECTL_STORE_URL": ctx.config.store_url,
              "ENGINECTL_REGISTRY_URL": ctx.config.registry_url,
              "ENGINECTL_CACHE_DIR": str(ctx.config.cache_dir), "HF_HUB_OFFLINE": "1"}
    if ctx.config.s3_endpoint_url:
        values["ENGINECTL_S3_ENDPOINT_URL"] = ctx.config.s3_endpoint_url
    return values


def run(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    if code:
        assert stderr_of(done).count("\n") == 1, done.stderr
        assert stderr_of(done).startswith("enginectl: error: ")
    return done


def _read(ctx: Context, key: str, tmp_path: Path) -> bytes:
    if key.startswith("blobs/"):
        ctx.store.get_blob(Digest("xxh3-128", key.split("/", 2)[2].replace("/", "")),
                           tmp_path / "raw")
        return (tmp_path / "raw").read_bytes()
    return ctx.store.get_object(key)


def _rank1(published_files: tuple[object, ...]) -> object:
    return next(f for f in published_files if f.path == "rank1.engine")  # type: ignore[attr-defined]


@pytest.mark.parametrize("edit", ["same size", "appended"])
def test_a_fetched_file_edited_in_place_is_never_served_again(
    ctx: Context, env: dict[str, str], tmp_path: Path, edit: str
) -> None:
    source = make_engine(tmp_path / "engine")
    digest = import_artifact(ctx, source, SPEC).digest
    run(env, "fetch", digest, "-o", str(tmp_path / "first"))
    edited = tmp_path / "first" / "rank0.engine"
    edited.chmod(0o644)  # what a user (or root in a container) does to change a file
    data = bytearray(edited.read_bytes())
    if edit == "same size":
        data[100] ^= 0xFF
    else:
        data += b"tuned by hand"
    edited.write_bytes(bytes(data))
    run(env, "fetch", digest, "-o", str(tmp_path / "second"))
    true = (source / "rank0.engine").read_bytes()
    assert (tmp_path / "second" / "rank0.engine").read_bytes() == true
    rank0 = next(f for f in import_artifact(ctx, source, SPEC).manifest.files
                 if f.path == "rank0.engine")
    assert ctx.cache.path(rank0.xxh3).read_bytes() == true  # the cache healed
    run(env, "fetch", digest, "-o", str(tmp_path / "third"), "--verify", "strict")


def test_a_flipped_byte_is_set_aside_by_fetch_and_healed_by_a_new_import(
    ctx: Context, env: dict[str, str], tmp_path: Path
) -> None:
    source = make_engine(tmp_path / "engine")
    published = import_artifact(ctx, source, SPEC)
    rank1 = _rank1(published.manifest.files)
    key = blob_name(rank1.xxh3)  # type: ignore[attr-defined]
    data = bytearray(_read(ctx, key, tmp_path))
    data[len(data) // 2] ^= 0x01
    overwrite(ctx, key, bytes(data))
    target = tmp_path / "out"
    refused = run(env, "fetch", published.digest, "-o", str(target), code=4)
    assert "rank1.engine" in refused.stderr
    assert str(rank1.xxh3) in refused.stderr  # type: ignore[attr-defined]
    assert "damaged/" in refused.stderr
    assert "enginectl import" in refused.stderr
    assert not target.exists()
    again = json.loads(run(env, "import", str(source), "--kind", "trtllm-engine", "--model",
                           "m", "--gpu", "h100", "--ready", "--json").stdout)
    assert again == {"digest": published.digest, "registered": False, "blobs_uploaded": 1,
                     "bytes_uploaded": rank1.size}  # type: ignore[attr-defined]
    run(env, "fetch", published.digest, "-o", str(target))
    assert (target / "rank1.engine").read_bytes() == (source / "rank1.engine").read_bytes()
    run(env, "fsck")


def test_fsck_repair_sets_damage_aside_and_says_so(
    ctx: Context, env: dict[str, str], tmp_path: Path
) -> None:
    source = make_engine(tmp_path / "engine")
    published = import_artifact(ctx, source, SPEC)
    key = blob_name(_rank1(published.manifest.files).xxh3)  # type: ignore[attr-defined]
    data = bytearray(_read(ctx, key, tmp_path))
    data[7] ^= 0x80
    overwrite(ctx, key, bytes(data))
    checked = run(env, "fsck", code=4)
    assert "rank1.engine" in checked.stdout
    assert "`enginectl fsck --repair`" in checked.stderr
    repaired = run(env, "fsck", "--repair", "--json", code=4)
    report = json.loads(repaired.stdout)
    assert len(report["unrepaired"]) == 1
    assert any("moved the damaged blob" in line and "damaged/" in line
               for line in report["repairs"])
    assert any("not in this machine's fetch cache" in line for line in report["repairs"])
    assert not ctx.store.has_blob(_rank1(published.manifest.files).xxh3)  # type: ignore[attr-defined]
    run(env, "import", str(source), "--kind", "trtllm-engine", "--model", "m", "--gpu",
        "h100", "--ready")
    run(env, "fsck")


def test_fsck_repair_restores_a_damaged_blob_from_the_fetch_cache(
    ctx: Context, env: dict[str, str], tmp_path: Path
) -> None:
    published = import_artifact(ctx, make_engine(tmp_path / "engine"), SPEC)
    run(env, "fetch", published.digest, "-o", str(tmp_path / "out"))  # the cache has it now
    key = blob_name(_rank1(published.manifest.files).xxh3)  # type: ignore[attr-defined]
    overwrite(ctx, key, b"truncated")
    repaired = run(env, "fsck", "--repair")
    assert "restored blob" in repaired.stdout
    assert "(repaired)" in repaired.stdout
    run(env, "fsck")


def test_a_truncated_blob_is_replaced_by_the_next_import(
    ctx: Context, env: dict[str, str], tmp_path: Path
) -> None:
    source = make_engine(tmp_path / "engine")
    published = import_artifact(ctx, source, SPEC)
    rank1 = _rank1(published.manifest.files)
    key = blob_name(rank1.xxh3)  # type: ignore[attr-defined]
    overwrite(ctx, key, _read(ctx, key, tmp_path)[:1000])
    assert "wrong size" in run(env, "fsck", "--no-verify", code=4).stdout
    again = json.loads(run(env, "import", str(source), "--kind", "trtllm-engine", "--model",
                           "m", "--gpu", "h100", "--ready", "--json").stdout)
    assert again["blobs_uploaded"] == 1
    run(env, "fsck")


def test_an_edited_manifest_is_replaced_by_the_next_import_and_set_aside_by_fetch(
    ctx: Context, env: dict[str, str], tmp_path: Path
) -> None:
    source = make_engine(tmp_path / "engine")
    published = import_artifact(ctx, source, SPEC)
    key = manifest_name(Digest.parse(published.digest))
    honest = ctx.store.get_manifest(Digest.parse(published.digest))
    overwrite(ctx, key, honest.replace(b'"model":"m"', b'"model":"x"'))
    run(env, "fsck", code=4)
    run(env, "import", str(source), "--kind", "trtllm-engine", "--model", "m", "--gpu",
        "h100", "--ready")
    run(env, "fsck")
    overwrite(ctx, key, b"{}")
    refused = run(env, "fetch", published.digest, "-o", str(tmp_path / "out"), code=4)
    assert "damaged/" in refused.stderr
    assert not ctx.store.has_manifest(Digest.parse(published.digest))  # set aside
    run(env, "import", str(source), "--kind", "trtllm-engine", "--model", "m", "--gpu",
        "h100", "--ready")
    run(env, "fetch", published.digest, "-o", str(tmp_path / "out"))
    run(env, "fsck")
