"""Errors of the registry package, and the root of every enginectl error.

    EnginectlError                 root; carries the CLI exit code
    ├── UsageError                 bad command-line input (exit 2)
    │   ├── UnknownModelError      resolve for a model the registry has no artifact of
    │   │                          (exit 6, not found): model, the models it knows
    │   ├── NothingResolvableError every artifact of the model was rejected for the node
    │   │                          (exit 6, not found): model, gpu, one reason per artifact
    │   ├── AliasToolchainError    no target an alias had runs on this node's toolchain
    │   │                          (exit 6, not found): alias, digest, what it needs
    │   └── ConfigError            a bad value in the environment (ENGINECTL_HOME is a file
    │                              or relative, ENGINECTL_REGISTRY_URL is not a URL):
    │                              variable, value
    ├── StoppedError               the user interrupted a fetch or publish (Ctrl-C, exit 130);
    │                              says what was kept and that a re-run resumes
    └── RegistryError              registry, store or integrity problem (exit 4)
        ├── StoreError             a store operation failed for good: url/key, operation,
        │                          S3 error code and request id (transient ones are retried)
        ├── NotFoundError          a blob or manifest is not in the store: url and key
        ├── IntegrityError         bytes do not match their digest (or their size): where,
        │                          expected, actual
        ├── ManifestError          a manifest is malformed or unsafe (bad path, duplicate)
        ├── SchemaError            the SQL registry's schema is missing, behind or newer than
        │   │                      this binary: revision, head, url
        │   └── NoRegistryError    a read found no registry (no SQLite file, no tables):
        │                          url, missing
        ├── DamagedRegistryError   the registry's SQLite file is not a database, is damaged
        │                          or is empty: path
        ├── DiskFullError          a disk this machine writes to is full (ENOSPC, EDQUOT):
        │                          path, what it is (the fetch cache, a target directory)
        ├── ConflictError          a registry write collides with an existing row: what
        ├── RegistryUnreachableError  the registry's connection kept failing until the
        │   │                      call's retries ran out: url, detail, waited_s
        │   └── LeaseLostError     ... past what a held lease allowed: lease (its key), url
        ├── RecordNotFoundError    no such artifact, alias or stage run in the registry
        │                          (exit 6, not found: the registry answered): what, name
        ├── UnreadyError           the artifact's status forbids the verb (a quarantined
        │                          fetch, an unproven pull): digest, status, reason
        └── DeletedError           the artifact is `deleted` (gc may have taken its
                                   files): no verb takes it; digest

Exit 6 (`NOT_FOUND`) is "the registry answered, and has no such thing" (an unknown alias,
ref or model, nothing that serves on this GPU): a script can tell it from exit 4, an outage
or a fault of the registry or store. Those errors keep their place in the tree (`except
RegistryError` still catches a missing record) and only carry the other code.

`pipeline.errors` hangs its own errors (recipe, plan, stage, smoke) under the same root.
Only the CLI catches them; everything else raises with `raise ... from exc`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

NOT_FOUND: Final = 6
"""The exit code of an unknown alias, ref or model (the registry answered: it has none)."""


class DigestValue(Protocol):
    """What an `IntegrityError` carries: a `registry.identity.digest.Digest`, named here by
    its shape, since identity raises these errors and sits above this module."""

    @property
    def algorithm(self) -> str: ...

    @property
    def hex(self) -> str: ...


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the known name closest to *word* (difflib's ratio at least
    0.6), else ""; for messages that quote a misspelt name (recipe keys, aliases, models)."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class EnginectlError(Exception):
    """Base of every error the CLI turns into a one-line message and an exit code."""

    exit_code: int = 1


class UsageError(EnginectlError):
    exit_code = 2


class ConfigError(UsageError):
    """A setting from the environment cannot be used as it is; *variable* names it."""

    def __init__(self, message: str, *, variable: str | None = None,
                 value: str | None = None) -> None:
        self.variable = variable
        self.value = value
        super().__init__(message)


class StoppedError(EnginectlError):
    """Interrupted by the user (SIGINT): what was in flight was cancelled, nothing half-done
    is visible, and the message says what was kept for a re-run."""

    exit_code = 130


class RegistryError(EnginectlError):
    exit_code = 4


class StoreError(RegistryError):
    """A store operation failed and retrying will not help (bad URL, missing bucket, denied)."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        key: str | None = None,
        operation: str | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.url = url
        self.key = key
        self.operation = operation
        self.code = code
        self.request_id = request_id
        details = [
            part
            for part in (
                f"S3 error {code}" if code else None,
                f"request id {request_id}" if request_id else None,
            )
            if part
        ]
        super().__init__(f"{message} ({', '.join(details)})" if details else message)


class DiskFullError(RegistryError):
    """No space (or quota) left on the disk of *path*, *what* it is: the machine's fault,
    never the artifact's (exit 4)."""

    def __init__(self, path: object, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"no space left on the device of {path} ({what}): free space there, "
                         "or use a directory on a larger disk, and run the same command again")


class NotFoundError(RegistryError):
    """The store has no object under *key*."""

    def __init__(self, what: str, *, url: str, key: str) -> None:
        self.what = what
        self.url = url
        self.key = key
        super().__init__(f"{what} not found in {url} (key {key})")


class IntegrityError(RegistryError):
    """Bytes at *location* (a local path or a store object) do not match their digest; or,
    with *actual* None, they cannot be it (*detail* says why: the wrong size)."""

    def __init__(self, location: str, *, expected: DigestValue, actual: DigestValue | None,
                 detail: str | None = None, hint: str | None = None) -> None:
        self.location = location
        self.expected = expected
        self.actual = actual
        self.detail = detail
        self.hint = hint
        got = f"got {actual}" if actual is not None else (detail or "got other bytes")
        message = f"integrity check failed for {location}: expected {expected}, {got}"
        super().__init__(f"{message}; {hint}" if hint else message)


class SchemaError(RegistryError):
    """The SQL registry's schema is not the one this enginectl writes (`registry.sql.schema`)."""

    def __init__(
        self,
        message: str,
        *,
        revision: str | None = None,
        head: str | None = None,
        url: str | None = None,
    ) -> None:
        self.revision = revision
        self.head = head
        self.url = url
        super().__init__(message)


class NoRegistryError(SchemaError):
    """A read found no registry at *url*: no SQLite file (*missing*), or a database without
    enginectl's tables. Reads never create one; the message says what does."""

    def __init__(self, url: str, *, missing: bool) -> None:
        self.missing = missing
        what = (f"no registry at {url} (the file does not exist)" if missing
                else f"registry {url} is empty (no enginectl tables)")
        super().__init__(f"{what}; `enginectl db upgrade` creates it, and so does the first "
                         "command that writes to it (import, build)", url=url)


class DamagedRegistryError(RegistryError):
    """The SQLite file at *path* is not a usable database (garbage, truncated, scrambled or
    empty); the store still holds everything, and `enginectl reindex` rebuilds from it."""

    def __init__(self, path: str, detail: str | None = None) -> None:
        self.path = path
        self.detail = detail
        if detail is None:  # an empty file is never taken for a new registry
            message = (f"registry file {path} is empty (0 bytes), not a registry: if it was "
                       f"truncated, move it aside (mv {path} {path}.damaged) and run "
                       "`enginectl reindex` to rebuild it from the store; to start a new, "
                       "empty registry, delete it")
        else:
            message = (f"registry file {path} is damaged ({detail}); move it aside (mv {path} "
                       f"{path}.damaged) and run `enginectl reindex` to rebuild it from the "
                       "store")
        super().__init__(message)


class ConflictError(RegistryError):
    """A registry write collides with a row that exists (a digest, an alias, a key)."""

    def __init__(self, message: str, *, what: str | None = None) -> None:
        self.what = what
        super().__init__(message)


class RegistryUnreachableError(RegistryError):
    """The registry at *url* kept failing with connection faults (*detail*: the last one)
    for *waited_s* seconds, until the call's retry window ran out."""

    def __init__(self, url: str, detail: str, *, waited_s: float,
                 message: str | None = None) -> None:
        self.url = url
        self.detail = detail
        self.waited_s = waited_s
        super().__init__(message or (
            f"cannot use registry {url}: no answer for {waited_s:.0f} s ({detail}); "
            "ENGINECTL_REGISTRY_RETRY_S sets how long a command waits for it"))


class LeaseLostError(RegistryUnreachableError):
    """As `RegistryUnreachableError`, stopped because *lease* ("lease on k1:...", the one
    this process must renew first) would have expired: its holder stops before another
    builder may take its key over."""

    def __init__(self, lease: str, url: str, detail: str, *, waited_s: float) -> None:
        self.lease = lease
        self.key = lease.removeprefix("lease on ")
        super().__init__(url, detail, waited_s=waited_s, message=(
            f"{lease} lost: registry {url} did not answer for {waited_s:.0f} s ({detail}); "
            "stopped before another builder may take it over; run the same command again "
            "once the registry answers"))


class RecordNotFoundError(RegistryError):
    """The registry has no *what* (artifact, alias, stage run) called *name* (exit 6)."""

    exit_code = NOT_FOUND

    def __init__(self, what: str, name: str, *, hint: str | None = None) -> None:
        self.what = what
        self.name = name
        message = f"no {what} {name!r} in the registry"
        super().__init__(f"{message}; {hint}" if hint else message)


class ManifestError(RegistryError):
    """A manifest is malformed or unsafe: an absolute or `..` path, a duplicate, a link."""


class UnknownModelError(UsageError):
    """The registry has no artifact of *model* (a typo, or the wrong registry; exit 6)."""

    exit_code = NOT_FOUND

    def __init__(self, model: str, known: list[str]) -> None:
        self.model = model
        self.known = known
        hint = did_you_mean(model, known)
        listed = f" (it has {', '.join(known[:8])}{', …' if len(known) > 8 else ''})" \
            if known else " (it has none yet)"
        super().__init__(f"no artifact of model {model!r} in the registry{hint}{listed}; "
                         "`enginectl ls` lists them")


class NothingResolvableError(UsageError):
    """No artifact of *model* can serve on *gpu*; *reasons* has one line per rejection
    (exit 6: the registry answered, and has nothing for this node)."""

    exit_code = NOT_FOUND

    def __init__(self, model: str, gpu: str, reasons: list[str], *, next_step: str) -> None:
        self.model = model
        self.gpu = gpu
        self.reasons = reasons
        first = f"nothing to serve {model} on {gpu}: {len(reasons)} artifacts rejected; "
        lines = [first + next_step]
        lines += [f"  {reason}" for reason in reasons]
        super().__init__("\n".join(lines))


class UnreadyError(RegistryError):
    """*digest* is *status*, which the verb does not take without --allow-unready."""

    def __init__(self, digest: str, status: str, reason: str | None, *, verb: str) -> None:
        self.digest = digest
        self.status = status
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(f"artifact {digest} is {status}{why}: {verb} takes it only with "
                         f"--allow-unready; `enginectl show {digest[:19]}` has its reports")


class DeletedError(RegistryError):
    """*digest* is `deleted`: a state of the registry, so exit 4, and no flag takes it."""

    def __init__(self, digest: str, *, verb: str) -> None:
        self.digest = digest
        super().__init__(f"artifact {digest} is deleted (gc may have removed its files): "
                         f"{verb} another (`enginectl ls` lists what there is), or build it "
                         "again")


class AliasToolchainError(UsageError):
    """Alias *alias* points at *digest*, which needs *needs* (`trtllm 1.3.0`) where this node
    has *have*, and no earlier target of it runs here (exit 6: nothing for this node)."""

    exit_code = NOT_FOUND

    def __init__(self, alias: str, digest: str, needs: list[str], have: str) -> None:
        self.alias = alias
        self.digest = digest
        self.needs = needs
        super().__init__(
            f"{alias} needs {', '.join(needs)}: its target {digest[:19]}… was proven only "
            f"there, and this node has {have}; no earlier target of it runs on this node's "
            f"toolchain; run a node with {', '.join(needs)}, or pull a digest by name to take "
            "one anyway")
