"""gc never takes what a publish in progress or history relies on (issue 10, items 1 and 5).

The race of item 1, made deterministic: blobs an earlier, killed import left behind are old
and unreferenced; a new import of the same content finds them present and skips uploading
them; gc deletes them before the new manifest lands; the import used to exit 0 for an
artifact that could never be fetched. Here gc runs between every two phases of a
`Publication`, and inside gc (mark, then the publish's first phases, then sweep), on every
store × database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from registry.context import Context
from registry.identity.digest import Digest, digest_file
from registry.ops import history
from registry.ops.fetch import fetch
from registry.ops.fsck import fsck
from registry.ops.gc import Collected, Collector, gc
from registry.ops.logs import release_lease_with_log
from registry.ops.publish import Publication, PublishSpec, digest_directory
from registry.sql import leases, records
from registry.sql.db import open_registry
from tests.integration.db_fixtures import postgres_schema
from tests.integration.engines import make_engine

PHASES = ("prepare", "begin", "upload", "write_manifest", "commit")
NOW = timedelta(0)  # a grace of 0 s: every unreferenced blob is old enough to go
ENGINE = PublishSpec("trtllm-engine", {"model": "m", "gpu": "H100-SXM5-80GB", "tp": 2},
                     status="ready")


def _leave_blobs_of(ctx: Context, source: Path) -> set[Digest]:
    """What an import killed before its manifest leaves: every blob, no manifest."""
    left = set()
    for entry, path in digest_directory(source):
        ctx.store.put_blob(entry.xxh3, path)
        left.add(entry.xxh3)
    return left


def _publication(ctx: Context, source: Path) -> Publication:
    return Publication(ctx, source, ENGINE)


def _fetches_whole(ctx: Context, digest: str, source: Path, out: Path) -> None:
    fetch(ctx, digest, out)
    for path in source.rglob("*"):
        if path.is_file():
            assert (out / path.relative_to(source)).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("gap", range(1, len(PHASES)))
def test_gc_between_two_phases_of_a_publish_takes_nothing_it_relies_on(
    ctx: Context, tmp_path: Path, gap: int
) -> None:
    source = make_engine(tmp_path / "engine", seed=gap)
    left = _leave_blobs_of(ctx, source)
    publication = _publication(ctx, source)
    for phase in PHASES[:gap]:
        getattr(publication, phase)()
    collected = gc(ctx, grace=NOW)
    if gap == 1:  # after prepare, before begin: nothing relies on them yet
        assert set(collected.blobs) == left
    else:  # begun: the pending publish keeps them
        assert collected.blobs == []
        assert collected.kept_in_flight == len(left)
    for phase in PHASES[gap:-1]:
        getattr(publication, phase)()
    published = publication.commit()
    assert published.registered
    _fetches_whole(ctx, published.digest, source, tmp_path / "out")
    assert fsck(ctx).problems == []
    assert gc(ctx, grace=NOW).blobs == []  # registered: referenced for good


def test_a_sweep_marked_before_the_publish_began_is_put_right_at_commit(
    ctx: Context, tmp_path: Path
) -> None:
    """gc marks (no pending publish yet), the publish begins and finds the old blobs
    present (uploads none), gc sweeps them: the commit, which cannot start while gc holds
    its lock, uploads them again before it registers."""
    source = make_engine(tmp_path / "engine")
    left = _leave_blobs_of(ctx, source)
    publication = _publication(ctx, source)
    publication.prepare()
    collector = Collector(ctx, grace=NOW)
    with ctx.registry.gc_lock(shared=False):
        collector.mark()
        publication.begin()
        publication.upload()
        assert publication.pending is not None
        assert publication.pending.uploaded == []  # they were there
        swept = collector.sweep()
        assert set(swept.blobs) == left  # unreferenced when gc marked
        with ctx.registry.gc_lock(shared=True, blocking=False) as held:
            assert not held  # no publish registers while gc runs
    publication.write_manifest()
    published = publication.commit()
    assert published.registered
    assert ctx.store.missing_blobs(left) == set()
    _fetches_whole(ctx, published.digest, source, tmp_path / "out")
    assert fsck(ctx).problems == []


class _GcMidUpload:
    """A publish's progress that runs `gc --grace 0` once, when the first bytes of a blob
    have gone up and the blob is not complete (a temp file in a file store, a multipart
    upload in S3): the race of issue 21, item 11, at the one place it hurt."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.uploading = False
        self.collected: Collected | None = None
        self._lock = threading.Lock()

    def start(self, description: str, total_bytes: int) -> None:
        del total_bytes
        self.uploading = description == "uploading"

    def advance(self, nbytes: int) -> None:
        del nbytes
        with self._lock:
            if self.uploading and self.collected is None:
                self.collected = gc(self.ctx, grace=NOW)

    def finish(self) -> None:
        self.uploading = False


def test_gc_with_no_grace_in_the_middle_of_an_upload_takes_nothing_it_is_writing(
    ctx: Context, tmp_path: Path
) -> None:
    """`gc --grace 0` while an import is uploading a blob: the half-written blob (a temp
    file beside its key, an unfinished multipart upload) belongs to a publish in flight,
    so gc leaves it, and the import completes (it used to fail, exit 4, its temp file or
    its multipart upload taken from under it)."""
    source = make_engine(tmp_path / "engine")
    (source / "rank1.engine").write_bytes(os.urandom(3 * (5 << 20) + 123))
    if hasattr(ctx.store, "upload_part_size"):  # S3: a multipart upload of 5 MiB parts
        ctx.store.upload_part_size = 5 << 20
    progress = _GcMidUpload(ctx)
    publication = Publication(ctx, source, ENGINE, progress=progress)
    published = publication.run()
    assert progress.collected is not None  # gc ran, mid-upload
    assert progress.collected.partial == 0
    assert progress.collected.blobs == []
    assert published.registered
    _fetches_whole(ctx, published.digest, source, tmp_path / "out")
    assert fsck(ctx).problems == []


def test_while_a_publish_commits_gc_waits(ctx: Context, tmp_path: Path) -> None:
    with (ctx.registry.gc_lock(shared=True), ctx.registry.gc_lock(shared=True),
          ctx.registry.gc_lock(shared=False, blocking=False) as held):
        assert not held  # two publishes at once, and gc waits for both
    with ctx.registry.gc_lock(shared=False, blocking=False) as held:
        assert held
    del tmp_path


def test_registries_in_two_schemas_of_one_database_have_a_gc_lock_each(postgres_url: str) -> None:
    """PostgreSQL's advisory locks are per database: a gc of one team's registry (its own
    schema) must not hold up another's publishes, nor be blocked by them."""
    with (open_registry(postgres_url) as one, postgres_schema() as other_url,
          open_registry(other_url) as other, one.gc_lock(shared=False)):
        with other.gc_lock(shared=False, blocking=False) as held:
            assert held
        with one.gc_lock(shared=True, blocking=False) as held:
            assert not held  # the lock still works within a registry


def test_a_killed_publishers_pending_row_expires(ctx: Context, tmp_path: Path) -> None:
    source = make_engine(tmp_path / "engine")
    left = _leave_blobs_of(ctx, source)
    publication = _publication(ctx, source)
    publication.prepare()
    publication.begin()  # and then the process dies: nothing ends the pending row
    assert gc(ctx, grace=NOW).blobs == []
    later = datetime.now(UTC) + timedelta(days=8)
    collected = gc(ctx, now=later)
    assert set(collected.blobs) == left
    assert collected.expired_publishes == 1
    publication.abort()


def test_gc_keeps_stage_logs_smoke_logs_and_what_alias_history_names(
    ctx: Context, tmp_path: Path
) -> None:
    from registry.ops.adopt import ImportSpec, import_artifact
    from registry.ops.aliases import tag, untag

    log = tmp_path / "build.log"
    log.write_text("trtllm-build: engine written\n")
    key = "k1:" + "7" * 64
    with ctx.registry.session() as session:
        assert leases.try_acquire_lease(session, key, owner="me", host="h", pid=1, ttl_s=60)
    assert release_lease_with_log(ctx, key, owner="me", status="succeeded", log=log)
    engine = make_engine(tmp_path / "engine")
    old = import_artifact(ctx, engine, ImportSpec(kind="trtllm-engine", model="m", gpu="h100",
                                                  status="ready"))
    smoke_log = tmp_path / "smoke.log"
    smoke_log.write_text("vllm: serving\n")
    history.record_smoke(ctx, old.digest, True, {"best_output_tokens_per_s": 1.0},
                         status="ready", log=smoke_log)
    tag(ctx, old.digest, "m/prod")
    untag(ctx, "m/prod")
    with ctx.registry.session() as session:
        history.set_status_and_record(ctx.store, session, old.digest, "deleted", "retired")
    later = datetime.now(UTC) + timedelta(days=30)
    collected = gc(ctx, now=later)
    assert collected.blobs == []
    assert collected.manifests == []  # aliased once: kept, deleted or not
    logs = {digest_file(p, with_sha256=False).xxh3 for p in (log, smoke_log)}
    assert ctx.store.missing_blobs(logs) == set()
    assert collected.kept_for_history >= 2


def test_gc_past_its_grace_keeps_an_unregistered_manifest_and_its_blobs(
    ctx: Context, tmp_path: Path
) -> None:
    """A manifest the registry lacks (a publish about to register, or a store waiting for
    reindex) keeps itself and its blobs, however old."""
    source = make_engine(tmp_path / "engine")
    publication = _publication(ctx, source)
    for phase in PHASES[:4]:
        getattr(publication, phase)()
    publication.abort()  # killed after the manifest: no row, no pending publish
    later = datetime.now(UTC) + timedelta(days=30)
    collected = gc(ctx, now=later)
    digest = str(publication.manifest.digest)  # type: ignore[union-attr]
    assert collected.unregistered_manifests == [digest]
    assert collected.blobs == []
    assert ctx.store.has_manifest(Digest.parse(digest))
    fetch(ctx, digest, tmp_path / "out")  # a full digest fetches from the store alone


def test_gc_past_its_grace_frees_a_deleted_artifact_but_not_the_blobs_it_shares(
    ctx: Context, tmp_path: Path
) -> None:
    from registry.ops.adopt import ImportSpec, import_artifact

    spec = ImportSpec(kind="trtllm-engine", model="m", gpu="h100", status="ready")
    kept = import_artifact(ctx, make_engine(tmp_path / "a", seed=1), spec)
    doomed = import_artifact(ctx, make_engine(tmp_path / "b", seed=2), spec)
    shared = {f.xxh3 for f in kept.manifest.files} & {f.xxh3 for f in doomed.manifest.files}
    own = {f.xxh3 for f in doomed.manifest.files} - shared
    assert shared  # config.json and the tokenizer are the same bytes
    assert own
    with ctx.registry.session() as session:
        history.set_status_and_record(ctx.store, session, doomed.digest, "deleted", "retired")
    later = datetime.now(UTC) + timedelta(days=8)
    collected = gc(ctx, now=later)
    assert collected.manifests == [doomed.digest]
    assert set(collected.blobs) == own
    assert ctx.store.missing_blobs(shared) == set()
    _fetches_whole(ctx, kept.digest, tmp_path / "a", tmp_path / "out")
    assert fsck(ctx).problems == []


def test_logs_prints_a_stage_runs_log_after_gc(ctx: Context, tmp_path: Path) -> None:
    """`enginectl logs KEY` and `enginectl logs REF --smoke`, as a user runs them."""
    from registry.ops.adopt import ImportSpec, import_artifact

    log = tmp_path / "build.log"
    log.write_bytes(b"line one\nline two\n")
    key = "k1:" + "8" * 64
    with ctx.registry.session() as session:
        leases.try_acquire_lease(session, key, owner="me", host="h", pid=1, ttl_s=60)
    release_lease_with_log(ctx, key, owner="me", status="failed", error="boom", log=log)
    imported = import_artifact(ctx, make_engine(tmp_path / "engine"),
                               ImportSpec(kind="trtllm-engine", model="m", gpu="h100"))
    smoke_log = tmp_path / "smoke.log"
    smoke_log.write_bytes(b"server says hi\n")
    history.record_smoke(ctx, imported.digest, False, {"failure": "x"}, status="quarantined",
                         log=smoke_log)
    gc(ctx, grace=NOW)
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_STORE_URL": ctx.config.store_url,
           "ENGINECTL_REGISTRY_URL": ctx.config.registry_url,
           "ENGINECTL_CACHE_DIR": str(tmp_path / "cache")}
    if ctx.config.s3_endpoint_url:
        env["ENGINECTL_S3_ENDPOINT_URL"] = ctx.config.s3_endpoint_url
    enginectl = str(Path(sys.executable).parent / "enginectl")

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([enginectl, *args], env=env, capture_output=True, check=False,
                              timeout=120)

    assert run("logs", key).stdout == b"line one\nline two\n"
    assert run("logs", imported.digest, "--smoke").stdout == b"server says hi\n"
    missing = run("logs", imported.digest)
    assert missing.returncode == 6  # not found
    assert missing.stderr.decode().count("\n") == 1
    assert "imported, not built" in missing.stderr.decode()


def test_publishing_a_deleted_artifact_again_brings_it_back_even_if_gc_took_its_manifest(
    ctx: Context, tmp_path: Path
) -> None:
    source = make_engine(tmp_path / "engine")
    first = _publication(ctx, source).run()
    with ctx.registry.session() as session:
        history.set_status_and_record(ctx.store, session, first.digest, "deleted", "retired")
    again = _publication(ctx, source)
    for phase in PHASES[:4]:
        getattr(again, phase)()
    collected = gc(ctx, grace=NOW)
    assert collected.manifests == [first.digest]  # gc saw a deleted artifact's manifest
    assert collected.blobs == []  # the pending publish kept its blobs
    published = again.commit()
    assert not published.registered  # the row was there, deleted
    with ctx.registry.session(readonly=True) as session:
        assert records.get_status(session, first.digest) == "ready"
    _fetches_whole(ctx, first.digest, source, tmp_path / "out")
    assert fsck(ctx).problems == []
