from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.identity.digest import Digest
from registry.identity.layout import (
    RECORD_KINDS,
    alias_record_name,
    blob_name,
    blob_shard,
    damaged_name,
    format_time,
    manifest_name,
    parse_alias_record_name,
    parse_blob_name,
    parse_damaged_name,
    parse_manifest_name,
    parse_record_name,
    parse_time,
    record_name,
)
from registry.identity.refs import valid_alias_name

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
    assert blob_name(digest) == key
    assert parse_blob_name(key) == digest
    assert blob_shard(digest) == key[: len("blobs/xxh3-128/01/")]


@pytest.mark.parametrize(
    ("digest", "key"),
    [
        (Digest("sha256", SHA), f"manifests/sha256/{SHA}.json"),
        (Digest("sha256", "0" * 64), f"manifests/sha256/{'0' * 64}.json"),
    ],
)
def test_manifest_key_table(digest: Digest, key: str) -> None:
    assert manifest_name(digest) == key
    assert parse_manifest_name(key) == digest


def test_keys_refuse_the_other_algorithm() -> None:
    with pytest.raises(ValueError, match="xxh3-128"):
        blob_name(Digest("sha256", SHA))
    with pytest.raises(ValueError, match="xxh3-128"):
        blob_shard(Digest("sha256", SHA))
    with pytest.raises(ValueError, match="sha256"):
        manifest_name(Digest("xxh3-128", XXH))


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
        parse_blob_name(key)


@pytest.mark.parametrize("key", BAD_MANIFEST_KEYS)
def test_parse_manifest_key_rejects(key: str) -> None:
    with pytest.raises(ValueError, match="not a manifest key"):
        parse_manifest_name(key)


@given(hex32)
def test_blob_key_round_trip(hex_digits: str) -> None:
    digest = Digest("xxh3-128", hex_digits)
    key = blob_name(digest)
    assert parse_blob_name(key) == digest
    assert key.startswith(blob_shard(digest))
    assert ".." not in key.split("/")
    assert not key.startswith("/")


@given(hex64)
def test_manifest_key_round_trip(hex_digits: str) -> None:
    digest = Digest("sha256", hex_digits)
    assert parse_manifest_name(manifest_name(digest)) == digest


def _mutations(key: str) -> st.SearchStrategy[str]:
    """*key* with one character replaced, inserted or removed: near misses of a real key."""
    alphabet = st.sampled_from("0123456789abcdefABCDEF/._-xT Z\n\\")
    position = st.integers(min_value=0, max_value=len(key))
    return st.one_of(
        st.tuples(position, alphabet).map(lambda p: key[: p[0]] + p[1] + key[p[0] + 1:]),
        st.tuples(position, alphabet).map(lambda p: key[: p[0]] + p[1] + key[p[0]:]),
        position.map(lambda i: key[:i] + key[i + 1:]),
    )


times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(9999, 12, 31),
                     timezones=st.just(UTC))
tokens = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
alias_names = st.from_regex(r"[a-z][a-z0-9_-]{0,8}(/[a-z0-9][a-z0-9._-]{0,8}){0,3}",
                            fullmatch=True).filter(valid_alias_name)
real_keys = st.one_of(
    hex32.map(lambda h: blob_name(Digest("xxh3-128", h))),
    hex64.map(lambda h: manifest_name(Digest("sha256", h))),
    st.builds(lambda h, kind, at, token: record_name(Digest("sha256", h), kind, at, token),
              hex64, st.sampled_from(RECORD_KINDS), times, tokens),
    st.builds(alias_record_name, alias_names, times, tokens),
    st.builds(damaged_name, hex32.map(lambda h: blob_name(Digest("xxh3-128", h))), times, tokens),
)
candidate_keys = st.one_of(
    st.text(max_size=120),  # almost never a key: the refusals
    real_keys,  # always a key: the round trips
    real_keys.flatmap(_mutations),  # near misses: either refused or still exact
)

def _round_trips(key: str) -> list[str]:
    """What each parser that accepts *key* makes of its value again."""
    made = []
    for attempt in (
        lambda: blob_name(parse_blob_name(key)),
        lambda: manifest_name(parse_manifest_name(key)),
        lambda: str(parse_record_name(key)),
        lambda: str(parse_alias_record_name(key)),
        lambda: str(parse_damaged_name(key)),
    ):
        try:
            made.append(attempt())
        except ValueError:
            continue
    return made


@given(candidate_keys)
def test_parse_is_the_exact_inverse(key: str) -> None:
    """Whatever parses must be exactly the key that its value maps to, and nothing else;
    every key enginectl makes parses (so the round trip is really exercised), under
    exactly one parser."""
    assert _round_trips(key) in ([], [key])


@given(real_keys)
def test_every_key_enginectl_makes_parses(key: str) -> None:
    assert _round_trips(key) == [key]


@given(hex32, st.text(min_size=1))
def test_any_extra_text_is_rejected(hex_digits: str, extra: str) -> None:
    blob = blob_name(Digest("xxh3-128", hex_digits))
    manifest = manifest_name(Digest("sha256", hex_digits * 2))
    for mangled in (extra + blob, blob + extra):
        with pytest.raises(ValueError, match="not a blob key"):
            parse_blob_name(mangled)
    for mangled in (extra + manifest, manifest + extra):
        with pytest.raises(ValueError, match="not a manifest key"):
            parse_manifest_name(mangled)


SHA_DIGEST = Digest("sha256", SHA)
AT = datetime(2026, 12, 1, 9, 30, 0, 123456, tzinfo=UTC)
TOKEN = "0123456789abcdef" * 2


def test_record_keys_table() -> None:
    key = record_name(SHA_DIGEST, "smoke", AT, TOKEN)
    assert key == f"records/sha256/{SHA}/smoke/20261201T093000123456Z-{TOKEN}.json"
    parsed = parse_record_name(key)
    assert (parsed.artifact, parsed.kind, parsed.at, parsed.token) == (SHA_DIGEST, "smoke", AT,
                                                                       TOKEN)
    assert str(parsed) == key
    alias = alias_record_name("llama70b/h100/prod", AT, TOKEN)
    assert alias == f"aliases/llama70b/h100/prod/20261201T093000123456Z-{TOKEN}.json"
    assert parse_alias_record_name(alias).name == "llama70b/h100/prod"
    aside = damaged_name(blob_name(Digest("xxh3-128", XXH)), AT, TOKEN)
    assert aside == f"damaged/20261201T093000123456Z-{TOKEN}/blobs/xxh3-128/01/{XXH[2:]}"
    assert parse_damaged_name(aside).original == blob_name(Digest("xxh3-128", XXH))
    assert parse_time(format_time(AT)) == AT


@pytest.mark.parametrize(
    "key",
    [
        f"records/sha256/{SHA}/verdict/20261201T093000123456Z-{TOKEN}.json",  # unknown kind
        f"records/sha256/{SHA}/smoke/20261201T093000123456-{TOKEN}.json",  # no Z
        f"records/sha256/{SHA}/smoke/20261301T093000123456Z-{TOKEN}.json",  # month 13
        f"records/sha256/{SHA}/smoke/20261201T093000123456Z-{TOKEN[:-1]}.json",
        f"records/sha256/{SHA}/smoke/.20261201T093000123456Z-{TOKEN}.json.5f3a.tmp",
        f"records/sha256/{SHA}/smoke/20261201T093000123456Z-{TOKEN}.json/x",
        f"records/sha256/{SHA[:-1]}/smoke/20261201T093000123456Z-{TOKEN}.json",
        f"records/sha256/{SHA}/smoke/\u0662\u0660\u0662\u0666" + f"1201T093000123456Z-{TOKEN}.json",
    ],
)
def test_parse_record_key_rejects(key: str) -> None:
    with pytest.raises(ValueError, match="not a record"):
        parse_record_name(key)


@pytest.mark.parametrize(
    "key",
    [
        f"aliases/a/../b/20261201T093000123456Z-{TOKEN}.json",  # traversal
        f"aliases/a//b/20261201T093000123456Z-{TOKEN}.json",
        f"aliases/Prod/20261201T093000123456Z-{TOKEN}.json",  # uppercase
        f"aliases/deadbeef/20261201T093000123456Z-{TOKEN}.json",  # reads as a digest prefix
        f"aliases/20261201T093000123456Z-{TOKEN}.json",  # no name
        f"aliases/prod/.20261201T093000123456Z-{TOKEN}.json.1a2b.tmp",
    ],
)
def test_parse_alias_record_key_rejects(key: str) -> None:
    with pytest.raises(ValueError, match="not an alias"):
        parse_alias_record_name(key)


def test_damaged_keys_hold_only_blobs_and_manifests() -> None:
    with pytest.raises(ValueError, match="not a blob or manifest key"):
        damaged_name("records/x", AT, TOKEN)
    with pytest.raises(ValueError, match="not a blob or manifest key"):
        parse_damaged_name(f"damaged/20261201T093000123456Z-{TOKEN}/blobs/../etc/passwd")
    with pytest.raises(ValueError, match="naive"):
        format_time(datetime(2026, 12, 1))  # the naive time is the point


@pytest.mark.parametrize("name", ["a/../b", "a/./b", "../a", "a/..", "a//b", "a/", ".", ".."])
def test_alias_names_with_dot_segments_are_refused(name: str) -> None:
    assert not valid_alias_name(name)
