"""SQL registry fixtures: a fresh registry URL per test, on SQLite and on real PostgreSQL.

PostgreSQL comes from ENGINECTL_TEST_POSTGRES_URL (default: the local server with trust auth).
Each test gets its own schema (`t_<uuid>`, dropped afterwards) through psycopg's
`options=-csearch_path=...`. When the server is unreachable the PostgreSQL cases skip, or fail
under CI=true.

The `*_worker` functions run in separate processes (multiprocessing "spawn"), so they live
in an importable module and talk back through a queue.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from registry.identity.digest import Digest, sha256_of_json
from registry.sql.db import Registry, open_registry
from registry.sql.engine import make_engine
from registry.sql.leases import try_acquire_lease
from registry.sql.records import ArtifactRecord, FileRecord, add_artifact_if_absent
from registry.sql.schema import current

__all__ = ["postgres_url", "registry", "registry_url"]  # fixtures: tests/conftest.py plugin

POSTGRES_URL = os.environ.get(
    "ENGINECTL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
RACE_TIMEOUT_S = 120  # a guard against a hung child, not a timing assertion


def _postgres_admin() -> psycopg.Connection[Any]:
    conninfo = make_url(POSTGRES_URL).set(drivername="postgresql")
    try:
        return psycopg.connect(
            conninfo.render_as_string(hide_password=False), autocommit=True, connect_timeout=10
        )
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {conninfo.render_as_string()} is unreachable: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema of its own."""
    with postgres_schema() as url:
        yield url


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema of the test database, dropped afterwards, as a registry URL (raw
    SQL: the schema itself is what this makes)."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with _postgres_admin() as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
            yield url.render_as_string(hide_password=False)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty registry URL: a SQLite file that does not exist yet, or an empty schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'home' / 'registry.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    with open_registry(registry_url) as opened:
        yield opened


def _hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def make_record(name: str, **overrides: Any) -> ArtifactRecord:
    """A plausible engine record whose digest and file digests derive from *name*."""
    files = tuple(
        FileRecord(path, size, str(Digest("xxh3-128", _hex(f"{name}/{path}", 32))),
                   str(Digest("sha256", _hex(f"{name}/{path}", 64))))
        for path, size in (("config.json", 2_000), ("rank0.engine", 3 * 2**32))
    )
    values: dict[str, Any] = {
        "digest": str(sha256_of_json({"artifact": name})),
        "kind": "trtllm-engine",
        "key": f"k1:{_hex(name, 64)}",
        "model": "llama-8b",
        "runtime": "trtllm",
        "gpu": "H100-SXM5-80GB",
        "sm": 90,
        "quant": "fp8",
        "kv_cache_dtype": "fp8",
        "tp": 1,
        "pp": 1,
        "max_batch_size": 64,
        "max_input_len": 4096,
        "max_seq_len": 8192,
        "max_num_tokens": 8192,
        "toolchain": {"trtllm": "0.17.0", "cuda": "12.8", "driver": "570.86"},
        "labels": {"recipe": "llama8b-fleet"},
        "size": sum(f.size for f in files),
        "file_count": len(files),
        "status": "built",
        "files": files,
    }
    values.update(overrides)
    return ArtifactRecord(**values)


def run_racers(
    target: Callable[..., None], args: list[tuple[Any, ...]]
) -> list[tuple[str, Any]]:
    """Start one process per *args* entry, all released together by a barrier; return
    what each put on the queue as (name, result). Children report errors as results."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    queue = ctx.Queue()
    processes = [ctx.Process(target=target, args=(*a, barrier, queue)) for a in args]
    for process in processes:
        process.start()
    try:
        results = [queue.get(timeout=RACE_TIMEOUT_S) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=RACE_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        queue.close()
        queue.join_thread()
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return sorted(results, key=lambda item: str(item[0]))


def _report(queue: Any, name: str, body: Callable[[], Any]) -> None:
    try:
        queue.put((name, body()))
    except Exception as exc:  # noqa: BLE001 - the parent asserts on it; a crash would hang it
        queue.put((name, f"error: {exc!r}"))


def open_worker(url: str, name: str, barrier: Any, queue: Any) -> None:
    """Open a registry that may not exist yet, at the same moment as the others."""

    def body() -> str | None:
        barrier.wait(RACE_TIMEOUT_S)
        open_registry(url).close()
        return current(url)

    _report(queue, name, body)


def insert_worker(url: str, name: str, records: list[str], barrier: Any, queue: Any) -> None:
    """Insert the same records as the others, each one released by the barrier together."""

    def body() -> list[bool]:
        inserted = []
        with open_registry(url) as registry:
            for record in records:
                barrier.wait(RACE_TIMEOUT_S)
                with registry.session() as session:
                    inserted.append(add_artifact_if_absent(session, make_record(record)))
        return inserted

    _report(queue, name, body)


def lease_worker(url: str, owner: str, key: str, barrier: Any, queue: Any) -> None:
    """Race the others for the lease on *key*."""

    def body() -> bool:
        with open_registry(url) as registry:
            barrier.wait(RACE_TIMEOUT_S)
            with registry.session() as session:
                won = try_acquire_lease(
                    session, key, owner=owner, host="racer", pid=os.getpid(), ttl_s=600
                )
            # alive until every racer has tried: a winner that exited first is a holder gone
            # from this host, whose lease the next racer rightly takes over (holder_gone)
            barrier.wait(RACE_TIMEOUT_S)
            return won

    _report(queue, owner, body)


def stamp(url: str, revision: str) -> None:
    """Stamp the registry at *url* with schema *revision* (raw SQL: a registry at another
    revision than this enginectl's is what the tests that call this are about)."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()
