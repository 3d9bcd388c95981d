"""The marker `pull` and `fetch` leave in a directory they fill, read strictly.

    {"schema": "enginectl.target/v1", "by": "pull", "digest": "sha256:…",
     "sources": ["sha256:…", …], "under": [["tokenizer", "sha256:…"]],
     "writable": {".warm": "sha256:…"},
     "entries": ["config.json", "rank0.engine", "serve.json", …]}

It says who filled the directory (*by*), the artifact (*digest*), the artifacts whose files
lie at its top (*sources*) or in a folder of it (*under*: an engine's tokenizer directory,
files of the checkpoint it was built from), the directories a runtime writes into after they
are placed (*writable*: a pull's warm cache) and the top-level names placed (*entries*);
`filling` (HOST-PID) while a fill of a mount point is in progress. Anyone can write this
file, so a marker proves nothing by itself: `registry.ops.target` proves each entry against
the manifests of the digests it records, read from the cache or the store. Reading it here
only refuses what enginectl never writes: an entry that is not a bare name (a `/`, a `\\`,
`.`, `..`, an absolute path), a digest that is not one. A `serve.json` alone is no marker.

Imports only `registry.identity` and `registry.errors`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from registry.errors import UsageError
from registry.identity.digest import Digest
from registry.identity.manifest import FILL_MARKER

MARKER: Final = FILL_MARKER  # never part of an artifact: import skips it
MARKER_SCHEMA: Final = "enginectl.target/v1"
SERVE_FILE: Final = "serve.json"
SERVE_SCHEMA: Final = "enginectl.serve/v1"
LOST_FOUND: Final = "lost+found"
WRITABLE: Final = frozenset({".warm"})
"""The only names a marker may record as *writable*: a pull's warm cache directory
(`pipeline.deploy.warm.WARM_DIR`), whose content the runtime grows, so it cannot be proven
file by file. Any other name would let a marker someone wrote vouch for a folder of theirs."""
TEMPORARY: Final = (f".{MARKER}.tmp-", f".{SERVE_FILE}.tmp-")
"""Names of the marker and serve.json while they are written (atomically, through these)."""

By = Literal["pull", "fetch"]


class MarkerError(UsageError):
    """A marker enginectl did not write: *directory* and what is wrong with it (exit 2)."""

    def __init__(self, directory: Path, problem: str) -> None:
        self.directory = directory
        self.problem = problem
        super().__init__(f"refusing to replace {directory}: its {MARKER} {problem}, so nothing "
                         "in it is known to be enginectl's; move what you keep out and remove "
                         "the marker, or use another directory")


@dataclass(frozen=True)
class Marker:
    """Who filled a directory and what they put there, as the marker claims it."""

    by: By
    digest: str | None
    entries: frozenset[str]
    sources: tuple[str, ...] = ()
    under: tuple[tuple[str, str], ...] = ()
    writable: Mapping[str, str] = field(default_factory=dict)
    filling: str | None = None
    legacy: bool = False  # written before markers recorded their sources


def bare_name(name: object) -> bool:
    """Whether *name* is one name of a directory's top: no `/` or `\\`, not `.`, `..`,
    empty or absolute, no NUL. Pure."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name)  # no "/": never absolute


def _digest(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = Digest.parse(value)
    except ValueError:
        return None
    return value if parsed.algorithm == "sha256" else None


def parse_marker(directory: Path, data: Any) -> Marker:
    """The marker *data* (parsed JSON) of *directory*; MarkerError when enginectl could not
    have written it. Pure."""
    if not isinstance(data, dict) or data.get("schema") != MARKER_SCHEMA:
        raise MarkerError(directory, f"is not a {MARKER_SCHEMA} marker")
    by, entries = data.get("by"), data.get("entries")
    if by not in ("pull", "fetch"):
        raise MarkerError(directory, f"names {by!r} as its writer, not pull or fetch")
    if not isinstance(entries, list):
        raise MarkerError(directory, "lists no entries")
    for name in entries:
        if not bare_name(name):
            raise MarkerError(directory, f"names {name!r}, which is not a name in it")
    digest = data.get("digest")
    if digest is not None and _digest(digest) is None:
        raise MarkerError(directory, f"records {digest!r}, which is not a digest")
    sources = data.get("sources", [digest] if digest is not None else [])
    under, writable = data.get("under", []), data.get("writable", {})
    if not isinstance(sources, list) or not isinstance(writable, dict) \
            or not isinstance(under, list) \
            or not all(isinstance(pair, list) and len(pair) == 2 for pair in under):
        raise MarkerError(directory, "records its sources in a form enginectl never writes")
    for value in (*sources, *(pair[1] for pair in under), *writable.values()):
        if _digest(value) is None:
            raise MarkerError(directory, f"records {value!r}, which is not a digest")
    for name in (*(pair[0] for pair in under), *writable):
        if not bare_name(name):
            raise MarkerError(directory, f"names {name!r}, which is not a name in it")
        if name in writable and name not in WRITABLE:
            raise MarkerError(directory, f"names {name!r} as a folder the runtime writes, "
                                         "which enginectl never places")
    filling = data.get("filling")
    return Marker(by=by, digest=digest, entries=frozenset(entries), sources=tuple(sources),
                  under=tuple((str(name), str(value)) for name, value in under),
                  writable={str(k): str(v) for k, v in writable.items()},
                  filling=filling if isinstance(filling, str) else None,
                  legacy="sources" not in data)


def read_json(path: Path, limit: int = 1 << 20) -> Any:
    """The JSON in the regular file *path* (at most *limit* bytes); None when it is not one."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > limit:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_marker(directory: Path) -> Marker | None:
    """The marker of *directory*, None when it has none; MarkerError when it has one that
    enginectl could not have written (`parse_marker`). One written before markers recorded
    their sources takes them from the pull's `serve.json` (its `sources`, each also as the
    tokenizer directory's, and its `warm_cache`): claims like the marker's own, proven the
    same way."""
    path = directory / MARKER
    if not path.exists() and not path.is_symlink():
        return None
    data = read_json(path)
    if data is None:
        raise MarkerError(directory, "is not a file of JSON")
    marker = parse_marker(directory, data)
    serve = read_json(directory / SERVE_FILE) if marker.legacy else None
    if not isinstance(serve, dict) or serve.get("schema") != SERVE_SCHEMA:
        return marker
    sources = [d for d in serve.get("sources") or [] if _digest(d) is not None]
    warm = _digest(serve.get("warm_cache"))
    return replace(marker, sources=(*marker.sources, *sources),
                   under=tuple(("tokenizer", d) for d in sources),
                   writable={".warm": warm} if warm is not None else {})


def is_serve_file(path: Path) -> bool:
    """Whether *path* is a `serve.json` a pull wrote (its schema), or one in the writing."""
    data = read_json(path)
    return isinstance(data, dict) and data.get("schema") == SERVE_SCHEMA


def is_temporary(path: Path) -> bool:
    """Whether *path* is a marker or serve.json that a killed writer left under its temp
    name: a regular file of the right schema."""
    data = read_json(path)
    return isinstance(data, dict) and data.get("schema") in (MARKER_SCHEMA, SERVE_SCHEMA)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """*data* at *path*, replaced atomically (through `.NAME.tmp-PID`)."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temp.replace(path)


def write_marker(directory: Path, *, by: By, digest: str | None, entries: Iterable[str],
                 sources: Iterable[str] = (), under: Iterable[tuple[str, str]] = (),
                 writable: Mapping[str, str] | None = None,
                 filling: str | None = None) -> None:
    """Say that *by* put *entries* (top-level names) from *sources* in *directory*."""
    data: dict[str, Any] = {
        "schema": MARKER_SCHEMA, "by": by, "digest": digest,
        "entries": sorted(set(entries) - {MARKER}),
        "sources": list(dict.fromkeys(sources)),
        "under": [list(pair) for pair in dict.fromkeys(under)],
        "writable": dict(writable or {})}
    if filling is not None:
        data["filling"] = filling
    write_json(directory / MARKER, data)
