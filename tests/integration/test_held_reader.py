"""resolve reads on one driver connection a `Context` holds (`registry.sql.held`): it sees
what was written after it opened, a driver error on it comes out in one line as enginectl's
error (never the driver's), and `Context.close` closes it; a registry not at the schema head
is refused as opening it for reading refuses it. On SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.config import RegistryConfig
from registry.context import Context
from registry.errors import NoRegistryError, RegistryError, UnknownModelError
from registry.gpus import lookup_gpu
from registry.ops.resolve import Request, resolve
from registry.sql import records, smoke_records
from registry.sql.db import open_registry
from tests.integration.db_fixtures import make_record

H100 = "H100-SXM5-80GB"


def _context(registry_url: str, home: Path) -> Context:
    config = RegistryConfig(home=home, store_url=(home / "store").as_uri(),
                            s3_endpoint_url=None, registry_url=registry_url,
                            cache_dir=home / "cache")
    return Context(config, readonly=True)


def _add_proven(registry_url: str, name: str) -> str:
    record = make_record(name, status="ready")
    with open_registry(registry_url) as registry, registry.session() as session:
        records.add_artifact(session, record)
        smoke_records.add_smoke_report(session, record.digest, True,
                                       {"best_output_tokens_per_s": 250.0}, gpu=H100,
                                       toolchain={"trtllm": "0.17.0"})
    return record.digest


def test_a_held_reader_sees_later_writes_and_closes_with_its_context(
    registry_url: str, tmp_path: Path
) -> None:
    first = _add_proven(registry_url, "first")
    ctx = _context(registry_url, tmp_path)
    request = Request(model="llama-8b", gpu=lookup_gpu("h100"))
    try:
        assert [c.digest for c in resolve(ctx, request).candidates] == [first]
        held = ctx.reader
        second = _add_proven(registry_url, "second")  # written after the reader opened
        ranked = resolve(ctx, request)
        assert ctx.reader is held  # the same connection, not a new one per call
        assert sorted(c.digest for c in ranked.candidates) == sorted([first, second])
        with pytest.raises(UnknownModelError):
            resolve(ctx, Request(model="llama-9b", gpu=lookup_gpu("h100")))
    finally:
        ctx.close()
    assert "reader" not in ctx.__dict__
    try:  # opened again after close
        assert len(resolve(ctx, request).candidates) == 2
    finally:
        ctx.close()


def test_a_driver_error_on_the_held_reader_is_one_line(
    registry_url: str, tmp_path: Path
) -> None:
    _add_proven(registry_url, "first")
    ctx = _context(registry_url, tmp_path)
    request = Request(model="llama-8b", gpu=lookup_gpu("h100"))
    try:
        resolve(ctx, request)
        with open_registry(registry_url) as registry, registry.session() as session:
            from sqlalchemy import text

            session.execute(text("DROP TABLE smoke_reports"))
        with pytest.raises(RegistryError) as raised:
            resolve(ctx, request)
    finally:
        ctx.close()
    assert type(raised.value) is RegistryError
    assert "smoke_reports" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_no_registry_is_refused_as_a_read_refuses_it(tmp_path: Path) -> None:
    ctx = _context(f"sqlite:///{tmp_path / 'none' / 'registry.db'}", tmp_path)
    with pytest.raises(NoRegistryError):
        resolve(ctx, Request(model="llama-8b", gpu=lookup_gpu("h100")))
    assert not (tmp_path / "none").exists()


def test_another_thread_reads_on_a_connection_of_its_own(
    registry_url: str, tmp_path: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    first = _add_proven(registry_url, "first")
    ctx = _context(registry_url, tmp_path)
    request = Request(model="llama-8b", gpu=lookup_gpu("h100"))
    try:
        assert [c.digest for c in resolve(ctx, request).candidates] == [first]
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: resolve(ctx, request), range(4)))
    finally:
        ctx.close()
    assert [[c.digest for c in ranked.candidates] for ranked in answers] == [[first]] * 4
