"""The lease heartbeat (`registry.sql.heartbeat`), with real builders (`enginectl build` and
`nightly` with the tests/fakes stand-ins) against a real registry: PostgreSQL connections
dropped under a builder (`pg_terminate_backend`, its role refused a login for a while) never
hand its key to a second builder; a registry out of reach past the lease loses it; a
publish's pending row is kept alive the same way.

A lease taken away while it works is test_lease_taken_away.py; the take-over of a gone
holder's lease, test_lease_takeover.py.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import RegistryError
from registry.identity.digest import Digest
from registry.ops.fetch import fetch
from registry.ops.fsck import fsck
from registry.ops.gc import gc
from registry.ops.pending import Pending
from registry.ops.publish import Publication, PublishSpec
from registry.sql import leases, records
from registry.sql.db import open_registry
from registry.sql.heartbeat import Heartbeat
from registry.sql.models import PendingPublish
from registry.sql.pending_publishes import drop_pending
from tests.helpers import builder_env
from tests.integration.builds import (
    GUARD_S,
    SMALL_ENGINE,
    counts,
    engine_key,
    engines,
    lease_of,
    start,
    wait_for_pidfile,
    waiting_for_the_engine,
    write_recipe,
)
from tests.integration.db_fixtures import POSTGRES_URL
from tests.integration.engines import make_engine

pytestmark = pytest.mark.waits  # on lease time-outs and dropped connections: spread (conftest)


def release(fifo: Path) -> None:
    """Let the stand-in trtllm-build waiting on *fifo* go on (nothing, when none reads it)."""
    with contextlib.suppress(OSError):
        handle = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(handle, b"go")
        finally:
            os.close(handle)


# --- PostgreSQL connections dropped under a builder ---------------------------------------------


def _admin() -> psycopg.Connection[Any]:
    """Raw SQL from here: the database's own roles and connections are what these tests drop."""
    url = make_url(POSTGRES_URL).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


class Blip:
    """A login role of its own for one builder, whose PostgreSQL connections the test drops
    (`pg_terminate_backend`) and, for a while, refuses (NOLOGIN): a database restart or a
    network blip, seen by that builder only."""

    def __init__(self, postgres_url: str) -> None:
        self.role = f"hb_{uuid.uuid4().hex[:12]}"
        self.url = make_url(postgres_url).set(username=self.role).render_as_string(
            hide_password=False)
        self.admin = _admin()
        self.admin.execute(f'CREATE ROLE "{self.role}" LOGIN SUPERUSER')

    def drop_connections(self) -> int:
        rows = self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
            (self.role,)).fetchall()
        return len(rows)

    def refuse(self, seconds: float) -> None:
        """Drop the role's connections and refuse new ones for *seconds*."""
        self.admin.execute(f'ALTER ROLE "{self.role}" NOLOGIN')
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.drop_connections()
                time.sleep(0.1)
        finally:
            self.admin.execute(f'ALTER ROLE "{self.role}" LOGIN')

    def close(self) -> None:
        self.admin.execute(f'ALTER ROLE "{self.role}" LOGIN')
        self.drop_connections()
        self.admin.execute(f'DROP ROLE "{self.role}"')
        self.admin.close()


@pytest.fixture
def blip(postgres_url: str) -> Iterator[Blip]:
    open_registry(postgres_url).close()  # the schema belongs to the admin, not the role
    made = Blip(postgres_url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def env(tmp_path: Path, postgres_url: str) -> dict[str, str]:
    return builder_env(tmp_path, postgres_url)


BLIP_TTL_S = 12.0


def test_dropped_connections_never_hand_the_key_to_a_second_builder(
    env: dict[str, str], tmp_path: Path, postgres_url: str, blip: Blip
) -> None:
    """The builder holding the engine's lease has its PostgreSQL connections dropped again
    and again, twice refused for longer than a renewal interval, while a second builder
    waits for the key: the holder's heartbeat retries until the database answers again and
    keeps the lease, so the waiting builder never takes the key over and reuses the one
    engine the holder publishes."""
    recipe = write_recipe(tmp_path)
    env = {**env, "ENGINECTL_LEASE_TTL_S": str(BLIP_TTL_S)}
    engine = engine_key(env, recipe)
    fifo, pidfile = tmp_path / "release-the-build", tmp_path / "trtllm-build.pid"
    os.mkfifo(fifo)
    holding = {**env, "ENGINECTL_REGISTRY_URL": blip.url,
               "FAKE_TRTLLM_WAIT_FIFO": str(fifo), "FAKE_TRTLLM_PIDFILE": str(pidfile)}
    first = start(holding, recipe, "--only", SMALL_ENGINE)
    try:
        wait_for_pidfile(first, pidfile)
        second = start(env, recipe, "--only", SMALL_ENGINE)
        waiting_for_the_engine(second)
        holder = lease_of(postgres_url, engine).owner
        for _ in range(2):  # right after a renewal, refuse past the next one
            seen = lease_of(postgres_url, engine)
            deadline = time.monotonic() + GUARD_S
            while (now := lease_of(postgres_url, engine)) == seen:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            if now.owner != holder:
                break  # taken over: the assertions below say so
            blip.refuse(BLIP_TTL_S / 3 + 1)
        dropped = 0
        for _ in range(int(BLIP_TTL_S * 5)):  # a TTL more of connections dropped as they come
            dropped += blip.drop_connections()
            time.sleep(0.2)
        assert lease_of(postgres_url, engine).owner == holder, "the key was taken over"
        assert dropped > 0  # its renewals kept coming, through new connections
        assert second.poll() is None
    finally:
        release(fifo)
    out_first, err_first = first.communicate(timeout=GUARD_S)
    out_second, err_second = second.communicate(timeout=GUARD_S)
    assert (first.returncode, second.returncode) == (0, 0), (err_first, err_second)
    assert counts(out_first)["built"] == 3
    assert counts(out_second) == {"built": 0, "reused": 3, "failed": 0, "skipped": 0}
    assert len(engines(postgres_url)) == 1
    assert lease_of(postgres_url, engine).status == "succeeded"


def test_a_registry_out_of_reach_past_the_lease_loses_it(blip: Blip) -> None:
    """No renewal gets through for most of the TTL: the heartbeat gives the lease up (its
    holder must stop before another builder may take the key) and says why."""
    key = "k1:unreachable"
    with open_registry(blip.url) as registry:
        with registry.session() as session:
            assert leases.try_acquire_lease(session, key, owner="me", host="h", pid=1,
                                            ttl_s=3.0)
        lost = threading.Event()
        reasons: list[str] = []

        def on_lost(reason: str) -> None:
            reasons.append(reason)
            lost.set()

        blip.admin.execute(f'ALTER ROLE "{blip.role}" NOLOGIN')
        blip.drop_connections()
        with Heartbeat(registry, key, owner="me", ttl_s=3.0, on_lost=on_lost):
            assert lost.wait(GUARD_S)
    assert reasons[0].startswith(f"lease on {key} lost: no renewal reached the registry for ")
    assert "not permitted to log in" in reasons[0]


# --- a publish's pending row (`registry.ops.pending`) --------------------------------------------


PENDING_TTL = timedelta(seconds=BLIP_TTL_S)
NO_GRACE = timedelta(0)  # gc takes every unreferenced blob, however new
ENGINE = PublishSpec("trtllm-engine", {"model": "m", "gpu": "H100-SXM5-80GB", "tp": 2},
                     status="ready")


def _publication(ctx: Context, tmp_path: Path, seed: int) -> Publication:
    source = make_engine(tmp_path / "engine", seed=seed)
    return Publication(ctx, source, ENGINE)


def _pending_expiry(registry_url: str, pending_id: str) -> datetime | None:
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        # the model's column: no registry function reads a pending row's expiry back
        expiry: datetime | None = session.scalar(
            select(PendingPublish.expires_at).where(PendingPublish.id == pending_id))
    return expiry


def _renewed_or_lost(registry_url: str, pending: Pending) -> None:
    """Wait for the next renewal of *pending*'s row (or for its heartbeat to give it up)."""
    seen = _pending_expiry(registry_url, pending.id)
    deadline = time.monotonic() + GUARD_S
    while _pending_expiry(registry_url, pending.id) == seen and pending.lost is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _sizes(publication: Publication) -> dict[Digest, int]:
    assert publication.manifest is not None
    return {entry.xxh3: entry.size for entry in publication.manifest.files}


@pytest.fixture
def blip_ctx(tmp_path: Path, blip: Blip) -> Iterator[Context]:
    """A publisher whose PostgreSQL connections the test drops (`blip`), on a file store."""
    context = Context(RegistryConfig(home=tmp_path / "home",
                                     store_url=(tmp_path / "store").as_uri(),
                                     s3_endpoint_url=None,
                                     registry_url=blip.url, cache_dir=tmp_path / "cache"))
    yield context
    context.close()


def test_dropped_connections_never_let_a_pending_publish_expire(
    blip_ctx: Context, tmp_path: Path, postgres_url: str, blip: Blip
) -> None:
    """A publish's connections are dropped and refused past a renewal of its pending row,
    twice: the heartbeat retries until the database answers and renews the row, so a gc
    (another host, grace 0) meanwhile keeps every blob, and the publish completes."""
    publication = _publication(blip_ctx, tmp_path, seed=1)
    publication.prepare()
    publication.begin(ttl=PENDING_TTL)
    pending = publication.pending
    assert pending is not None
    publication.upload()
    for _ in range(2):
        _renewed_or_lost(postgres_url, pending)  # right after a renewal, refuse past the next
        blip.refuse(BLIP_TTL_S / 3 + 1)
    _renewed_or_lost(postgres_url, pending)  # through a new connection
    assert pending.lost is None
    gc_ctx = Context(replace(blip_ctx.config, registry_url=postgres_url,
                             home=tmp_path / "gc-home", cache_dir=tmp_path / "gc-cache"))
    try:
        collected = gc(gc_ctx, grace=NO_GRACE)
        assert collected.blobs == []
        assert collected.kept_in_flight == len(_sizes(publication))
        assert gc_ctx.store.missing_blobs(_sizes(publication)) == set()
        publication.write_manifest()
        published = publication.commit()
        publication.abort()  # nothing left to drop: the row went with the commit
        assert published.registered
        assert pending.lost is None
        assert _pending_expiry(postgres_url, pending.id) is None
        assert fsck(gc_ctx).problems == []
    finally:
        gc_ctx.close()


def _lose_the_pending_row(ctx: Context, publication: Publication) -> Pending:
    """Begin and upload *publication*, then remove its pending row as gc would (an expired
    row) and wait for its heartbeat to notice; then a gc takes every blob it uploaded."""
    publication.prepare()
    # 12 s, not less: a renewal is given until a sixth of the TTL is left, and on a loaded
    # 2-core machine one took over 1.5 s, so a 3 s TTL lost the row by time-out first.
    publication.begin(ttl=PENDING_TTL)
    pending = publication.pending
    assert pending is not None
    publication.upload()
    with ctx.registry.session() as session:
        drop_pending(session, pending.id)
    deadline = time.monotonic() + GUARD_S
    while pending.lost is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert pending.lost == f"pending publish {pending.id} lost: its row was removed"
    assert set(gc(ctx, grace=NO_GRACE).blobs) == set(_sizes(publication))
    return pending


def test_a_publish_whose_pending_row_is_removed_uploads_its_blobs_again(
    ctx: Context, tmp_path: Path
) -> None:
    """The pending row is removed under a publish (its blobs then collected): the publish
    notices, checks every blob its manifest names and uploads the missing ones again before
    it registers; the artifact fetches whole."""
    publication = _publication(ctx, tmp_path, seed=2)
    _lose_the_pending_row(ctx, publication)
    publication.write_manifest()
    published = publication.commit()
    publication.abort()
    assert published.registered
    assert ctx.store.missing_blobs(_sizes(publication)) == set()
    fetch(ctx, published.digest, tmp_path / "out")
    for path in publication.root.rglob("*"):
        if path.is_file():
            relative = path.relative_to(publication.root)
            assert (tmp_path / "out" / relative).read_bytes() == path.read_bytes()
    assert fsck(ctx).problems == []


def test_a_publish_whose_pending_row_is_removed_and_cannot_upload_again_fails(
    ctx: Context, tmp_path: Path
) -> None:
    """As above, but a collected blob's file is gone by the commit: the publish fails in one
    line saying why (exit 4) and registers nothing that would point at a missing blob."""
    publication = _publication(ctx, tmp_path, seed=3)
    pending = _lose_the_pending_row(ctx, publication)
    publication.write_manifest()
    gone = publication.root / "rank1.engine"
    gone.unlink()
    with pytest.raises(RegistryError) as caught:
        publication.commit()
    publication.abort()
    message = str(caught.value)
    assert caught.value.exit_code == 4
    assert "\n" not in message
    assert message.startswith(f"{publication.root} was not published: {pending.lost}, blob ")
    assert message.endswith("; run the same command again")
    with ctx.registry.session(readonly=True) as session:
        assert records.list_artifacts(session) == []
