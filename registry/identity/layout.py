"""Where things live in a store: digest ↔ key, the same on every backend.

    blobs/xxh3-128/<first 2 hex>/<remaining 30 hex>     file bytes, shared across artifacts
    manifests/sha256/<64 hex>.json                      one artifact's canonical manifest
    records/sha256/<64 hex>/<kind>/<at>-<32 hex>.json   what happened to that artifact: a
                                                        smoke report (`smoke`) or a status
                                                        change (`status`), one immutable
                                                        JSON object each
    aliases/<alias name>/<at>-<32 hex>.json             one move of an alias (or its removal)
    damaged/<at>-<32 hex>/<blob or manifest key>        an object a fetch or `fsck --repair`
                                                        found damaged, set aside (gc removes
                                                        it past the grace period)

`<at>` is the UTC time the record was made, `YYYYMMDDTHHMMSSffffffZ` (microseconds, so keys
sort by time), and the 32 hex digits a random token that keeps two records made in the same
microsecond apart. Alias names are those `registry.identity.refs.check_alias_name` accepts
(lowercase, `/`-separated, no empty, `.` or `..` segment), so a name is a safe key as it is.

Object names (S3 calls them keys) are relative, use `/`, and are the same strings on disk
(under the store root) and in a bucket (under the prefix). Each `*_name` function and its
`parse_*_name` are exact inverses; parsing is strict, so a temp file, a stray object or a
traversal attempt is never mistaken for a stored object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, get_args

from registry.identity.digest import Digest
from registry.identity.refs import valid_alias_name

BLOBS: Final = "blobs/xxh3-128/"
MANIFESTS: Final = "manifests/sha256/"
RECORDS: Final = "records/sha256/"
ALIASES: Final = "aliases/"
DAMAGED: Final = "damaged/"

RecordKind = Literal["smoke", "status"]
RECORD_KINDS: Final[tuple[str, ...]] = get_args(RecordKind)

_BLOB_KEY: Final = re.compile(r"blobs/xxh3-128/([0-9a-f]{2})/([0-9a-f]{30})")
_MANIFEST_KEY: Final = re.compile(r"manifests/sha256/([0-9a-f]{64})\.json")
_STAMP: Final = r"([0-9]{8}T[0-9]{12}Z)-([0-9a-f]{32})"
_RECORD_KEY: Final = re.compile(rf"records/sha256/([0-9a-f]{{64}})/([a-z]+)/{_STAMP}\.json")
_ALIAS_KEY: Final = re.compile(rf"aliases/(.+)/{_STAMP}\.json")
_DAMAGED_KEY: Final = re.compile(rf"damaged/{_STAMP}/(.+)")
_TIME_FORMAT: Final = "%Y%m%dT%H%M%S%fZ"
_TOKEN: Final = re.compile(r"[0-9a-f]{32}")


def s3_url(bucket: str, key: str) -> str:
    """Where an object of an S3 store is, as messages name it."""
    return f"s3://{bucket}/{key}"


def _require(digest: Digest, algorithm: str) -> None:
    if digest.algorithm != algorithm:
        raise ValueError(f"expected a {algorithm} digest, got {digest}")


def blob_shard(digest: Digest) -> str:
    """The folder (prefix ending in `/`) that holds *digest*'s blob."""
    _require(digest, "xxh3-128")
    return f"{BLOBS}{digest.hex[:2]}/"


def blob_name(digest: Digest) -> str:
    """`blobs/xxh3-128/ab/<30 hex>` for an xxh3-128 digest; ValueError for any other."""
    return f"{blob_shard(digest)}{digest.hex[2:]}"


def manifest_name(digest: Digest) -> str:
    """`manifests/sha256/<64 hex>.json` for a sha256 digest; ValueError for any other."""
    _require(digest, "sha256")
    return f"{MANIFESTS}{digest.hex}.json"


def parse_blob_name(key: str) -> Digest:
    """The digest stored at *key*; ValueError unless *key* is exactly what `blob_name` makes."""
    match = _BLOB_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a blob key: {key!r} (expected 'blobs/xxh3-128/<2 hex>/<30 hex>')")
    return Digest("xxh3-128", match.group(1) + match.group(2))


def parse_manifest_name(key: str) -> Digest:
    """The digest stored at *key*; ValueError unless *key* is exactly what `manifest_name` makes."""
    match = _MANIFEST_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a manifest key: {key!r} (expected 'manifests/sha256/<64 hex>.json')")
    return Digest("sha256", match.group(1))


# records: when, and a token


def format_time(at: datetime) -> str:
    """`20261201T093000123456Z` for an aware time (converted to UTC); ValueError if naive."""
    if at.tzinfo is None:
        raise ValueError(f"naive datetime {at!r}; record times are aware UTC")
    return at.astimezone(UTC).strftime(_TIME_FORMAT)


def parse_time(text: str) -> datetime:
    """The inverse of `format_time`; ValueError for anything else."""
    message = f"not a record time: {text!r} (expected YYYYMMDDTHHMMSSffffffZ)"
    if not re.fullmatch(r"[0-9]{8}T[0-9]{12}Z", text):
        raise ValueError(message)
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:  # a month 13, a 30th of February
        raise ValueError(message) from exc


def _stamp(at: datetime, token: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"not a record token: {token!r} (expected 32 hex digits)")
    return f"{format_time(at)}-{token}"


@dataclass(frozen=True, slots=True)
class RecordName:
    """Where one record of an artifact lives: `records/sha256/<hex>/<kind>/<at>-<token>.json`."""

    artifact: Digest
    kind: RecordKind
    at: datetime
    token: str

    def __str__(self) -> str:
        return record_name(self.artifact, self.kind, self.at, self.token)


def record_prefix(artifact: Digest | None = None) -> str:
    """`records/sha256/` (every record), or the folder of one artifact's records."""
    if artifact is None:
        return RECORDS
    _require(artifact, "sha256")
    return f"{RECORDS}{artifact.hex}/"


def record_name(artifact: Digest, kind: str, at: datetime, token: str) -> str:
    """`records/sha256/<64 hex>/<kind>/<at>-<token>.json`; ValueError for a digest that is
    not sha256, an unknown kind, a naive time or a token that is not 32 hex digits."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"unknown record kind {kind!r} (one of {', '.join(RECORD_KINDS)})")
    return f"{record_prefix(artifact)}{kind}/{_stamp(at, token)}.json"


def parse_record_name(key: str) -> RecordName:
    """The record at *key*; ValueError unless *key* is exactly what `record_name` makes."""
    match = _RECORD_KEY.fullmatch(key)
    if match is None or match.group(2) not in RECORD_KINDS:
        raise ValueError(f"not a record key: {key!r} "
                         "(expected 'records/sha256/<64 hex>/<kind>/<at>-<32 hex>.json')")
    kind: RecordKind = "smoke" if match.group(2) == "smoke" else "status"
    return RecordName(Digest("sha256", match.group(1)), kind, parse_time(match.group(3)),
                      match.group(4))


@dataclass(frozen=True, slots=True)
class AliasRecordName:
    """Where one move of an alias lives: `aliases/<name>/<at>-<token>.json`."""

    name: str
    at: datetime
    token: str

    def __str__(self) -> str:
        return alias_record_name(self.name, self.at, self.token)


def alias_record_name(name: str, at: datetime, token: str) -> str:
    """`aliases/<name>/<at>-<token>.json`; ValueError for a name `check_alias_name` refuses."""
    if not valid_alias_name(name):
        raise ValueError(f"not an alias name: {name!r}")
    return f"{ALIASES}{name}/{_stamp(at, token)}.json"


def parse_alias_record_name(key: str) -> AliasRecordName:
    """The alias move at *key*; ValueError unless *key* is exactly what `alias_record_name`
    makes."""
    match = _ALIAS_KEY.fullmatch(key)
    if match is None or not valid_alias_name(match.group(1)):
        raise ValueError(f"not an alias record key: {key!r} "
                         "(expected 'aliases/<alias name>/<at>-<32 hex>.json')")
    return AliasRecordName(match.group(1), parse_time(match.group(2)), match.group(3))


@dataclass(frozen=True, slots=True)
class DamagedName:
    """A blob or manifest set aside: `damaged/<at>-<token>/<its key>`."""

    original: str
    at: datetime
    token: str

    def __str__(self) -> str:
        return damaged_name(self.original, self.at, self.token)


def damaged_name(original: str, at: datetime, token: str) -> str:
    """Where the object at *original* (a blob or manifest key) is set aside."""
    _parse_object_name(original)
    return f"{DAMAGED}{_stamp(at, token)}/{original}"


def parse_damaged_name(key: str) -> DamagedName:
    """The object set aside at *key*; ValueError unless *key* is what `damaged_name` makes."""
    match = _DAMAGED_KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"not a damaged key: {key!r} (expected 'damaged/<at>-<32 hex>/<key>')")
    _parse_object_name(match.group(3))
    return DamagedName(match.group(3), parse_time(match.group(1)), match.group(2))


def _parse_object_name(key: str) -> Digest:
    """The digest of a blob or manifest *key*; ValueError for anything else."""
    for parse in (parse_blob_name, parse_manifest_name):
        try:
            return parse(key)
        except ValueError:
            continue
    raise ValueError(f"not a blob or manifest key: {key!r}")
