"""The SQL registry on real SQLite files and a real PostgreSQL: records, leases, and races
between real processes. The schema and its migrations: test_registry_schema.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from registry.errors import ConflictError, RecordNotFoundError, RegistryError
from registry.sql import alias_records, build_inputs, leases, records, smoke_records
from registry.sql.db import Registry, open_registry
from registry.sql.models import Recipe
from registry.sql.schema import head_revision
from tests.integration.db_fixtures import (
    insert_worker,
    lease_worker,
    make_record,
    open_worker,
    run_racers,
)


def test_a_read_only_session_refuses_writes(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="read-only"), registry.session(readonly=True) as s:
        records.add_artifact(s, make_record("nope"))
    with registry.session(readonly=True) as session:
        assert records.list_artifacts(session) == []


def test_an_unreachable_database_names_the_url_without_its_password() -> None:
    url = "postgresql+psycopg://enginectl:s3cret@127.0.0.1:1/registry"
    with pytest.raises(RegistryError) as caught:
        open_registry(url, retry_s=0)  # refused is a blip: retried for retry_s
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
    with registry.session() as session:  # raw inserts: the database's own conflict is the test
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
        alias_records.set_alias(session, "llama8b/l40s/prod", engine_l40s.digest)

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
        alias_records.set_alias(session, "llama8b/h100/prod", dropped.digest)
    with pytest.raises(ConflictError, match="llama8b/h100/prod"), registry.session() as session:
        records.mark_deleted(session, dropped.digest, "gc")
    with registry.session() as session:
        alias_records.set_alias(session, "llama8b/h100/prod", kept.digest)
        records.mark_deleted(session, dropped.digest, "gc: unreferenced")
        with pytest.raises(RecordNotFoundError, match="no artifact"):
            records.set_status(session, make_record("ghost").digest, "ready")
    with pytest.raises(ConflictError, match="is deleted"), registry.session() as session:
        alias_records.set_alias(session, "llama8b/h100/old", dropped.digest)

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
        assert alias_records.set_alias(session, "prod", first.digest) is None
        assert alias_records.set_alias(session, "prod", first.digest) == first.digest  # no event
        assert alias_records.set_alias(session, "prod", second.digest, "override: imported") == (
            first.digest
        )
        assert alias_records.aliases_for(session, second.digest) == ["prod"]
        assert alias_records.remove_alias(session, "prod", "retired") == second.digest
        with pytest.raises(RecordNotFoundError, match="no alias 'prod'"):
            alias_records.remove_alias(session, "prod")
        with pytest.raises(RecordNotFoundError, match="no artifact"):
            alias_records.set_alias(session, "prod", make_record("ghost").digest)

    with registry.session(readonly=True) as session:
        assert alias_records.get_alias(session, "prod") is None
        history = alias_records.alias_history(session, "prod")
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
        smoke_records.add_smoke_report(session, record.digest, False,
                                       {"checks": {"chat": "timeout"}})
        smoke_records.add_smoke_report(session, record.digest, True, report)
        assert build_inputs.record_recipe(session, "sha256:abc", "llama8b", "model: x\n") is True
        assert build_inputs.record_recipe(session, "sha256:abc", "llama8b", "model: x\n") is False
    with registry.session(readonly=True) as session:
        reports = smoke_records.smoke_reports(session, record.digest)
        with pytest.raises(RecordNotFoundError):
            smoke_records.smoke_reports(session, make_record("ghost").digest)
    assert [(r.passed, r.report) for r in reports] == [
        (False, {"checks": {"chat": "timeout"}}),
        (True, report),
    ]


def test_lease_acquire_renew_expire_and_release(registry: Registry) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    key = "k1:build"
    with registry.session() as session:
        assert leases.try_acquire_lease(session, key, owner="a", host="h1", pid=1, ttl_s=60,
                                        now=t0)
        assert not leases.try_acquire_lease(session, key, owner="b", host="h2", pid=2,
                                            ttl_s=60, now=t0 + timedelta(seconds=59))
        assert leases.try_acquire_lease(session, key, owner="a", host="h1", pid=1, ttl_s=60,
                                        now=t0 + timedelta(seconds=30))  # ours: renewed
        assert leases.renew_lease(session, key, owner="a", ttl_s=60,
                                  now=t0 + timedelta(seconds=80))
        assert not leases.renew_lease(session, key, owner="b", ttl_s=60, now=t0)
        assert not leases.try_acquire_lease(session, key, owner="b", host="h2", pid=2,
                                            ttl_s=60, now=t0 + timedelta(seconds=139))
        # a's lease ran out at t0+140: b takes it over, and a can no longer finish it.
        assert leases.try_acquire_lease(session, key, owner="b", host="h2", pid=2, ttl_s=60,
                                        now=t0 + timedelta(seconds=140))
        assert not leases.renew_lease(session, key, owner="a", ttl_s=60, now=t0)
        assert not leases.release_lease(session, key, owner="a", status="failed")
        assert leases.release_lease(
            session, key, owner="b", status="succeeded", artifact_digest="sha256:aa",
            log_location="s3://logs/build.log", now=t0 + timedelta(seconds=150),
        )
    with registry.session(readonly=True) as session:
        run = leases.get_stage_run(session, key)
        assert leases.get_stage_run(session, "k1:other") is None
    assert run is not None
    assert (run.status, run.owner, run.host, run.pid) == ("succeeded", "b", "h2", 2)
    assert run.finished_at == t0 + timedelta(seconds=150)
    assert (run.artifact_digest, run.log_location, run.error) == (
        "sha256:aa", "s3://logs/build.log", None
    )
    with registry.session() as session:  # a finished run holds no lease: a retry may start
        assert leases.try_acquire_lease(session, key, owner="c", host="h3", pid=3, ttl_s=60,
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
            assert leases.try_acquire_lease(
                session, key, owner="dead", host="gone", pid=1, ttl_s=60,
                now=datetime.now(UTC) - timedelta(hours=1),
            )
    results = run_racers(lease_worker, [(registry_url, f"owner{i}", key) for i in range(3)])
    winners = [owner for owner, won in results if won is True]
    assert len(winners) == 1, results
    assert all(won is False for owner, won in results if owner not in winners), results
    with registry.session(readonly=True) as session:
        run = leases.get_stage_run(session, key)
    assert run is not None
    assert (run.owner, run.status) == (winners[0], "running")


