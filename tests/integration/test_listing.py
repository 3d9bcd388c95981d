"""registry.sql.listing reads what `ls` and `info` show without SQLAlchemy; it must answer
exactly what the ORM's reads answer, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from registry.errors import NoRegistryError
from registry.sql import alias_records, records, smoke_records
from registry.sql.db import Registry
from registry.sql.listing import listed_artifacts, schema_revision
from registry.sql.schema import HEAD, current
from tests.integration.db_fixtures import make_record
from tests.integration.show_reference import artifact_dict, evidence_for

FILTERS: list[dict[str, str]] = [
    {}, {"model": "llama-8b"}, {"model": "other"}, {"status": "ready"}, {"kind": "vllm"},
    {"gpu": "H100-SXM5-80GB", "quant": "fp8"}, {"alias": "llama/h100/prod"},
    {"alias": "llama/h100/prod", "status": "built"}, {"alias": "no/such"},
]


def _through_the_orm(registry: Registry, **filters: str) -> list[dict[str, Any]]:
    """What `inventory.ls` answered before it read on the driver."""
    with registry.session(readonly=True) as session:
        found = records.list_artifacts(session, **filters)  # type: ignore[arg-type]
        evidence = evidence_for(session, [r.digest for r in found])
        return [artifact_dict(r, alias_records.aliases_for(session, r.digest))
                | {"evidence": [{"gpu": e.gpu, "best_tokens_per_s": e.best_tokens_per_s,
                                 "passed_at": e.passed_at.isoformat()}
                                for e in evidence[r.digest]]} for r in found]


def test_listed_artifacts_answer_as_the_orm_does(registry: Registry, registry_url: str) -> None:
    at = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    rows = [make_record("a", status="ready", created_at=at),
            make_record("b", kind="vllm", gpu=None, toolchain={}, labels={"x": [1, 2]}),
            make_record("c", quant="int4_awq", created_at=at.replace(microsecond=0)),
            make_record("d", model="other", status="quarantined", status_reason="smoke failed")]
    with registry.session() as session:
        for record in rows:
            records.add_artifact(session, record)
        alias_records.set_alias(session, "llama/h100/prod", rows[0].digest)
        alias_records.set_alias(session, "llama/canary", rows[0].digest)
        alias_records.set_alias(session, "vllm/cpu", rows[1].digest)
        for gpu, rate in (("H100-SXM5-80GB", 120.5), ("CPU", 3.25)):
            smoke_records.add_smoke_report(session, rows[0].digest, True,
                                           {"output_tokens_per_s": rate}, gpu=gpu,
                                           toolchain={"driver": "570.86"})
    for filters in FILTERS:
        expected = _through_the_orm(registry, **filters)
        assert listed_artifacts(registry_url, **filters) == expected, filters
    listed = {row["digest"]: row for row in listed_artifacts(registry_url) or []}
    assert len(listed) == 4  # the table is not all empty answers
    assert listed[rows[0].digest]["aliases"] == ["llama/canary", "llama/h100/prod"]
    assert [e["gpu"] for e in listed[rows[0].digest]["evidence"]] == ["CPU", "H100-SXM5-80GB"]
    assert schema_revision(registry_url) == current(registry_url) == HEAD


def test_no_registry_file_is_said_and_created_by_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never' / 'registry.db'}"
    with pytest.raises(NoRegistryError, match=r"\(the file does not exist\)"):
        listed_artifacts(url)
    assert schema_revision(url) is None
    assert not (tmp_path / "never").exists()


def test_an_empty_postgres_schema_has_no_revision(postgres_url: str) -> None:
    with pytest.raises(NoRegistryError) as raised:  # as opening it for reading says
        listed_artifacts(postgres_url)
    assert not raised.value.missing
    assert schema_revision(postgres_url) is None
