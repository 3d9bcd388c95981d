"""Where things live in a store: digest ↔ key, the same on every backend.

    blobs/xxh3-128/<first 2 hex>/<remaining 30 hex>     file bytes, shared across artifacts
    manifests/sha256/<64 hex>.json                      one artifact's canonical manifest

Keys are relative, use `/`, and are the same strings on disk (under the store root) and in a
bucket (under the prefix). Each `*_key` function and its `parse_*_key` are exact inverses;
parsing is strict, so a temp file, a stray object or a traversal attempt is never mistaken
for a stored blob.
"""

from __future__ import annotations

import re
from typing import Final

from registry.digest import Digest

BLOBS: Final = "blobs/xxh3-128/"
MANIFESTS: Final = "manifests/sha256/"

_BLOB_KEY: Final = re.compile(r"blobs/xxh3-128/([0-9a-f]{2})/([0-9a-f]{30})")
_MANIFEST_KEY: Final = re.compile(r"manifests/sha256/([0-9a-f]{64})\.json")


def _require(digest: Digest, algorithm: str) -> None:
    if digest.algorithm != algorithm:
        raise ValueError(f"expected a {algorithm} digest, got {digest}")


def blob_shard(digest: Digest) -> str:
    """The folder (prefix ending in `/`) that holds *digest*'s blob."""
    _require(digest, "xxh3-128")
    return f"{BLOBS}{digest.hex[:2]}/"


def blob_key(digest: Digest) -> str:
    """`blobs/xxh3-128/ab/<30 hex>` for an xxh3-128 digest; ValueError for any other."""
    return f"{blob_shard(digest)}{digest.hex[2:]}"


def manifest_key(digest: Digest) -> str:
    """`manifests/sha256/<64 hex>.json` for a sha256 digest; ValueError for any other."""
    _require(digest, "sha256")
    return f"{MANIFESTS}{digest.hex}.json"


def parse_blob_key(key: str) -> Digest:
    """The digest stored at *key*; ValueError unless *key* is exactly what `blob_key` makes."""
    match = _BLOB_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a blob key: {key!r} (expected 'blobs/xxh3-128/<2 hex>/<30 hex>')")
    return Digest("xxh3-128", match.group(1) + match.group(2))


def parse_manifest_key(key: str) -> Digest:
    """The digest stored at *key*; ValueError unless *key* is exactly what `manifest_key` makes."""
    match = _MANIFEST_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a manifest key: {key!r} (expected 'manifests/sha256/<64 hex>.json')")
    return Digest("sha256", match.group(1))
