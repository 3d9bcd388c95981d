"""Ranged GETs of blob bytes through obstore (Rust `object_store`): the data path of a fetch.

boto3 reads every body through Python socket reads (botocore, urllib3, http.client): on a
2 GiB fetch that was ~60 % of the client's CPU and kept enginectl at a third of what the
server could send. Here the bytes move in Rust (tokio and hyper, the GIL released while a
read waits) and reach Python as 1 MiB buffers, which are written to their offsets in the
file; everything else stays as it was: which ranges, how many in flight and in what order
they are hashed is `S3Store`'s (`registry.ranges`), control calls (HEAD, LIST, PUT,
multipart, small objects, manifests) stay on boto3 (`registry.s3bucket`).

What the store promises, and who keeps it:

- any S3 endpoint: the endpoint and the region boto3 resolved (path-style requests on a
  custom endpoint, whether given as ENGINECTL_S3_ENDPOINT_URL or to boto3 through its own
  settings); on AWS itself the bucket's region, asked once with HEAD bucket.
- the AWS credential chain: credentials come from the same boto3 session (environment,
  ~/.aws files and profiles, SSO, web identity, container and instance metadata), asked
  for again every few minutes, so refreshed credentials are picked up.
- retries: obstore retries throttling (429, 503 SlowDown), 5xx and connection errors with
  exponential backoff before a body starts; a body cut off mid-read is asked for again
  here from the byte where it stopped (`stream_retries` times).
- Ctrl-C: the stop event is checked between chunks, and a read blocked on the network is
  in a daemon thread (`registry.workers`) that never holds the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError

from registry.errors import NotFoundError, StoreError
from registry.store import check_stop

if TYPE_CHECKING:
    from obstore.store import S3Config
    from obstore.store import S3Store as ObjectStore

    from registry.s3bucket import Bucket

CHUNK: Final = 1 << 20
"""The most one read hands to Python at once (it is written before the next is read)."""
CREDENTIALS_TTL: Final = timedelta(minutes=5)
"""How long obstore keeps credentials before asking boto3 again (botocore refreshes
temporary credentials 15 minutes before they expire, so these are always valid)."""


def first_line(exc: BaseException) -> str:
    """obstore's messages are Rust debug dumps over many lines; the first says what failed."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def custom_endpoint(url: str | None) -> str | None:
    """The endpoint boto3 resolved when it is not AWS's own (set through AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_S3 or the AWS config file): the GETs must go where the control calls go.
    None for AWS, whose endpoint obstore derives from the bucket's region."""
    host = urlsplit(url or "").hostname or ""
    if not host or host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return None
    return url


class RangeReader:
    """Ranged reads of the objects of one bucket; safe to share between threads."""

    def __init__(self, bucket: Bucket, *, stream_retries: int = 5) -> None:
        self.bucket = bucket
        self.stream_retries = max(1, stream_retries)

    @cached_property
    def _store(self) -> ObjectStore:
        from obstore.auth.boto3 import Boto3CredentialProvider
        from obstore.store import S3Store as ObjectStore

        client = self.bucket.client
        try:
            credentials = Boto3CredentialProvider(self.bucket.session, ttl=CREDENTIALS_TTL)
        except ValueError as exc:  # boto3 found no credentials anywhere in the chain
            raise StoreError(
                f"no AWS credentials for {self.bucket.where('')}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run on a node with an instance role",
                url=self.bucket.store_url, operation="get_object") from exc
        endpoint = self.bucket.endpoint_url or custom_endpoint(client.meta.endpoint_url)
        config: S3Config = {
            "region": (client.meta.region_name if endpoint else self.bucket.region())
            or "us-east-1",
            "virtual_hosted_style_request": False,
        }
        if endpoint:
            config["endpoint"] = endpoint
        return ObjectStore(
            self.bucket.name,
            config=config,
            credential_provider=credentials,
            client_options={
                "allow_http": True,  # only an http:// endpoint the user gave is ever http
                "connect_timeout": timedelta(seconds=10),
                "read_timeout": timedelta(seconds=60),  # as botocore's: no byte for 60 s
                "timeout": timedelta(hours=1),  # a whole part, however slow the link
                "pool_max_idle_per_host": "64",
            },
            retry_config={
                "max_retries": 7,  # 8 attempts, as botocore's standard mode here
                "backoff": {"init_backoff": timedelta(milliseconds=100),
                            "max_backoff": timedelta(seconds=20), "base": 2},
                "retry_timeout": timedelta(minutes=3),
            },
        )

    def read_into(
        self,
        key: str,
        what: str,
        write: Callable[[int, bytes], None],
        byte_range: tuple[int, int],
        stop: threading.Event | None = None,
    ) -> int:
        """Stream the bytes in [start, end) of *key* to `write(offset, chunk)` in chunks of
        at most CHUNK and return the object's total size. A body cut off mid-read is asked
        for again from the byte where it stopped. Once *stop* is set, StoppedError ends the
        read at its next chunk."""
        start, end = byte_range
        done, failure = 0, None
        total: int | None = None
        for _attempt in range(self.stream_retries):
            check_stop(stop)
            if start + done >= end:
                break  # cut off after the last byte: nothing is left to ask for
            try:
                result = obstore.get(self._store, key, options={"range": (start + done, end)})
                total = int(result.meta["size"])
                got = tuple(result.range)
            except FileNotFoundError as exc:  # obstore's 404 (its NotFoundError is deprecated)
                raise NotFoundError(what, url=self.bucket.store_url, key=key) from exc
            except (ObstoreError, ValueError) as exc:
                raise StoreError(f"get_object {self.bucket.where(key)} failed: {first_line(exc)}",
                                 url=self.bucket.store_url, key=key,
                                 operation="get_object") from exc
            if got[0] != start + done:  # misplaced bytes are worse than none
                raise StoreError(
                    f"get_object {self.bucket.where(key)}: the server ignored the Range header",
                    url=self.bucket.store_url, key=key, operation="get_object")
            try:
                for chunk in result.stream(min_chunk_size=CHUNK):
                    check_stop(stop)
                    write(start + done, chunk)
                    done += len(chunk)
            except ObstoreError as exc:  # the body broke off: ask for the rest
                failure = exc
                continue
            return total
        else:
            raise StoreError(
                f"get_object {self.bucket.where(key)} failed: the body was cut off "
                f"{self.stream_retries} times, last: {first_line(failure or ObstoreError())}",
                url=self.bucket.store_url, key=key, operation="get_object") from failure
        assert total is not None  # noqa: S101 - the loop ran a GET before it could break
        return total
