"""logs: the log of the stage run that made an artifact, stored in the store as a blob.

A stage run's log (its programs' stdout and stderr, through the process runner) is stored
when the run's lease is released (`release_lease_with_log`: the blob is kept from gc from before it
is uploaded until the row naming it commits, like a publish's); `stage_runs.log_location`
names it, and gc keeps every blob a stage run or a smoke report references. `logs` finds it
by artifact (REF: the run of the artifact's key) or by stage key, or, with `smoke`, the log
of the artifact's latest smoke report.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, cast

from registry.errors import RecordNotFoundError
from registry.identity.digest import Digest, digest_file
from registry.sql import leases, records, smoke_records
from registry.sql.refs import resolve_ref

if TYPE_CHECKING:
    from registry.context import Context


def release_lease_with_log(ctx: Context, key: str, *, owner: str, status: leases.RunStatus,
                           artifact_digest: str | None = None, error: str | None = None,
                           log: Path | None = None) -> bool:
    """Finish *owner*'s run of *key* (`leases.release_lease`) with its *log* stored as a
    blob that gc keeps; False when the lease was taken over meanwhile."""
    from registry.ops.pending import Pending

    finished = cast(Literal["succeeded", "failed", "cancelled"], status)  # never "running"
    if log is None or not log.is_file():
        with ctx.registry.session() as session:
            return leases.release_lease(session, key, owner=owner, status=finished,
                                        artifact_digest=artifact_digest, error=error)
    digest = digest_file(log, with_sha256=False).xxh3
    pending = Pending.begin(ctx, {digest: log}, renew=False)
    try:
        pending.upload()
        with pending.committing() as session:
            return leases.release_lease(session, key, owner=owner, status=finished,
                                        artifact_digest=artifact_digest, error=error,
                                        log_location=str(digest))
    finally:
        pending.end()


@dataclass(frozen=True)
class FoundLog:
    what: str
    """`stage run k1:…` or `smoke report of sha256:… (at …)`: what the log belongs to."""
    digest: Digest


def find_log(ctx: Context, ref: str, *, smoke: bool = False) -> FoundLog:
    """The log of stage key *ref* (`k1:…`), or of the run that made the artifact *ref*
    names (digest, prefix or alias); with *smoke*, of that artifact's latest smoke
    report. RecordNotFoundError, with the next step, when there is none."""
    with ctx.registry.session(readonly=True) as session:
        key: str | None = ref
        digest: str | None = None
        if not ref.startswith("k1:"):
            digest = resolve_ref(session, ref)
            record = records.get_artifact(session, digest)
            key = record.key if record is not None else None
        if smoke:
            if digest is None:
                raise RecordNotFoundError("smoke report for", ref,
                                          hint="--smoke takes an artifact, not a stage key")
            reports = [r for r in smoke_records.smoke_reports(session, digest)
                       if isinstance(r.report.get("log"), str)]
            if not reports:
                raise RecordNotFoundError("smoke log for", digest, hint=(
                    "no smoke report of it has a stored log; `enginectl smoke "
                    f"{digest}` runs one"))
            latest = reports[-1]
            return FoundLog(f"smoke report of {digest} ({latest.created_at.isoformat()})",
                            Digest.parse(str(latest.report["log"])))
        if key is None:
            raise RecordNotFoundError("stage log for", ref, hint=(
                "it was imported, not built by a stage; `enginectl logs --smoke` shows "
                "its smoke log, if any"))
        run = leases.get_stage_run(session, key)
    if run is None or not run.log_location:
        raise RecordNotFoundError("stage log for", ref, hint=(
            f"stage run {key} {'left no log' if run else 'is not in the registry'}; "
            "`enginectl show` says what is known of it"))
    return FoundLog(f"stage run {key} ({run.status})", Digest.parse(run.log_location))


def logs(ctx: Context, ref: str, out: IO[bytes], *, smoke: bool = False) -> FoundLog:
    """Write the log `find_log` finds to *out*, read from the store (verified)."""
    found = find_log(ctx, ref, smoke=smoke)
    with tempfile.TemporaryDirectory(prefix="enginectl-log-") as scratch:
        path = Path(scratch) / "log"
        ctx.store.get_blob(found.digest, path)
        with path.open("rb") as source:
            shutil.copyfileobj(source, out)
    return found
