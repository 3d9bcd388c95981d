"""publish, fetch, tag, resolve, fsck and gc against real stores and databases.

Every test runs on the file store and on an S3 server over HTTP, each with SQLite and with
PostgreSQL. reindex is test_reindex.py; S3's faults on the way, test_registry_s3.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import (
    IntegrityError,
    ManifestError,
    RecordNotFoundError,
    UsageError,
)
from registry.gpus import lookup_gpu
from registry.identity.digest import Digest, digest_file
from registry.identity.layout import blob_name
from registry.identity.manifest import FileEntry, Manifest
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.aliases import tag, untag
from registry.ops.fetch import fetch
from registry.ops.fsck import fsck
from registry.ops.gc import gc
from registry.ops.publish import publish
from registry.ops.resolve import Request, resolve
from registry.sql import alias_records, records, smoke_records
from tests.integration.engines import engine_spec, make_engine


def test_publish_fetch_round_trip_and_cache(ctx: Context, tmp_path: Path) -> None:
    source = make_engine(tmp_path / "engine")
    published = import_artifact(ctx, source, engine_spec())
    assert published.registered
    assert published.blobs_uploaded == 4
    first = fetch(ctx, published.digest, tmp_path / "out")
    for path in source.rglob("*"):
        if path.is_file():
            fetched = tmp_path / "out" / path.relative_to(source)
            assert fetched.read_bytes() == path.read_bytes()
    assert first.downloaded_bytes == published.manifest.size
    second = fetch(ctx, published.digest[7:19], tmp_path / "again", verify="strict")
    assert second.downloaded_bytes == 0
    assert second.cached_bytes == published.manifest.size


def test_same_content_twice_is_a_no_op_and_files_are_stored_once(
    ctx: Context, tmp_path: Path
) -> None:
    one = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    again = import_artifact(ctx, tmp_path / "a", engine_spec())
    assert again.digest == one.digest
    assert not again.registered
    assert again.blobs_uploaded == 0
    other = import_artifact(ctx, make_engine(tmp_path / "b", seed=2), engine_spec())
    # config.json and the tokenizer are identical: only the two rank files are new
    assert other.blobs_uploaded == 2
    assert len(list(ctx.store.iter_blobs())) == 6


def _flip_one_byte(ctx: Context, digest: Digest, tmp_path: Path) -> None:
    """Corrupt a stored blob the way a disk or a bad copy would."""
    copy = tmp_path / "blob"
    ctx.store.get_blob(digest, copy)
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    if ctx.store.url.startswith("file://"):
        path = Path(ctx.store.url.removeprefix("file://")) / blob_name(digest)
        path.chmod(0o644)
        path.write_bytes(bytes(data))
    else:
        import boto3

        bucket, _, prefix = ctx.store.url.removeprefix("s3://").partition("/")
        client = boto3.client("s3", endpoint_url=ctx.config.s3_endpoint_url)
        client.put_object(Bucket=bucket, Key=f"{prefix}/{blob_name(digest)}", Body=bytes(data))


def _local_context(tmp_path: Path) -> Context:
    return Context(RegistryConfig(
        home=tmp_path / "home", store_url=(tmp_path / "store").as_uri(), s3_endpoint_url=None,
        registry_url=f"sqlite:///{tmp_path / 'r.db'}", cache_dir=tmp_path / "cache",
    ))


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_fetch_tidies_what_killed_fetches_left_beside_its_target(tmp_path: Path) -> None:
    """A staging directory is a killed fill's when it holds its `lock` file, unlocked, and
    nothing but `lock`, `tree` and `old`: removed (its `old` put back when the target is
    gone: killed between the two renames). One whose lock is held (a running fill), one
    without a lock file and one of another target are left alone, whatever their names."""
    ctx = _local_context(tmp_path)
    published = import_artifact(ctx, make_engine(tmp_path / "engine"), engine_spec())
    host, dead = socket.gethostname(), _dead_pid()

    def staging(name: str, *, lock: bool = True) -> Path:
        path = tmp_path / name
        (path / "tree").mkdir(parents=True)
        (path / "tree" / "rank0.engine").write_bytes(b"partial")
        if lock:
            (path / "lock").touch()
        return path

    killed = staging(f".out.pull-{host}-{dead}-abc123")
    running = staging(f".out.pull-{host}-{os.getpid()}-def456")
    unlocked = staging(f".out.pull-{host}-{dead}-ghi789", lock=False)
    other = staging(f".output.pull-{host}-{dead}-jkl012")
    with (running / "lock").open("r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        fetch(ctx, published.digest, tmp_path / "out")
    assert not killed.exists()
    assert all(path.is_dir() for path in (running, unlocked, other))
    assert (unlocked / "tree" / "rank0.engine").read_bytes() == b"partial"

    # Killed between setting the old content aside and renaming the new one in: the old
    # content comes back, and a fetch without --force then refuses to replace it.
    aside = staging(f".mine.pull-{host}-{dead}-mno345")
    (aside / "old").mkdir()
    (aside / "old" / "notes.txt").write_text("my previous engine")
    with pytest.raises(UsageError, match="not empty"):
        fetch(ctx, published.digest, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my previous engine"
    assert not aside.exists()
    ctx.close()


def test_strict_re_hashes_the_cache_and_evicts_a_bad_entry(tmp_path: Path) -> None:
    ctx = _local_context(tmp_path)
    published = import_artifact(ctx, make_engine(tmp_path / "engine"), engine_spec())
    fetch(ctx, published.digest, tmp_path / "first")
    rank0 = next(f for f in published.manifest.files if f.path == "rank0.engine")
    entry = ctx.cache.path(rank0.xxh3)
    entry.chmod(0o644)  # what a disk error would do to a cache entry, silently:
    data = bytearray(entry.read_bytes())
    data[0] ^= 0x01
    entry.write_bytes(bytes(data))
    ctx.cache._stamp(entry)  # ...with its inode looking as verified (no edit to notice)
    with pytest.raises(IntegrityError) as caught:
        fetch(ctx, published.digest, tmp_path / "strict", verify="strict")
    assert "rank0.engine" in str(caught.value)
    assert caught.value.expected == rank0.xxh3
    assert not (tmp_path / "strict").exists()
    assert not entry.exists()  # evicted: the next fetch downloads it again
    again = fetch(ctx, published.digest, tmp_path / "strict", verify="strict")
    assert again.downloaded_bytes == rank0.size
    assert (tmp_path / "strict" / "rank0.engine").read_bytes() == (
        tmp_path / "engine" / "rank0.engine").read_bytes()
    ctx.close()


def test_gc_removes_old_temp_entries_of_the_fetch_cache(tmp_path: Path) -> None:
    ctx = _local_context(tmp_path)
    published = import_artifact(ctx, make_engine(tmp_path / "engine"), engine_spec())
    fetch(ctx, published.digest, tmp_path / "out")
    entry = ctx.cache.path(published.manifest.files[0].xxh3)
    partial = entry.parent / ".tmp-0123456789abcdef"
    partial.write_bytes(b"half a blob")
    assert gc(ctx, dry_run=True).partial == 0  # younger than the grace period
    later = datetime.now(UTC) + timedelta(days=8)
    assert gc(ctx, dry_run=True, now=later).partial == 1
    assert partial.exists()
    assert gc(ctx, now=later).partial == 1
    assert not partial.exists()
    assert entry.exists()  # finished entries stay
    ctx.close()


def test_a_flipped_byte_fails_fetch_and_fsck_and_leaves_the_target_alone(
    ctx: Context, tmp_path: Path
) -> None:
    published = import_artifact(ctx, make_engine(tmp_path / "engine"), engine_spec())
    rank1 = next(f for f in published.manifest.files if f.path == "rank1.engine")
    _flip_one_byte(ctx, rank1.xxh3, tmp_path)
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(IntegrityError) as caught:
        fetch(ctx, published.digest, target)
    message = str(caught.value)
    assert "rank1.engine" in message
    assert str(rank1.xxh3) in message
    assert str(caught.value.actual) in message
    assert caught.value.actual != rank1.xxh3
    assert list(target.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    found = fsck(ctx)
    checked, problems = found.checked, found.problems
    assert checked == 1
    assert len(problems) == 1
    assert "rank1.engine" in str(problems[0])


def _entry(path: str) -> FileEntry:
    return FileEntry(path, 1, Digest("xxh3-128", "0" * 32), Digest("sha256", "0" * 64))


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "a//b", "a\\b"])
def test_unsafe_manifest_paths_are_refused_on_fetch(
    ctx: Context, tmp_path: Path, path: str
) -> None:
    honest = Manifest(kind="vllm", files=(_entry("ok"),), labels={"model": "m"})
    raw = honest.as_dict()
    raw["files"][0]["path"] = path
    data = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
    from registry.identity.digest import sha256_of

    forged = sha256_of(data)
    ctx.store.put_manifest(forged, data)
    with pytest.raises(ManifestError):
        fetch(ctx, str(forged), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "escape").exists()


def test_duplicate_paths_and_file_directory_clashes_are_refused() -> None:
    with pytest.raises(ManifestError, match="duplicate"):
        Manifest(kind="vllm", files=(_entry("a"), _entry("a")))
    with pytest.raises(ManifestError, match="both a file and a directory"):
        Manifest(kind="vllm", files=(_entry("a"), _entry("a/b")))


def test_import_refuses_links_and_incomplete_engines(ctx: Context, tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "engine")
    (engine / "link").symlink_to("/etc/passwd")
    with pytest.raises(ManifestError, match="symbolic link"):
        import_artifact(ctx, engine, engine_spec())
    (engine / "link").unlink()
    (engine / "rank1.engine").unlink()
    with pytest.raises(ManifestError, match=r"rank1\.engine"):
        import_artifact(ctx, engine, engine_spec())
    with pytest.raises(UsageError, match="--gpu"):
        import_artifact(ctx, engine, engine_spec(gpu=None))
    with ctx.registry.session(readonly=True) as session:
        assert records.list_artifacts(session) == []


def test_refs_aliases_and_history(ctx: Context, tmp_path: Path) -> None:
    one = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    two = import_artifact(ctx, make_engine(tmp_path / "b", seed=2), engine_spec())
    assert tag(ctx, one.digest[7:19], "m/h100/prod") == (one.digest, None)
    assert tag(ctx, two.digest, "m/h100/prod", note="promote") == (two.digest, one.digest)
    with pytest.raises(UsageError, match="too short"):
        tag(ctx, one.digest[7:15], "x")
    with pytest.raises(UsageError, match="not a valid name"):
        tag(ctx, one.digest, "deadbeefdeadbeef")
    built = import_artifact(ctx, make_engine(tmp_path / "c", seed=3), engine_spec(status="built"))
    with pytest.raises(UsageError, match="not ready"):
        tag(ctx, built.digest, "m/h100/canary")
    assert tag(ctx, built.digest, "m/h100/canary", allow_unready=True)[0] == built.digest
    with ctx.registry.session(readonly=True) as session:
        (event,) = alias_records.alias_history(session, "m/h100/canary")
    assert event.note is not None
    assert event.note.startswith("override: tagged while built")
    with ctx.registry.session() as session:
        records.set_status(session, two.digest, "quarantined", "smoke failed")
    with pytest.raises(UsageError, match="quarantined"):
        tag(ctx, two.digest, "m/h100/other", allow_unready=True)
    assert untag(ctx, "m/h100/prod") == two.digest
    with pytest.raises(RecordNotFoundError):
        fetch(ctx, "m/h100/prod", tmp_path / "out")
    with ctx.registry.session(readonly=True) as session:
        history = alias_records.alias_history(session, "m/h100/prod")
    assert [(e.digest, e.previous_digest) for e in history] == [
        (one.digest, None), (two.digest, one.digest), (None, two.digest),
    ]


def test_resolve_ranks_engines_then_checkpoints_then_vllm(ctx: Context, tmp_path: Path) -> None:
    engine = import_artifact(ctx, make_engine(tmp_path / "e", seq=8192), engine_spec())
    short = import_artifact(ctx, make_engine(tmp_path / "s", seed=3, seq=1024), engine_spec())
    a100 = import_artifact(ctx, make_engine(tmp_path / "a", seed=4), engine_spec(gpu="a100",
                                                                                   quant="bf16"))
    checkpoint_dir = tmp_path / "ckpt"
    checkpoint_dir.mkdir()
    (checkpoint_dir / "config.json").write_text("{}")
    checkpoint = import_artifact(ctx, checkpoint_dir, ImportSpec(
        kind="trtllm-checkpoint", model="m", quant="fp8", status="ready",
        shape={"max_seq_len": 8192, "max_batch_size": 8}))
    empty = tmp_path / "vllm"
    empty.mkdir()
    vllm = import_artifact(ctx, empty, ImportSpec(
        kind="vllm", model="m", quant="bf16", status="ready",
        shape={"max_seq_len": 8192, "max_batch_size": 8}))
    built = import_artifact(ctx, make_engine(tmp_path / "n", seed=5), engine_spec(status="built"))

    # the order of kinds, shapes and GPUs among what has no proof yet (proofs: test_resolve_*)
    ranked = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100"), min_seq_len=4096,
                                  allow_unproven=True), explain=True)
    assert [c.digest for c in ranked.candidates] == [engine.digest, checkpoint.digest,
                                                      vllm.digest]
    reasons = {c.digest: reason for c, reason in ranked.rejected}
    assert "shape too small" in reasons[short.digest]
    assert "GPU mismatch" in reasons[a100.digest]
    assert "not ready" in reasons[built.digest]

    on_a100 = resolve(ctx, Request(model="m", gpu=lookup_gpu("a100"), allow_unproven=True),
                      explain=True)
    assert [c.digest for c in on_a100.candidates][:1] == [a100.digest]
    assert vllm.digest in [c.digest for c in on_a100.candidates]
    assert checkpoint.digest not in [c.digest for c in on_a100.candidates]  # fp8 on SM 80
    preferred = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100"), prefer=("vllm",),
                                     allow_unproven=True))
    assert preferred.candidates[0].digest == vllm.digest


def test_resolve_ranks_by_the_latest_passing_smoke_throughput(
    ctx: Context, tmp_path: Path
) -> None:
    """The latest proof counts, not the best ever: peaky's 800 was re-proved at 300."""
    unsmoked = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    steady = import_artifact(ctx, make_engine(tmp_path / "b", seed=2), engine_spec())
    peaky = import_artifact(ctx, make_engine(tmp_path / "c", seed=3), engine_spec())
    with ctx.registry.session() as session:
        for digest, passed, tokens in ((steady.digest, True, 500.0),
                                       (steady.digest, False, 9000.0),  # a failure never counts
                                       (peaky.digest, True, 800.0),
                                       (peaky.digest, True, 300.0)):
            smoke_records.add_smoke_report(session, digest, passed,
                                           {"best_output_tokens_per_s": tokens},
                                           gpu="H100-SXM5-80GB")
    ranked = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100")))
    assert [(c.digest, c.tokens_per_s) for c in ranked.candidates] == [
        (steady.digest, 500.0), (peaky.digest, 300.0),  # never proven here: not handed out
    ]
    anyway = resolve(ctx, Request(model="m", gpu=lookup_gpu("h100"), allow_unproven=True))
    assert [(c.digest, c.tokens_per_s) for c in anyway.candidates] == [
        (steady.digest, 500.0), (peaky.digest, 300.0), (unsmoked.digest, None),
    ]


def test_gc_removes_only_unreferenced_old_blobs(ctx: Context, tmp_path: Path) -> None:
    kept = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    stray = tmp_path / "stray.bin"
    stray.write_bytes(os.urandom(1000))
    stray_digest = digest_file(stray).xxh3
    ctx.store.put_blob(stray_digest, stray)  # what a publish killed before its manifest leaves
    _leave_a_partial_write(ctx)  # what a publish killed in the middle of a blob leaves
    assert gc(ctx, dry_run=True).blobs == []  # younger than the default grace
    later = datetime.now(UTC) + timedelta(days=8)
    dry = gc(ctx, dry_run=True, now=later)
    assert dry.blobs == [stray_digest]
    assert ctx.store.has_blob(stray_digest)
    assert dry.partial == 1
    done = gc(ctx, now=later)
    assert done.blobs == [stray_digest]
    assert not ctx.store.has_blob(stray_digest)
    assert done.partial == 1
    assert gc(ctx, now=later).partial == 0
    assert fetch(ctx, kept.digest, tmp_path / "out").manifest.digest == kept.manifest.digest
    assert fsck(ctx).problems == []


def _leave_a_partial_write(ctx: Context) -> None:
    if ctx.store.url.startswith("file://"):
        shard = Path(ctx.store.url.removeprefix("file://")) / "blobs" / "xxh3-128" / "ab"
        shard.mkdir(parents=True, exist_ok=True)
        (shard / ".cdef.0123456789abcdef.tmp").write_bytes(b"half a blob")
        return
    import boto3

    bucket, _, prefix = ctx.store.url.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=ctx.config.s3_endpoint_url)
    client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/blobs/xxh3-128/ab/cdef")


def test_gc_removes_manifests_of_deleted_artifacts(ctx: Context, tmp_path: Path) -> None:
    doomed = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), engine_spec())
    with ctx.registry.session() as session:
        records.mark_deleted(session, doomed.digest, "test")
    result = gc(ctx, now=datetime.now(UTC) + timedelta(days=8))
    assert result.manifests == [doomed.digest]
    assert len(result.blobs) == 4
    assert not ctx.store.has_manifest(Digest.parse(doomed.digest))


def test_publish_keeps_labels_and_manifest_fields(ctx: Context, tmp_path: Path) -> None:
    root = tmp_path / "entry"
    root.mkdir()
    (root / "runtime.json").write_text("{}")
    published = publish(
        ctx, root, kind="vllm", labels={"model": "m", "tp": 2, "quant": "fp8", "gpu": None},
        key="k1:" + "a" * 64, toolchain={"vllm": "0.32.0"},
        serve={"argv": ["python", "-m", "vllm.entrypoints.openai.api_server"]},
    )
    with ctx.registry.session(readonly=True) as session:
        record = records.get_artifact(session, published.digest)
    assert record is not None
    assert (record.kind, record.tp, record.quant, record.key) == ("vllm", 2, "fp8",
                                                                   "k1:" + "a" * 64)
    assert published.manifest.serve == {"argv": ["python", "-m",
                                                 "vllm.entrypoints.openai.api_server"]}


