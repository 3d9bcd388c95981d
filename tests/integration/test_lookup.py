"""registry.sql.lookup reads what fetch needs without SQLAlchemy; it must answer every ref
exactly as registry.sql.refs.resolve_ref does, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from registry.config import masked_url
from registry.errors import NoRegistryError, RecordNotFoundError, RegistryError, UsageError
from registry.sql import alias_records, records
from registry.sql.db import Registry
from registry.sql.lookup import Found, lookup
from registry.sql.refs import resolve_ref
from tests.integration.db_fixtures import make_record


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except (RecordNotFoundError, UsageError) as exc:
        return (type(exc).__name__, str(exc))


def test_lookup_answers_every_ref_as_resolve_ref_does(
    registry: Registry, registry_url: str
) -> None:
    kept, gone = make_record("kept", status="ready"), make_record("gone")
    with registry.session() as session:
        for record in (kept, gone):
            records.add_artifact(session, record)
        alias_records.set_alias(session, "llama/h100/prod", kept.digest)
        records.mark_deleted(session, gone.digest, "gc")
    unknown = "sha256:" + "0" * 64
    refs = [kept.digest, kept.digest[:19], kept.digest[7:19], kept.digest[7:14], gone.digest,
            "llama/h100/prod", "no/such/alias", unknown, "sha256:", "sha256:" + kept.digest[7:18]]
    with registry.session(readonly=True) as session:
        expected = [_outcome(lambda r=ref: resolve_ref(session, r)) for ref in refs]
    assert [_outcome(lambda r=ref: lookup(registry_url, r).digest) for ref in refs] == expected
    assert expected[:3] == [kept.digest] * 3  # the table is not all errors
    assert lookup(registry_url, "llama/h100/prod") == Found(kept.digest, "ready")
    assert lookup(registry_url, gone.digest) == Found(gone.digest, "deleted", "gc")


def test_an_ambiguous_prefix_is_refused_alike(registry: Registry, registry_url: str) -> None:
    twins = [make_record(f"twin{i}", digest=f"sha256:abcdef012345{i}" + "0" * 51)
             for i in range(2)]
    with registry.session() as session:
        for record in twins:
            records.add_artifact(session, record)
    with registry.session(readonly=True) as session:
        expected = _outcome(lambda: resolve_ref(session, "abcdef012345"))
    assert expected == _outcome(lambda: lookup(registry_url, "abcdef012345"))
    assert "ambiguous" in str(expected)
    assert lookup(registry_url, "abcdef0123451").digest == twins[1].digest


def test_a_registry_that_does_not_exist_yet_lists_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never' / 'registry.db'}"
    with pytest.raises(RecordNotFoundError):  # a full digest: fetch asks the store next
        lookup(url, "sha256:" + "1" * 64)
    for ref in ("prod", "1" * 12):  # an alias or a prefix: say there is no registry
        with pytest.raises(NoRegistryError, match=r"\(the file does not exist\); `enginectl db "
                           "upgrade` creates it"):
            lookup(url, ref)
    assert not (tmp_path / "never").exists()  # reading created nothing


def test_an_empty_postgres_schema_lists_nothing(postgres_url: str) -> None:
    with pytest.raises(RecordNotFoundError):
        lookup(postgres_url, "sha256:" + "1" * 64)
    with pytest.raises(NoRegistryError, match=r"is empty \(no enginectl tables\); `enginectl "
                       "db upgrade` creates it"):
        lookup(postgres_url, "prod")


def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    url = "postgresql+psycopg://enginectl:s3cret@127.0.0.1:1/registry"
    with pytest.raises(RegistryError) as caught:
        lookup(url, "prod", retry_s=0)  # refused is a blip: retried for retry_s
    message = str(caught.value)
    assert message.startswith("cannot use registry postgresql+psycopg://enginectl:***@127.0.0.1:1")
    assert "s3cret" not in message
    assert "\n" not in message
    assert masked_url("sqlite:////tmp/r.db") == "sqlite:////tmp/r.db"


def test_an_unsupported_url_is_refused() -> None:
    with pytest.raises(RegistryError, match=r"unsupported registry URL mysql://u:\*\*\*@h/db"):
        lookup("mysql://u:pw@h/db", "prod")


def test_a_fetch_never_imports_sqlalchemy(tmp_path: Path) -> None:
    """What keeps `enginectl fetch` quick to start: checked in a fresh interpreter that
    fetches by alias from a file store and a SQLite registry."""
    import os
    import subprocess
    import sys

    from registry.config import RegistryConfig
    from registry.context import Context
    from registry.ops.adopt import ImportSpec, import_artifact

    source = tmp_path / "engine"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "rank0.engine").write_bytes(b"engine bytes")
    config = RegistryConfig(home=tmp_path / "home", store_url=(tmp_path / "store").as_uri(),
                            s3_endpoint_url=None, registry_url=f"sqlite:///{tmp_path / 'r.db'}",
                            cache_dir=tmp_path / "cache")
    ctx = Context(config)
    published = import_artifact(ctx, source, ImportSpec(kind="trtllm-engine", model="m",
                                                        gpu="h100", status="ready"))
    with ctx.registry.session() as session:
        alias_records.set_alias(session, "m/prod", published.digest)
    ctx.close()
    script = (
        "import sys\nfrom pathlib import Path\nfrom registry.context import Context\n"
        "from registry.ops.fetch import fetch\n"
        "fetch(Context(), 'm/prod', Path(sys.argv[1]))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')))\n"
    )
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"),
           "ENGINECTL_STORE_URL": config.store_url,
           "ENGINECTL_REGISTRY_URL": config.registry_url,
           "ENGINECTL_CACHE_DIR": str(tmp_path / "fresh-cache")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "out" / "rank0.engine").read_bytes() == b"engine bytes"
