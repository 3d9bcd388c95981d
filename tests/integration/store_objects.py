"""A store's objects as a test makes and damages them: random blobs of a size with their digest,
made-up digests, and raw reads and writes behind the store's back (a folder, or the S3
server's own client)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from registry.identity.digest import Digest, digest_file
from registry.store.base import Store
from registry.store.filestore import FileStore
from registry.store.s3store import S3Store
from tests.integration.s3server import S3Server

MiB = 1 << 20


@dataclass
class RawObjects:
    """Reads and writes a store's objects behind its back, to corrupt them or add junk."""

    store: Store
    server: S3Server | None

    def write(self, key: str, data: bytes) -> None:
        if isinstance(self.store, FileStore):
            path = self.store.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.chmod(0o644)
            path.write_bytes(data)
        else:
            assert isinstance(self.store, S3Store)
            assert self.server is not None
            full_key = f"{self.store.prefix}/{key}"
            self.server.client.put_object(Bucket=self.store.bucket.name, Key=full_key, Body=data)

    def read(self, key: str) -> bytes:
        if isinstance(self.store, FileStore):
            return (self.store.root / key).read_bytes()
        assert isinstance(self.store, S3Store)
        assert self.server is not None
        full_key = f"{self.store.prefix}/{key}"
        response = self.server.client.get_object(Bucket=self.store.bucket.name, Key=full_key)
        return response["Body"].read()


@dataclass(frozen=True)
class Blob:
    path: Path
    digest: Digest
    size: int


def make_blob(folder: Path, size: int, name: str | None = None) -> Blob:
    path = folder / (name or f"blob-{uuid.uuid4().hex[:8]}")
    with path.open("wb") as handle:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 * MiB))
            handle.write(chunk)
            left -= len(chunk)
    return Blob(path, digest_file(path, with_sha256=False).xxh3, size)


def fake_digest(shard: str, n: int) -> Digest:
    return Digest("xxh3-128", f"{shard}{n:030x}")
