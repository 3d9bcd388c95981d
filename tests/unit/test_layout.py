from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.digest import Digest
from registry.layout import (
    blob_key,
    blob_shard,
    manifest_key,
    parse_blob_key,
    parse_manifest_key,
)

XXH = "0123456789abcdef0123456789abcdef"
SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

hex32 = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@pytest.mark.parametrize(
    ("digest", "key"),
    [
        (Digest("xxh3-128", XXH), f"blobs/xxh3-128/01/{XXH[2:]}"),
        (Digest("xxh3-128", "f" * 32), f"blobs/xxh3-128/ff/{'f' * 30}"),
        (Digest("xxh3-128", "0" * 32), f"blobs/xxh3-128/00/{'0' * 30}"),
    ],
)
def test_blob_key_table(digest: Digest, key: str) -> None:
    assert blob_key(digest) == key
    assert parse_blob_key(key) == digest
    assert blob_shard(digest) == key[: len("blobs/xxh3-128/01/")]


@pytest.mark.parametrize(
    ("digest", "key"),
    [
        (Digest("sha256", SHA), f"manifests/sha256/{SHA}.json"),
        (Digest("sha256", "0" * 64), f"manifests/sha256/{'0' * 64}.json"),
    ],
)
def test_manifest_key_table(digest: Digest, key: str) -> None:
    assert manifest_key(digest) == key
    assert parse_manifest_key(key) == digest


def test_keys_refuse_the_other_algorithm() -> None:
    with pytest.raises(ValueError, match="xxh3-128"):
        blob_key(Digest("sha256", SHA))
    with pytest.raises(ValueError, match="xxh3-128"):
        blob_shard(Digest("sha256", SHA))
    with pytest.raises(ValueError, match="sha256"):
        manifest_key(Digest("xxh3-128", XXH))


BAD_BLOB_KEYS = [
    "",
    f"blobs/xxh3-128/{XXH}",  # not sharded
    f"blobs/xxh3-128/01/{XXH}",  # shard repeated in the name
    f"blobs/xxh3-128/01/{XXH[2:-1]}",  # one hex short
    f"blobs/xxh3-128/01/{XXH[2:]}0",  # one hex long
    f"blobs/xxh3-128/0/1{XXH[2:]}",  # shard of one
    f"blobs/xxh3-128/01/{XXH[2:].upper()}",  # uppercase
    f"blobs/xxh3-128/AB/{XXH[2:]}",
    f"blobs/xxh3-128/0g/{XXH[2:]}",  # not hex
    f"blobs/sha256/01/{XXH[2:]}",  # wrong algorithm folder
    f"/blobs/xxh3-128/01/{XXH[2:]}",  # absolute
    f"blobs/xxh3-128/01/{XXH[2:]}/",  # trailing slash
    f"blobs/xxh3-128/01/{XXH[2:]}\n",  # trailing newline
    f"blobs/xxh3-128/01/../01/{XXH[2:]}",  # traversal
    f"blobs/xxh3-128/../../etc/{XXH[2:]}",
    f"blobs/xxh3-128/01/.{XXH[2:]}.5f3a9c.tmp",  # a store's temp file
    f"blobs/xxh3-128/01/{XXH[2:]}.tmp",
    f"prefix/blobs/xxh3-128/01/{XXH[2:]}",  # a store prefix was not removed
    f"blobs\\xxh3-128\\01\\{XXH[2:]}",  # Windows separators
    f"manifests/sha256/{SHA}.json",
]

BAD_MANIFEST_KEYS = [
    "",
    f"manifests/sha256/{SHA}",  # no extension
    f"manifests/sha256/{SHA}.JSON",
    f"manifests/sha256/{SHA.upper()}.json",
    f"manifests/sha256/{SHA[:-1]}.json",
    f"manifests/sha256/{SHA}0.json",
    f"manifests/sha256/sha256:{SHA}.json",
    f"manifests/xxh3-128/{SHA}.json",
    f"/manifests/sha256/{SHA}.json",
    f"manifests/sha256/../sha256/{SHA}.json",
    f"manifests/sha256/{SHA}.json\n",
    f"manifests/sha256/.{SHA}.json.1a2b.tmp",
    f"manifests/sha256/{SHA[:2]}/{SHA[2:]}.json",
    f"blobs/xxh3-128/01/{XXH[2:]}",
]


@pytest.mark.parametrize("key", BAD_BLOB_KEYS)
def test_parse_blob_key_rejects(key: str) -> None:
    with pytest.raises(ValueError, match="not a blob key"):
        parse_blob_key(key)


@pytest.mark.parametrize("key", BAD_MANIFEST_KEYS)
def test_parse_manifest_key_rejects(key: str) -> None:
    with pytest.raises(ValueError, match="not a manifest key"):
        parse_manifest_key(key)


@given(hex32)
def test_blob_key_round_trip(hex_digits: str) -> None:
    digest = Digest("xxh3-128", hex_digits)
    key = blob_key(digest)
    assert parse_blob_key(key) == digest
    assert key.startswith(blob_shard(digest))
    assert ".." not in key.split("/")
    assert not key.startswith("/")


@given(hex64)
def test_manifest_key_round_trip(hex_digits: str) -> None:
    digest = Digest("sha256", hex_digits)
    assert parse_manifest_key(manifest_key(digest)) == digest


@given(st.text(max_size=120))
def test_parse_is_the_exact_inverse(key: str) -> None:
    """Whatever parses must be exactly the key that its digest maps to, and nothing else."""
    for parse, make in ((parse_blob_key, blob_key), (parse_manifest_key, manifest_key)):
        try:
            digest = parse(key)
        except ValueError:
            continue
        assert make(digest) == key


@given(hex32, st.text(min_size=1))
def test_any_extra_text_is_rejected(hex_digits: str, extra: str) -> None:
    blob = blob_key(Digest("xxh3-128", hex_digits))
    manifest = manifest_key(Digest("sha256", hex_digits * 2))
    for mangled in (extra + blob, blob + extra):
        with pytest.raises(ValueError, match="not a blob key"):
            parse_blob_key(mangled)
    for mangled in (extra + manifest, manifest + extra):
        with pytest.raises(ValueError, match="not a manifest key"):
            parse_manifest_key(mangled)
