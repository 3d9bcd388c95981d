"""publish: a directory becomes an artifact — blobs first, then the manifest, then one
registry transaction.

A crash at any point leaves no visible half-artifact: blobs without a manifest are
unreferenced (gc removes them after the grace period), a manifest without a registry row is
complete (reindex adopts it), and the registry row is written last, in one transaction.
Publishing the same content twice is a no-op; identical files are stored once.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from registry import records
from registry.digest import digest_file
from registry.errors import ManifestError
from registry.manifest import FileEntry, Manifest, check_path
from registry.progress import NoProgress, Progress
from registry.records import ArtifactKind, ArtifactRecord, ArtifactStatus, FileRecord
from registry.store import WORKERS, Store

if TYPE_CHECKING:
    from registry.context import Context


def scan_directory(root: Path) -> list[tuple[str, Path]]:
    """Every regular file under *root* as (relative POSIX path, path), sorted.

    Links, devices, sockets and FIFOs are refused: an artifact is plain files."""
    if not root.is_dir():
        raise ManifestError(f"{root} is not a directory")
    found: list[tuple[str, Path]] = []
    for directory, subdirs, files in os.walk(root, followlinks=False):
        for name in sorted(subdirs + files):
            path = Path(directory) / name
            mode = path.lstat().st_mode
            relative = path.relative_to(root).as_posix()
            if stat.S_ISLNK(mode):
                raise ManifestError(f"{relative!r} is a symbolic link; artifacts hold plain files")
            if stat.S_ISREG(mode):
                found.append((check_path(relative), path))
            elif not stat.S_ISDIR(mode):
                raise ManifestError(f"{relative!r} is not a regular file")
    return sorted(found)


def hash_directory(root: Path, progress: Progress | None = None) -> list[tuple[FileEntry, Path]]:
    """xxh3-128 and sha256 of every file, in parallel."""
    files = scan_directory(root)
    progress = progress or NoProgress()
    progress.start("hashing", sum(path.stat().st_size for _, path in files))

    def one(item: tuple[str, Path]) -> tuple[FileEntry, Path]:
        relative, path = item
        digests = digest_file(path)
        progress.advance(digests.size)
        assert digests.sha256 is not None  # noqa: S101 - digest_file computes it by default
        return FileEntry(relative, digests.size, digests.xxh3, digests.sha256), path

    with ThreadPoolExecutor(WORKERS) as pool:
        result = list(pool.map(one, files))
    progress.finish()
    return result


@dataclass(frozen=True)
class Uploaded:
    manifest: Manifest
    blobs_uploaded: int
    bytes_uploaded: int


def upload(
    store: Store,
    root: Path,
    *,
    kind: str,
    labels: Mapping[str, Any],
    key: str | None = None,
    toolchain: Mapping[str, Any] | None = None,
    inputs: tuple[str, ...] = (),
    serve: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    hashed: list[tuple[FileEntry, Path]] | None = None,
) -> Uploaded:
    """Put *root*'s missing blobs and then its manifest into *store*. Idempotent."""
    entries = hashed if hashed is not None else hash_directory(root)
    manifest = Manifest(
        kind=kind,
        files=tuple(entry for entry, _ in entries),
        labels={k: v for k, v in labels.items() if v is not None},
        key=key,
        toolchain=dict(toolchain or {}),
        inputs=inputs,
        serve=serve,
    )
    sources = {entry.xxh3: path for entry, path in entries}
    sizes = {entry.xxh3: entry.size for entry, _ in entries}
    missing = sorted(store.missing_blobs(sources))
    progress = progress or NoProgress()
    progress.start("uploading", sum(sizes[d] for d in missing))
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda d: store.put_blob(d, sources[d], progress=progress.advance), missing))
    progress.finish()
    store.put_manifest(manifest.digest, manifest.to_bytes())
    return Uploaded(manifest, len(missing), sum(sizes[d] for d in missing))


LABEL_COLUMNS = (
    "runtime", "gpu", "sm", "quant", "kv_cache_dtype", "max_batch_size", "max_input_len",
    "max_seq_len", "max_num_tokens",
)


def record_of(
    manifest: Manifest,
    *,
    status: ArtifactStatus,
    status_reason: str | None = None,
    recipe_digest: str | None = None,
) -> ArtifactRecord:
    """The registry row for *manifest*: labels become columns, files become file rows."""
    labels = dict(manifest.labels)
    return ArtifactRecord(
        digest=str(manifest.digest),
        kind=cast(ArtifactKind, manifest.kind),
        model=str(labels["model"]),
        size=manifest.size,
        file_count=len(manifest.files),
        status=status,
        status_reason=status_reason,
        key=manifest.key,
        tp=int(labels.get("tp", 1)),
        pp=int(labels.get("pp", 1)),
        toolchain=dict(manifest.toolchain),
        labels=labels,
        recipe_digest=recipe_digest,
        files=tuple(
            FileRecord(f.path, f.size, str(f.xxh3), str(f.sha256)) for f in manifest.files
        ),
        **{name: labels.get(name) for name in LABEL_COLUMNS},
    )


@dataclass(frozen=True)
class Published:
    digest: str
    manifest: Manifest
    registered: bool  # False: the registry already had it (a no-op publish)
    blobs_uploaded: int
    bytes_uploaded: int


def publish(
    ctx: Context,
    root: Path | str,
    *,
    kind: str,
    labels: Mapping[str, Any],
    status: ArtifactStatus = "built",
    status_reason: str | None = None,
    recipe_digest: str | None = None,
    progress: Progress | None = None,
    **manifest_fields: Any,
) -> Published:
    """Store *root* as an artifact and register it; a no-op for content already there."""
    root = Path(root)
    if "model" not in labels:
        raise ManifestError("an artifact needs a 'model' label")
    uploaded = upload(ctx.store, root, kind=kind, labels=labels, progress=progress,
                      **manifest_fields)
    record = record_of(uploaded.manifest, status=status, status_reason=status_reason,
                       recipe_digest=recipe_digest)
    with ctx.registry.session() as session:
        registered = records.add_artifact_if_absent(session, record)
    return Published(record.digest, uploaded.manifest, registered, uploaded.blobs_uploaded,
                     uploaded.bytes_uploaded)
