"""The SQL registry's schema on real SQLite files and a real PostgreSQL: a fresh database
migrated, the models matching the migrations, the guard against a newer schema, and migrations
from older schemas keeping (and backfilling) what they held. Records: test_registry_db.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text

from registry.errors import ConflictError, SchemaError
from registry.sql import leases, records, smoke_records
from registry.sql.db import Registry, open_registry
from registry.sql.engine import make_engine
from registry.sql.models import Base
from registry.sql.schema import current, head_revision, upgrade
from tests.integration.db_fixtures import make_record, stamp

FUTURE_REVISION = "9999_from_a_newer_enginectl"


def test_open_creates_and_migrates_an_empty_database(registry_url: str) -> None:
    assert current(registry_url) is None
    with open_registry(registry_url):
        pass
    assert current(registry_url) == head_revision()
    assert upgrade(registry_url) == head_revision()  # idempotent


@pytest.mark.usefixtures("registry")  # opening it migrated the database
def test_models_match_the_migrations(registry_url: str) -> None:
    engine = make_engine(registry_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_a_newer_schema_refuses_writes_but_allows_reads(registry_url: str) -> None:
    with open_registry(registry_url) as registry, registry.session() as session:
        records.add_artifact(session, make_record("before"))
    stamp(registry_url, FUTURE_REVISION)

    expected = (
        f"registry schema {FUTURE_REVISION} is newer than this enginectl "
        f"(knows up to {head_revision()}); upgrade enginectl"
    )
    with open_registry(registry_url) as registry:
        with registry.session(readonly=True) as session:
            assert [r.digest for r in records.list_artifacts(session)] == [
                make_record("before").digest
            ]
        with pytest.raises(SchemaError) as caught, registry.session() as session:
            records.add_artifact(session, make_record("after"))
        assert str(caught.value) == expected
        assert caught.value.revision == FUTURE_REVISION
        assert caught.value.exit_code == 4
    with pytest.raises(SchemaError, match="upgrade enginectl"):
        upgrade(registry_url)
    assert current(registry_url) == FUTURE_REVISION


def _best(registry: Registry, name: str) -> float | None:
    from sqlalchemy import select

    from registry.sql.models import Artifact

    with registry.session(readonly=True) as session:  # the column itself is the test
        return session.execute(select(Artifact.best_tokens_per_s)
                               .where(Artifact.digest == make_record(name).digest)).scalar_one()


def test_passing_smoke_reports_keep_the_best_throughput_on_the_artifact(
    registry: Registry,
) -> None:
    with registry.session() as session:
        records.add_artifact(session, make_record("fast"))
        for passed, tokens in ((True, 500.0), (False, 9000.0), (True, 800), (True, 300.5),
                               (True, None), (True, "fast")):
            smoke_records.add_smoke_report(session, make_record("fast").digest, passed,
                                           {"best_output_tokens_per_s": tokens})
        records.add_artifact(session, make_record("failing"))
        smoke_records.add_smoke_report(session, make_record("failing").digest, False,
                                       {"best_output_tokens_per_s": 700.0})
    assert _best(registry, "fast") == 800.0  # failing reports and non-numbers do not count
    assert _best(registry, "failing") is None


def test_migrating_from_0001_backfills_the_best_throughput(registry_url: str) -> None:
    """A registry written by an enginectl at schema 0001, with smoke reports, upgraded."""
    from sqlalchemy.orm import Session


    engine = make_engine(registry_url)
    try:
        _upgrade_to(engine, "0001")
        with Session(engine) as session, session.begin():
            ids = {name: records.add_artifact(session, make_record(name))
                   for name in ("smoked", "unsmoked")}
            for passed, tokens in ((True, 120.5), (True, 450.0), (False, 999.0)):
                session.execute(  # raw: rows as schema 0001 held them, before the migration
                    text("INSERT INTO smoke_reports (artifact_id, passed, report, created_at) "
                         "VALUES (:a, :p, :r, :t)"),
                    {"a": ids["smoked"], "p": passed, "t": datetime.now(UTC),
                     "r": f'{{"best_output_tokens_per_s": {tokens}}}'},
                )
    finally:
        engine.dispose()
    assert current(registry_url) == "0001"
    assert upgrade(registry_url) == head_revision()
    with open_registry(registry_url) as registry:
        assert _best(registry, "smoked") == 450.0
        assert _best(registry, "unsmoked") is None
        with registry.session(readonly=True) as session:
            assert len(smoke_records.smoke_reports(session, make_record("smoked").digest)) == 3


def test_migrating_from_0002_keeps_runs_and_allows_cancelled_runs(registry_url: str) -> None:
    """0003 rebuilds the stage_runs check (SQLite: the whole table) without losing a row;
    afterwards a run may be `cancelled`, and still not anything else."""
    from alembic import command
    from alembic.config import Config

    from registry.sql.schema import migrations_dir

    engine = make_engine(registry_url)
    row = {"key": "k1:" + "a" * 64, "status": "succeeded", "host": "h", "pid": 1, "owner": "o",
           "t": datetime.now(UTC)}
    # raw: rows as schema 0002 held them, then the new check constraint itself
    insert_run = text("INSERT INTO stage_runs (key, status, host, pid, owner, started_at, "
                      "lease_expires_at) VALUES (:key, :status, :host, :pid, :owner, :t, :t)")
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(migrations_dir()))
            config.attributes["connection"] = connection
            command.upgrade(config, "0002")
            connection.execute(insert_run, row)
    finally:
        engine.dispose()
    assert upgrade(registry_url) == head_revision()
    with open_registry(registry_url) as registry:
        with registry.session(readonly=True) as session:
            run = leases.get_stage_run(session, row["key"])
            assert run is not None
            assert (run.status, run.node_id) == ("succeeded", None)
        with registry.session() as session:
            session.execute(insert_run, {**row, "key": "k1:" + "b" * 64, "status": "cancelled"})
        with pytest.raises(ConflictError), registry.session() as session:
            session.execute(insert_run, {**row, "key": "k1:" + "c" * 64, "status": "bogus"})


def test_migrating_from_0003_gives_resolve_its_indexes_and_keeps_its_answer(
    registry_url: str,
) -> None:
    """0004 swaps resolve's indexes (artifacts, smoke_reports) for ones that hold what it
    reads: the rows written at 0003 stay, resolve reads them as before, and the old indexes
    are gone."""
    from sqlalchemy import inspect
    from sqlalchemy.orm import Session

    from registry.gpus import lookup_gpu
    from registry.ops.resolve import Request, candidates_for
    from registry.sql.held import HeldReader

    record = make_record("engine", status="ready")
    engine = make_engine(registry_url)
    try:
        _upgrade_to(engine, "0003")
        with Session(engine) as session, session.begin():  # 0003's columns are the head's
            records.add_artifact(session, record)
            smoke_records.add_smoke_report(session, record.digest, True,
                                           {"best_output_tokens_per_s": 300.0},
                                           gpu=record.gpu, toolchain={"trtllm": "0.17.0"})
    finally:
        engine.dispose()
    assert current(registry_url) == "0003"
    assert upgrade(registry_url) == head_revision()
    held = HeldReader(registry_url)
    try:
        with held.reading() as reader:
            found = candidates_for(reader, Request(record.model, lookup_gpu(str(record.gpu)),
                                                   toolchain={"trtllm": "0.17.0"}),
                                   every_status=False, evidence=False)
    finally:
        held.close()
    assert [(c.digest, c.proven, c.tokens_per_s, c.toolchain["trtllm"]) for c in found] \
        == [(record.digest, True, 300.0, "0.17.0")]
    engine = make_engine(registry_url)
    try:
        inspector = inspect(engine)
        artifacts = {index["name"] for index in inspector.get_indexes("artifacts")}
        reports = {index["name"] for index in inspector.get_indexes("smoke_reports")}
    finally:
        engine.dispose()
    assert "ix_artifacts_resolve" in artifacts
    assert "ix_artifacts_model_status_kind_gpu" not in artifacts
    assert "ix_smoke_reports_artifact_id_gpu" in reports
    assert "ix_smoke_reports_artifact_id" not in reports


def _upgrade_to(engine: Engine, revision: str) -> None:
    """Migrate the registry behind *engine* up to *revision* with Alembic, as an older
    enginectl would have left it."""
    from alembic import command
    from alembic.config import Config

    from registry.sql.schema import migrations_dir

    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
