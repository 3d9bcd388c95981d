"""The store contract, run on both backends: a local folder and a real S3 server over HTTP."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC
from pathlib import Path

import pytest

from registry.errors import IntegrityError, NotFoundError, StoreError
from registry.identity.digest import Digest, digest_file, sha256_of
from registry.identity.layout import blob_name, manifest_name
from registry.store.base import Store
from registry.store.filestore import FileStore
from registry.store.opener import open_store
from tests.integration.s3server import S3Server
from tests.integration.store_objects import Blob, MiB, RawObjects, fake_digest, make_blob

EACH_BACKEND = pytest.mark.parametrize("store", ["file", "s3", "s3rver"], indirect=True)
"""For the round trips: s3rver too, which refuses what enginectl signs wrong (presigned part
PUTs over plain http, `registry.store.s3sendfile`; presigned GETs, `registry.store.s3splice`)."""


@pytest.fixture
def raw(store: Store, request: pytest.FixtureRequest) -> RawObjects:
    server = None if isinstance(store, FileStore) else request.getfixturevalue("s3_server")
    return RawObjects(store, server)


@pytest.fixture(scope="module")
def large_blob(tmp_path_factory: pytest.TempPathFactory) -> Blob:
    """Above the 64 MiB multipart threshold and several 32 MiB download parts."""
    return make_blob(tmp_path_factory.mktemp("large"), 70 * MiB + 12345)


# blobs


@EACH_BACKEND
@pytest.mark.parametrize("size", [0, 1, 5000, 17 * MiB + 3])
def test_blob_round_trip(store: Store, tmp_path: Path, size: int) -> None:
    blob = make_blob(tmp_path, size)
    uploaded: list[int] = []
    assert not store.has_blob(blob.digest)

    store.put_blob(blob.digest, blob.path, progress=uploaded.append)

    assert store.has_blob(blob.digest)
    assert sum(uploaded) == size
    downloaded: list[int] = []
    dest = tmp_path / "dest.tmp"
    store.get_blob(blob.digest, dest, progress=downloaded.append)
    assert dest.read_bytes() == blob.path.read_bytes()
    assert sum(downloaded) == size


@EACH_BACKEND
@pytest.mark.parametrize("known_size", [True, False])
def test_large_blob_round_trip(
    store: Store, tmp_path: Path, large_blob: Blob, known_size: bool
) -> None:
    uploaded: list[int] = []
    store.put_blob(large_blob.digest, large_blob.path, progress=uploaded.append)
    assert sum(uploaded) == large_blob.size

    dest = tmp_path / "large.tmp"
    downloaded: list[int] = []
    size = large_blob.size if known_size else None
    store.get_blob(large_blob.digest, dest, size=size, progress=downloaded.append)

    assert sum(downloaded) == large_blob.size
    assert digest_file(dest, with_sha256=False).xxh3 == large_blob.digest
    assert dest.stat().st_size == large_blob.size


@EACH_BACKEND
@pytest.mark.parametrize("size", [0, 5000])
def test_get_blob_replaces_what_the_destination_held(
    store: Store, tmp_path: Path, size: int
) -> None:
    """A destination that already holds other, longer bytes ends up holding the blob alone
    (the S3 store opens it without O_TRUNC and sets its size itself)."""
    blob = make_blob(tmp_path, size)
    store.put_blob(blob.digest, blob.path)
    dest = tmp_path / "dest.tmp"
    dest.write_bytes(b"stale" * 4000)
    store.get_blob(blob.digest, dest, size=size)
    assert dest.read_bytes() == blob.path.read_bytes()


def test_put_blob_is_idempotent(store: Store, tmp_path: Path) -> None:
    blob = make_blob(tmp_path, 1000)
    store.put_blob(blob.digest, blob.path)
    before = list(store.iter_blobs())
    again: list[int] = []

    store.put_blob(blob.digest, blob.path, progress=again.append)

    assert again == []  # nothing was sent
    assert list(store.iter_blobs()) == before


def test_missing_blobs(store: Store, tmp_path: Path, raw: RawObjects) -> None:
    blobs = [make_blob(tmp_path, 100 + n) for n in range(5)]
    for blob in blobs[:3]:
        store.put_blob(blob.digest, blob.path)
    # Many wanted digests in one shard take the LIST path; a few take HEADs.
    crowded = [fake_digest("ab", n) for n in range(12)]
    for digest in crowded[::2]:
        raw.write(blob_name(digest), b"x")
    raw.write(f"{blob_name(crowded[1])}.tmp", b"not a blob")
    raw.write(f"blobs/xxh3-128/ab/.{crowded[3].hex[2:]}.0a1b.tmp", b"not a blob either")

    wanted = [blob.digest for blob in blobs] + crowded + [blobs[0].digest]
    missing = store.missing_blobs(iter(wanted))

    assert missing == {blobs[3].digest, blobs[4].digest, *crowded[1::2]}
    assert store.missing_blobs([]) == set()


@pytest.mark.parametrize("size", [3000, 20 * MiB])
def test_corrupt_blob_fails_and_leaves_nothing(
    store: Store, tmp_path: Path, raw: RawObjects, size: int
) -> None:
    blob = make_blob(tmp_path, size)
    store.put_blob(blob.digest, blob.path)
    data = bytearray(raw.read(blob_name(blob.digest)))
    data[size // 2] ^= 0x01
    raw.write(blob_name(blob.digest), bytes(data))
    corrupt = digest_file_bytes(bytes(data))
    dest = tmp_path / "dest.tmp"
    dest.write_bytes(b"a partial file from an earlier try")

    with pytest.raises(IntegrityError) as caught:
        store.get_blob(blob.digest, dest, size=size)

    assert caught.value.expected == blob.digest
    assert caught.value.actual == corrupt
    assert str(blob.digest) in str(caught.value)
    assert str(corrupt) in str(caught.value)
    assert blob_name(blob.digest) in caught.value.location
    assert not dest.exists()


def digest_file_bytes(data: bytes) -> Digest:
    import xxhash

    return Digest("xxh3-128", xxhash.xxh3_128(data).hexdigest())


@pytest.mark.parametrize("size", [None, 7])  # S3: a HEAD first, or straight to a ranged GET
def test_get_missing_blob(store: Store, tmp_path: Path, size: int | None) -> None:
    digest = fake_digest("cd", 7)
    dest = tmp_path / "dest.tmp"

    with pytest.raises(NotFoundError) as caught:
        store.get_blob(digest, dest, size=size)

    assert caught.value.key.endswith(blob_name(digest))
    assert store.url in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not dest.exists()


def test_blob_iteration_and_delete(store: Store, tmp_path: Path, raw: RawObjects) -> None:
    blobs = {blob.digest: blob for blob in (make_blob(tmp_path, 10 * n) for n in range(1, 4))}
    for blob in blobs.values():
        store.put_blob(blob.digest, blob.path)
    first = next(iter(blobs))
    raw.write(f"blobs/xxh3-128/{first.hex[:2]}/.{first.hex[2:]}.77aa.tmp", b"junk")
    raw.write("blobs/xxh3-128/zz/not-a-digest", b"junk")
    raw.write("blobs/README", b"junk")

    infos = list(store.iter_blobs())

    assert {info.digest: info.size for info in infos} == {d: b.size for d, b in blobs.items()}
    assert all(info.modified.tzinfo is not None for info in infos)
    assert all(info.modified.utcoffset() == UTC.utcoffset(None) for info in infos)

    store.delete_blob(first)
    store.delete_blob(first)  # idempotent
    assert not store.has_blob(first)
    assert {info.digest for info in store.iter_blobs()} == set(blobs) - {first}


# manifests


@EACH_BACKEND
def test_manifest_round_trip(store: Store) -> None:
    data = b'{"kind":"trtllm-engine","files":[]}'
    digest = sha256_of(data)
    assert not store.has_manifest(digest)

    store.put_manifest(digest, data)
    store.put_manifest(digest, data)  # idempotent

    assert store.has_manifest(digest)
    assert store.get_manifest(digest) == data
    assert list(store.iter_manifests()) == [digest]


def test_put_manifest_checks_the_digest(store: Store) -> None:
    claimed = sha256_of(b"{}")
    data = b'{"kind":"vllm"}'

    with pytest.raises(IntegrityError) as caught:
        store.put_manifest(claimed, data)

    assert str(claimed) in str(caught.value)
    assert str(sha256_of(data)) in str(caught.value)
    assert not store.has_manifest(claimed)


def test_corrupt_manifest_fails(store: Store, raw: RawObjects) -> None:
    data = b'{"kind":"vllm","n":1}'
    digest = sha256_of(data)
    store.put_manifest(digest, data)
    raw.write(manifest_name(digest), b'{"kind":"vllm","n":2}')

    with pytest.raises(IntegrityError) as caught:
        store.get_manifest(digest)

    assert caught.value.expected == digest
    assert caught.value.actual == sha256_of(b'{"kind":"vllm","n":2}')


def test_get_missing_manifest(store: Store) -> None:
    digest = sha256_of(b"never stored")
    with pytest.raises(NotFoundError) as caught:
        store.get_manifest(digest)
    assert manifest_name(digest) in str(caught.value)


def test_manifest_iteration_and_delete(store: Store, raw: RawObjects) -> None:
    digests = set()
    for n in range(3):
        data = f'{{"n":{n}}}'.encode()
        digests.add(sha256_of(data))
        store.put_manifest(sha256_of(data), data)
    some = next(iter(digests))
    raw.write(f"manifests/sha256/.{some.hex}.json.1234.tmp", b"{}")
    raw.write(f"manifests/sha256/{some.hex}.json.bak", b"{}")
    raw.write("manifests/sha256/latest.json", b"{}")

    assert set(store.iter_manifests()) == digests

    store.delete_manifest(some)
    store.delete_manifest(some)  # idempotent
    assert not store.has_manifest(some)
    assert set(store.iter_manifests()) == digests - {some}


# errors


def test_missing_bucket_is_a_store_error(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = f"enginectl-missing-{uuid.uuid4().hex[:12]}"
    store = open_store(f"s3://{bucket}/prefix", s3_endpoint_url=s3_server.endpoint_url)
    blob = make_blob(tmp_path, 10)

    for call in (
        lambda: store.get_manifest(sha256_of(b"{}")),
        lambda: store.get_blob(blob.digest, tmp_path / "dest.tmp"),
        lambda: store.has_blob(blob.digest),
        lambda: store.put_blob(blob.digest, blob.path),
        lambda: store.missing_blobs([fake_digest("ab", n) for n in range(5)]),
        lambda: list(store.iter_manifests()),
    ):
        with pytest.raises(StoreError) as caught:
            call()
        error = caught.value
        assert error.code == "NoSuchBucket"
        assert error.request_id
        assert f"request id {error.request_id}" in str(error)
        assert repr(bucket) in str(error)
        assert "\n" not in str(error)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/store",
        "store",
        "/abs/path/without/scheme",
        "file://relative/path",
        "file://",
        "s3:///no-bucket",
        "s3://bucket/prefix?versionId=1",
    ],
)
def test_bad_store_url(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert caught.value.url == url
    assert repr(url) in str(caught.value)


def test_importing_the_store_does_not_import_boto3() -> None:
    code = ("import sys, registry.store.base, registry.store.opener; "
            "assert 'boto3' not in sys.modules, 'boto3 imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_file_store_refuses_bytes_that_do_not_match(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    blob = make_blob(tmp_path, 100)
    wrong = fake_digest("ef", 1)

    with pytest.raises(IntegrityError) as caught:
        store.put_blob(wrong, blob.path)

    assert caught.value.actual == blob.digest
    assert not store.has_blob(wrong)
    assert list((tmp_path / "store").rglob("*.tmp")) == []


# trusting only what a cheap check proves (issue 10, item 3)


def test_a_blob_of_the_wrong_size_counts_as_missing_and_is_replaced(
    store: Store, tmp_path: Path, raw: RawObjects
) -> None:
    blobs = [make_blob(tmp_path, 3000 + n) for n in range(5)]  # five: the LIST path too
    for blob in blobs:
        store.put_blob(blob.digest, blob.path)
    raw.write(blob_name(blobs[1].digest), raw.read(blob_name(blobs[1].digest))[:100])
    sizes = {blob.digest: blob.size for blob in blobs}
    assert store.missing_blobs(sizes) == {blobs[1].digest}
    assert store.missing_blobs(list(sizes)) == set()  # without sizes: present is present
    with pytest.raises(IntegrityError, match="100 bytes where 3001 are expected"):
        store.get_blob(blobs[1].digest, tmp_path / "dest", size=blobs[1].size)
    store.put_blob(blobs[1].digest, blobs[1].path)
    assert store.missing_blobs(sizes) == set()
    store.get_blob(blobs[1].digest, tmp_path / "dest", size=blobs[1].size)
    assert (tmp_path / "dest").read_bytes() == blobs[1].path.read_bytes()


def test_a_damaged_manifest_is_replaced_by_the_next_put(store: Store, raw: RawObjects) -> None:
    data = b'{"kind":"vllm","n":3}'
    digest = sha256_of(data)
    store.put_manifest(digest, data)
    raw.write(manifest_name(digest), b'{"kind":"vllm","n":4}')
    store.put_manifest(digest, data)
    assert store.get_manifest(digest) == data


def test_small_objects_list_move_and_delete(store: Store, raw: RawObjects) -> None:
    store.put_object("records/x/a.json", b"1")
    store.put_object("records/x/y/b.json", b"22")
    raw.write("records/x/.c.json.1a2b.tmp", b"temp")
    listed = {info.key: info.size for info in store.list_objects("records/")}
    assert listed == {"records/x/a.json": 1, "records/x/y/b.json": 2,
                      "records/x/.c.json.1a2b.tmp": 4}
    assert store.move_object("records/x/a.json", "damaged/a.json")
    assert not store.move_object("records/x/a.json", "damaged/again.json")
    assert store.get_object("damaged/a.json") == b"1"
    with pytest.raises(NotFoundError):
        store.get_object("records/x/a.json")
    store.delete_object("damaged/a.json")
    store.delete_object("damaged/a.json")  # idempotent
    assert [info.key for info in store.list_objects("damaged/")] == []
