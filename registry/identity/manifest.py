"""The manifest: what an artifact is, file by file. Its sha256 is the artifact's digest.

A manifest is canonical JSON of:

    schema      "enginectl.manifest/v1"
    kind        trtllm-engine | trtllm-checkpoint | vllm | hf-checkpoint |
                quantized-checkpoint | converted-checkpoint | warm-cache | refit-equivalence
    key         the stage key that asked for it (null for imports)
    labels      model, runtime, gpu, sm, quant, kv_cache_dtype, tp, pp, and the shape; a
                weight-stripped engine's strip_plan and refit_source (its checkpoint's digest)
    toolchain   the fingerprint it is tied to
    inputs      digests of the artifacts it was made from (provenance)
    files       [{path, size, xxh3, sha256}], sorted by path
    serve       how to serve it: {"argv": [...]} with {model_dir} and {port} placeholders, or null

Paths are relative, POSIX, normalised, unique, and never contain `..`, absolute parts,
backslashes, control characters or a part longer than a file system takes (NAME_MAX bytes);
a file may not also be a directory of another path.
Every check runs on parse, so a manifest from a store is as trusted as one we wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from registry.errors import ManifestError
from registry.identity.canonical import canonical_json, floats_as_strings
from registry.identity.digest import Digest, sha256_of

SCHEMA: Final = "enginectl.manifest/v1"
KINDS: Final = (  # the artifact kinds; the registry's `kind` column holds one of these
    "trtllm-engine",
    "trtllm-checkpoint",
    "vllm",
    "hf-checkpoint",
    "quantized-checkpoint",
    "converted-checkpoint",
    "warm-cache",  # the compile and tuning caches a runtime wrote serving another artifact
    "refit-equivalence",  # proof that refitted stripped engines serve as whole ones do
)
LABELS: Final = (
    "model", "runtime", "gpu", "sm", "quant", "kv_cache_dtype", "tp", "pp",
    "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
    "artifact",  # a warm cache's: the digest of the artifact whose server wrote it
    "strip_plan",  # a weight-stripped engine's: true
    "refit_source",  # and the digest of the checkpoint it is refitted from (gc keeps it)
)
_BAD_CHARS: Final = re.compile(r"[\x00-\x1f\x7f\\]")
NAME_MAX: Final = 255
"""The longest name (in UTF-8 bytes) the file systems a fetch writes to take."""
FILL_MARKER: Final = ".enginectl-target.json"
"""What `pull` and `fetch` leave at the top of a directory they fill (`registry.ops.marker`):
never part of an artifact, so importing a fetched directory gives back the same digest."""


def check_path(path: str) -> str:
    """Return *path* if it is a safe relative POSIX path, else raise ManifestError."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"file path {path!r} is empty or not a string")
    if _BAD_CHARS.search(path):
        raise ManifestError(f"file path {path!r} has a backslash or control character")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise ManifestError(f"file path {path!r} is absolute")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"file path {path!r} is not normalised (empty, '.' or '..' part)")
    for part in parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            raise ManifestError(f"file path {path[:60]!r}… has a name of {size} bytes; file "
                                f"systems take at most {NAME_MAX}")
    return path


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    xxh3: Digest
    sha256: Digest

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "xxh3": str(self.xxh3),
                "sha256": str(self.sha256)}


@dataclass(frozen=True)
class Manifest:
    kind: str
    files: tuple[FileEntry, ...]
    labels: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    toolchain: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    serve: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ManifestError(f"unknown artifact kind {self.kind!r}")
        unknown = set(self.labels) - set(LABELS)
        if unknown:
            raise ManifestError(f"unknown labels {sorted(unknown)}")
        paths = [check_path(f.path) for f in self.files]
        if len(set(paths)) != len(paths):
            dupes = sorted({p for p in paths if paths.count(p) > 1})
            raise ManifestError(f"duplicate file paths {dupes}")
        as_dirs = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
        clash = sorted(as_dirs & set(paths))
        if clash:
            raise ManifestError(f"{clash[0]!r} is both a file and a directory")
        for entry in self.files:
            if entry.size < 0:
                raise ManifestError(f"file {entry.path!r} has a negative size")
        for digest in self.inputs:
            Digest.parse(digest)
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda f: f.path)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": self.kind,
            "key": self.key,
            "labels": dict(self.labels),
            "toolchain": dict(self.toolchain),
            "inputs": sorted(self.inputs),
            "files": [f.as_dict() for f in self.files],
            "serve": None if self.serve is None else dict(self.serve),
        }

    def to_bytes(self) -> bytes:
        return canonical_json(floats_as_strings(self.as_dict()))

    @property
    def digest(self) -> Digest:
        return sha256_of(self.to_bytes())

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest is not JSON: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Any) -> Manifest:
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
            raise ManifestError(f"not an {SCHEMA} manifest")
        try:
            files = tuple(
                FileEntry(
                    path=entry["path"],
                    size=int(entry["size"]),
                    xxh3=_digest(entry["xxh3"], "xxh3-128"),
                    sha256=_digest(entry["sha256"], "sha256"),
                )
                for entry in _list(raw.get("files"))
            )
            return cls(
                kind=raw["kind"],
                files=files,
                labels=dict(raw.get("labels") or {}),
                key=raw.get("key"),
                toolchain=dict(raw.get("toolchain") or {}),
                inputs=tuple(_list(raw.get("inputs"))),
                serve=raw.get("serve"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from exc


def _list(value: Any) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _digest(text: Any, algorithm: str) -> Digest:
    digest = Digest.parse(str(text))
    if digest.algorithm != algorithm:
        raise ValueError(f"{text!r} is not a {algorithm} digest")
    return digest
