"""`Registry.connection()`: the Core transaction a publish writes in (no ORM imported), running
the same statements of `registry.sql` as an ORM session, on real SQLite files and a real
PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from sqlalchemy import text

from registry.errors import ConflictError, RegistryError, SchemaError
from registry.sql import records
from registry.sql.db import Registry, open_registry
from registry.sql.pending_publishes import add_pending, drop_pending, renew_pending
from tests.integration.db_fixtures import make_record


def test_what_a_connection_writes_a_session_reads(registry: Registry) -> None:
    record = make_record("a")
    with registry.connection() as connection:
        assert records.add_artifact_if_absent(connection, record) is True
        assert records.add_artifact_if_absent(connection, record) is False
        with pytest.raises(ConflictError, match="already registered"):
            records.add_artifact(connection, record)  # its savepoint: the transaction goes on
        assert records.get_status(connection, record.digest) == "built"
        records.set_status(connection, record.digest, "ready", "proven")
    with registry.session(readonly=True) as session:
        stored = records.get_artifact(session, record.digest)
    assert stored is not None
    assert replace(stored, created_at=None, updated_at=None) == replace(
        record, status="ready", status_reason="proven")


def test_a_pending_row_lives_and_goes_on_a_connection(registry: Registry) -> None:
    with registry.connection() as connection:
        add_pending(connection, "p1", owner="me", blobs=["xxh3-128:" + "0" * 32])
    with registry.connection() as connection:
        assert renew_pending(connection, "p1") is True
        drop_pending(connection, "p1")
        assert renew_pending(connection, "p1") is False


def _insert_then_fail(registry: Registry) -> None:
    with registry.connection() as connection:
        records.add_artifact_if_absent(connection, make_record("gone"))
        raise RuntimeError("after the insert")


def test_a_connection_rolls_back_when_its_block_raises(registry: Registry) -> None:
    with pytest.raises(RuntimeError, match="after the insert"):
        _insert_then_fail(registry)
    with registry.connection(readonly=True) as connection:
        assert records.get_status(connection, make_record("gone").digest) is None


def test_a_registry_opened_for_reading_refuses_a_write_connection(registry_url: str) -> None:
    open_registry(registry_url).close()  # created and migrated
    with open_registry(registry_url, readonly=True) as reader:
        with pytest.raises(RegistryError, match="opened for reading"), reader.connection():
            pass
        with reader.connection(readonly=True) as connection:
            assert records.get_status(connection, make_record("a").digest) is None


def test_a_write_connection_refuses_a_schema_newer_than_this_enginectl(
        registry: Registry) -> None:
    with registry.connection() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    with pytest.raises(SchemaError, match="newer than this enginectl"), registry.connection():
        pass


def test_a_write_connection_imports_no_orm(registry_url: str) -> None:
    open_registry(registry_url).close()  # created and migrated (Alembic loads the models)
    record = make_record("x")
    program = (
        "import sys\n"
        "from registry.sql.db import open_registry\n"
        "from registry.sql import records\n"
        "from registry.sql.records import ArtifactRecord, FileRecord\n"
        f"record = {record!r}\n"
        f"with open_registry({registry_url!r}) as registry, registry.connection() as c:\n"
        "    assert records.add_artifact_if_absent(c, record)\n"
        "print(sorted(m for m in ('sqlalchemy.orm', 'registry.sql.models') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.strip() == "[]"
