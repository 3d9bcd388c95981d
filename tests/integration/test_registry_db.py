"""The SQL registry on real SQLite files and a real PostgreSQL: migrations, the schema guard,
records, and races between real processes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import insert, text

from registry import records
from registry.db import Registry, current, head_revision, make_engine, open_registry, upgrade
from registry.errors import ConflictError, RecordNotFoundError, RegistryError, SchemaError
from registry.models import Base, Recipe
from tests.integration.db_fixtures import (
    insert_worker,
    lease_worker,
    make_record,
    open_worker,
    run_racers,
)

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


def _stamp(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()


def test_a_newer_schema_refuses_writes_but_allows_reads(registry_url: str) -> None:
    with open_registry(registry_url) as registry, registry.session() as session:
        records.add_artifact(session, make_record("before"))
    _stamp(registry_url, FUTURE_REVISION)

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


def test_a_read_only_session_refuses_writes(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="read-only"), registry.session(readonly=True) as s:
        records.add_artifact(s, make_record("nope"))
    with registry.session(readonly=True) as session:
        assert records.list_artifacts(session) == []


def test_an_unreachable_database_names_the_url_without_its_password() -> None:
    url = "postgresql+psycopg://enginectl:s3cret@127.0.0.1:1/registry"
    with pytest.raises(RegistryError) as caught:
        open_registry(url)
    message = str(caught.value)
    assert message.startswith("cannot use registry postgresql+psycopg://enginectl:***@127.0.0.1:1")
    assert "s3cret" not in message
    assert "\n" not in message


def test_an_unsupported_url_is_refused() -> None:
    with pytest.raises(RegistryError, match="unsupported registry URL mysql://u:\\*\\*\\*@h/db"):
        open_registry("mysql://u:pw@h/db")


def test_artifact_round_trip(registry: Registry) -> None:
    record = make_record("a")
    with registry.session() as session:
        records.add_artifact(session, record)
    with registry.session(readonly=True) as session:
        stored = records.get_artifact(session, record.digest)
        assert records.get_artifact(session, make_record("missing").digest) is None
    assert stored is not None
    assert stored.created_at is not None
    assert stored.created_at.tzinfo is not None
    assert stored.created_at.utcoffset() == timedelta(0)
    assert stored.size == 3 * 2**32 + 2_000  # needs BIGINT
    assert replace(stored, created_at=None, updated_at=None) == record


def test_a_duplicate_digest_conflicts_and_keeps_the_transaction(registry: Registry) -> None:
    with registry.session() as session:
        records.add_artifact(session, make_record("a"))
    with registry.session() as session:
        with pytest.raises(ConflictError, match="already registered"):
            records.add_artifact(session, make_record("a"))
        assert records.add_artifact_if_absent(session, make_record("a")) is False
        assert records.add_artifact_if_absent(session, make_record("b")) is True
    with registry.session(readonly=True) as session:
        assert len(records.list_artifacts(session)) == 2


def test_an_integrity_error_leaving_a_session_becomes_a_conflict(registry: Registry) -> None:
    with registry.session() as session:
        session.execute(insert(Recipe).values(digest="sha256:r", name="r", text="x"))
    with pytest.raises(ConflictError, match="conflicting write"), registry.session() as session:
        session.execute(insert(Recipe).values(digest="sha256:r", name="r", text="y"))


def test_list_filters_and_prefix_lookup(registry: Registry) -> None:
    engine_h100 = make_record("h100")
    engine_l40s = make_record("l40s", gpu="L40S", sm=89, status="ready")
    vllm = make_record("vllm", kind="vllm", gpu=None, sm=None, quant=None, model="qwen-7b")
    with registry.session() as session:
        for record in (engine_h100, engine_l40s, vllm):
            records.add_artifact(session, record)
        records.set_alias(session, "llama8b/l40s/prod", engine_l40s.digest)

    with registry.session(readonly=True) as session:

        def digests(**filters: str) -> list[str]:
            return [r.digest for r in records.list_artifacts(session, **filters)]

        assert digests() == [engine_h100.digest, engine_l40s.digest, vllm.digest]
        assert digests(model="llama-8b") == [engine_h100.digest, engine_l40s.digest]
        assert digests(gpu="L40S") == [engine_l40s.digest]
        assert digests(kind="vllm") == [vllm.digest]
        assert digests(quant="fp8", status="built") == [engine_h100.digest]
        assert digests(alias="llama8b/l40s/prod") == [engine_l40s.digest]
        assert digests(alias="nope") == []

        hex_digest = engine_h100.digest.removeprefix("sha256:")
        assert records.find_by_prefix(session, hex_digest[:8]) == [engine_h100.digest]
        assert records.find_by_prefix(session, f"sha256:{hex_digest[:8].upper()}") == [
            engine_h100.digest
        ]
        used = {r.digest.removeprefix("sha256:")[0] for r in (engine_h100, engine_l40s, vllm)}
        unused = next(c for c in "0123456789abcdef" if c not in used)
        assert records.find_by_prefix(session, unused) == []
        for bad in ("", "zz%", "sha256:"):
            with pytest.raises(ValueError, match="hex digest prefix"):
                records.find_by_prefix(session, bad)


def test_status_moves_and_what_gc_must_keep(registry: Registry) -> None:
    kept, dropped = make_record("kept"), make_record("dropped")
    with registry.session() as session:
        records.add_artifact(session, kept)
        records.add_artifact(session, dropped)
        records.set_status(session, kept.digest, "ready")
        records.set_alias(session, "llama8b/h100/prod", dropped.digest)
    with pytest.raises(ConflictError, match="llama8b/h100/prod"), registry.session() as session:
        records.mark_deleted(session, dropped.digest, "gc")
    with registry.session() as session:
        records.set_alias(session, "llama8b/h100/prod", kept.digest)
        records.mark_deleted(session, dropped.digest, "gc: unreferenced")
        with pytest.raises(RecordNotFoundError, match="no artifact"):
            records.set_status(session, make_record("ghost").digest, "ready")
    with pytest.raises(ConflictError, match="is deleted"), registry.session() as session:
        records.set_alias(session, "llama8b/h100/old", dropped.digest)

    with registry.session(readonly=True) as session:
        stored = records.get_artifact(session, dropped.digest)
        assert stored is not None
        assert (stored.status, stored.status_reason) == ("deleted", "gc: unreferenced")
        assert records.referenced_digests(session) == {kept.digest}
        assert records.referenced_blobs(session) == {f.xxh3 for f in kept.files}


def test_alias_history_is_kept(registry: Registry) -> None:
    first, second = make_record("first"), make_record("second")
    with registry.session() as session:
        records.add_artifact(session, first)
        records.add_artifact(session, second)
        assert records.set_alias(session, "prod", first.digest) is None
        assert records.set_alias(session, "prod", first.digest) == first.digest  # no event
        assert records.set_alias(session, "prod", second.digest, "override: imported") == (
            first.digest
        )
        assert records.aliases_for(session, second.digest) == ["prod"]
        assert records.remove_alias(session, "prod", "retired") == second.digest
        with pytest.raises(RecordNotFoundError, match="no alias 'prod'"):
            records.remove_alias(session, "prod")
        with pytest.raises(RecordNotFoundError, match="no artifact"):
            records.set_alias(session, "prod", make_record("ghost").digest)

    with registry.session(readonly=True) as session:
        assert records.get_alias(session, "prod") is None
        history = records.alias_history(session, "prod")
    assert [(e.digest, e.previous_digest, e.note) for e in history] == [
        (first.digest, None, None),
        (second.digest, first.digest, "override: imported"),
        (None, second.digest, "retired"),
    ]
    assert all(e.at.tzinfo is not None for e in history)


def test_smoke_reports_and_recipes(registry: Registry) -> None:
    record = make_record("smoked")
    report = {"checks": {"chat": "ok"}, "ttft_ms": {"p50": "41.5"}, "tokens_per_s": {"8": 912}}
    with registry.session() as session:
        records.add_artifact(session, record)
        records.add_smoke_report(session, record.digest, False, {"checks": {"chat": "timeout"}})
        records.add_smoke_report(session, record.digest, True, report)
        assert records.record_recipe(session, "sha256:abc", "llama8b", "model: x\n") is True
        assert records.record_recipe(session, "sha256:abc", "llama8b", "model: x\n") is False
    with registry.session(readonly=True) as session:
        reports = records.smoke_reports(session, record.digest)
        with pytest.raises(RecordNotFoundError):
            records.smoke_reports(session, make_record("ghost").digest)
    assert [(r.passed, r.report) for r in reports] == [
        (False, {"checks": {"chat": "timeout"}}),
        (True, report),
    ]


def test_lease_acquire_renew_expire_and_release(registry: Registry) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    key = "k1:build"
    with registry.session() as session:
        assert records.try_acquire_lease(session, key, owner="a", host="h1", pid=1, ttl_s=60,
                                         now=t0)
        assert not records.try_acquire_lease(session, key, owner="b", host="h2", pid=2,
                                             ttl_s=60, now=t0 + timedelta(seconds=59))
        assert records.try_acquire_lease(session, key, owner="a", host="h1", pid=1, ttl_s=60,
                                         now=t0 + timedelta(seconds=30))  # ours: renewed
        assert records.renew_lease(session, key, owner="a", ttl_s=60,
                                   now=t0 + timedelta(seconds=80))
        assert not records.renew_lease(session, key, owner="b", ttl_s=60, now=t0)
        assert not records.try_acquire_lease(session, key, owner="b", host="h2", pid=2,
                                             ttl_s=60, now=t0 + timedelta(seconds=139))
        # a's lease ran out at t0+140: b takes it over, and a can no longer finish it.
        assert records.try_acquire_lease(session, key, owner="b", host="h2", pid=2, ttl_s=60,
                                         now=t0 + timedelta(seconds=140))
        assert not records.renew_lease(session, key, owner="a", ttl_s=60, now=t0)
        assert not records.release_lease(session, key, owner="a", status="failed")
        assert records.release_lease(
            session, key, owner="b", status="succeeded", artifact_digest="sha256:aa",
            log_location="s3://logs/build.log", now=t0 + timedelta(seconds=150),
        )
    with registry.session(readonly=True) as session:
        run = records.get_stage_run(session, key)
        assert records.get_stage_run(session, "k1:other") is None
    assert run is not None
    assert (run.status, run.owner, run.host, run.pid) == ("succeeded", "b", "h2", 2)
    assert run.finished_at == t0 + timedelta(seconds=150)
    assert (run.artifact_digest, run.log_location, run.error) == (
        "sha256:aa", "s3://logs/build.log", None
    )
    with registry.session() as session:  # a finished run holds no lease: a retry may start
        assert records.try_acquire_lease(session, key, owner="c", host="h3", pid=3, ttl_s=60,
                                         now=t0 + timedelta(seconds=151))


def test_processes_opening_a_fresh_registry_migrate_it_once(registry_url: str) -> None:
    results = run_racers(open_worker, [(registry_url, f"p{i}") for i in range(3)])
    assert [result for _, result in results] == [head_revision()] * 3


def test_processes_inserting_the_same_digests_end_with_one_row_each(
    registry: Registry, registry_url: str
) -> None:
    names = [f"dup{i}" for i in range(5)]
    results = run_racers(insert_worker, [(registry_url, f"p{i}", names) for i in range(3)])
    per_record = list(zip(*(inserted for _, inserted in results), strict=True))
    assert [sorted(outcome) for outcome in per_record] == [[False, False, True]] * len(names)
    with registry.session(readonly=True) as session:
        stored = records.list_artifacts(session)
    assert sorted(r.digest for r in stored) == sorted(make_record(n).digest for n in names)
    assert all(len(r.files) == 2 for r in stored)


@pytest.mark.parametrize("existing", ["none", "expired"])
def test_processes_racing_for_a_lease_exactly_one_wins(
    registry: Registry, registry_url: str, existing: str
) -> None:
    key = "k1:race"
    if existing == "expired":
        with registry.session() as session:
            assert records.try_acquire_lease(
                session, key, owner="dead", host="gone", pid=1, ttl_s=60,
                now=datetime.now(UTC) - timedelta(hours=1),
            )
    results = run_racers(lease_worker, [(registry_url, f"owner{i}", key) for i in range(3)])
    winners = [owner for owner, won in results if won is True]
    assert len(winners) == 1, results
    assert all(won is False for owner, won in results if owner not in winners), results
    with registry.session(readonly=True) as session:
        run = records.get_stage_run(session, key)
    assert run is not None
    assert (run.owner, run.status) == (winners[0], "running")


def _best(registry: Registry, name: str) -> float | None:
    from sqlalchemy import select

    from registry.models import Artifact

    with registry.session(readonly=True) as session:
        return session.execute(select(Artifact.best_tokens_per_s)
                               .where(Artifact.digest == make_record(name).digest)).scalar_one()


def test_passing_smoke_reports_keep_the_best_throughput_on_the_artifact(
    registry: Registry,
) -> None:
    with registry.session() as session:
        records.add_artifact(session, make_record("fast"))
        for passed, tokens in ((True, 500.0), (False, 9000.0), (True, 800), (True, 300.5),
                               (True, None), (True, "fast")):
            records.add_smoke_report(session, make_record("fast").digest, passed,
                                     {"best_output_tokens_per_s": tokens})
        records.add_artifact(session, make_record("failing"))
        records.add_smoke_report(session, make_record("failing").digest, False,
                                 {"best_output_tokens_per_s": 700.0})
    assert _best(registry, "fast") == 800.0  # failing reports and non-numbers do not count
    assert _best(registry, "failing") is None


def test_migrating_from_0001_backfills_the_best_throughput(registry_url: str) -> None:
    """A registry written by an enginectl at schema 0001, with smoke reports, upgraded."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy.orm import Session

    from registry.db import migrations_dir

    engine = make_engine(registry_url)
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(migrations_dir()))
            config.attributes["connection"] = connection
            command.upgrade(config, "0001")
        with Session(engine) as session, session.begin():
            ids = {name: records.add_artifact(session, make_record(name))
                   for name in ("smoked", "unsmoked")}
            for passed, tokens in ((True, 120.5), (True, 450.0), (False, 999.0)):
                session.execute(
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
            assert len(records.smoke_reports(session, make_record("smoked").digest)) == 3


def test_migrating_from_0002_keeps_runs_and_allows_cancelled_runs(registry_url: str) -> None:
    """0003 rebuilds the stage_runs check (SQLite: the whole table) without losing a row;
    afterwards a run may be `cancelled`, and still not anything else."""
    from alembic import command
    from alembic.config import Config

    from registry.db import migrations_dir

    engine = make_engine(registry_url)
    row = {"key": "k1:" + "a" * 64, "status": "succeeded", "host": "h", "pid": 1, "owner": "o",
           "t": datetime.now(UTC)}
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
            run = records.get_stage_run(session, row["key"])
            assert run is not None
            assert (run.status, run.node_id) == ("succeeded", None)
        with registry.session() as session:
            session.execute(insert_run, {**row, "key": "k1:" + "b" * 64, "status": "cancelled"})
        with pytest.raises(ConflictError), registry.session() as session:
            session.execute(insert_run, {**row, "key": "k1:" + "c" * 64, "status": "bogus"})
