"""GETs of blobs (ranged) and manifests through obstore (Rust `object_store`): a fetch's data path.

(Over plain http a blob's body is first tried by `registry.store.s3splice`, which has the kernel
move it from the socket into the file; what that does not take goes on here, from the byte
where it stopped.)

boto3 reads every body through Python socket reads (botocore, urllib3, http.client): on a
2 GiB fetch that was ~60 % of the client's CPU and kept enginectl at a third of what the
server could send. Here the bytes move in Rust (tokio and hyper, the GIL released while a
read waits) and reach Python as 1 MiB buffers, which are written to their offsets in the
file; everything else stays as it was: which ranges, how many in flight and in what order
they are hashed is `S3Store`'s (`registry.store.ranges`), control calls (HEAD, LIST, PUT,
multipart, small objects) stay on boto3 (`registry.store.s3bucket`), as does telling a missing
bucket from a missing manifest.

What the store promises, and who keeps it:

- any S3 endpoint: the endpoint and the region boto3 resolved (path-style requests on a
  custom endpoint, whether given as ENGINECTL_S3_ENDPOINT_URL or to boto3 through its own
  settings); on AWS itself the bucket's region, asked once with HEAD bucket.
- the AWS credential chain: credentials come from the same boto3 session (environment,
  ~/.aws files and profiles, SSO, web identity, container and instance metadata), asked
  for again every few minutes, so refreshed credentials are picked up. One case skips
  boto3 (its import and client cost ~0.4 s of a fetch's start-up): static keys in the
  environment for a custom endpoint with no AWS config file and no profile, where boto3
  could only resolve those same keys, that endpoint and the environment's region
  (`environment_settings`).
- TLS: the system's roots, and the CA bundle boto3 trusts (AWS_CA_BUNDLE, or `ca_bundle`
  in the AWS config file), so an endpoint behind a private CA serves the GETs too.
- retries: obstore retries throttling (429, 503 SlowDown), 5xx and connection errors with
  exponential backoff before a body starts; a body cut off mid-read is asked for again
  here from the byte where it stopped (`stream_retries` times), and so is an answer that
  breaks the protocol (a 200 to a Range, a Content-Range for other bytes, or whose total
  is not the size the manifest gives), its body unread. A fault of the transport or the
  protocol is never taken for damage of the stored bytes, nor is a wrong digest on its own:
  the object is read back and judged against the server's stored checksum
  (`registry.store.s3check`, `registry.ops.damage`).
- Ctrl-C: the stop event is checked between chunks, and a read blocked on the network is
  in a daemon thread (`registry.workers`) that never holds the process.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError

from registry.errors import NotFoundError, StoreError
from registry.identity.layout import s3_url
from registry.store.base import check_stop
from registry.store.ranges import pwrite_all

if TYPE_CHECKING:
    from obstore import GetResult
    from obstore.auth.boto3 import Boto3CredentialProvider
    from obstore.store import ClientConfig, S3Config
    from obstore.store import S3Store as ObjectStore

    from registry.store.s3bucket import Bucket
    from registry.store.s3splice import Splicer

CHUNK: Final = 1 << 20
"""The most one read hands to Python at once (it is written before the next is read)."""
SIGNED_FOR: Final = timedelta(minutes=15)
"""How long a presigned URL of the plain-http path stays good (each GET signs its own)."""
CREDENTIALS_TTL: Final = timedelta(minutes=5)
"""How long obstore keeps credentials before asking boto3 again (botocore refreshes
temporary credentials 15 minutes before they expire, so these are always valid)."""


def first_line(exc: BaseException) -> str:
    """obstore's messages are Rust debug dumps over many lines; the first says what failed,
    and what the dump says of an untrusted certificate is added, with what to do."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    if "InvalidCertificate" in text:
        line += (" (the server's TLS certificate is not trusted here: set AWS_CA_BUNDLE to "
                 "the PEM file of the CA that signed it)")
    return line


def custom_endpoint(url: str | None) -> str | None:
    """The endpoint boto3 resolved when it is not AWS's own (set through AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_S3 or the AWS config file): the GETs must go where the control calls go.
    None for AWS, whose endpoint obstore derives from the bucket's region."""
    host = urlsplit(url or "").hostname or ""
    if not host or host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return None
    return url


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def environment_settings(endpoint_url: str | None,
                         environ: Mapping[str, str] = os.environ) -> S3Config | None:
    """obstore's settings taken straight from the environment, when boto3 could resolve
    nothing else; None sends the caller through boto3's session and client.

    They apply only when every input boto3 would weigh is in the environment: static keys
    (botocore's first credential provider, so no file, SSO or metadata is ever asked), no
    profile, no AWS config file (it could set a region, an endpoint, a CA bundle or the
    addressing style), and a custom endpoint (on AWS the bucket's region must be asked). A
    CA bundle in AWS_CA_BUNDLE is the reader's to trust either way (`RangeReader._store`).
    The endpoint is enginectl's own setting, else boto3's environment variables for it."""
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    if environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE"):
        return None
    config_file = environ.get("AWS_CONFIG_FILE") or str(Path("~/.aws/config"))
    if Path(config_file).expanduser().exists():
        return None
    if not endpoint_url and not _truthy(environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
        endpoint_url = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    endpoint = custom_endpoint(endpoint_url)
    if endpoint is None:
        return None
    config: S3Config = {
        "access_key_id": key,
        "secret_access_key": secret,
        # botocore reads AWS_DEFAULT_REGION only (AWS_REGION is other SDKs'); with a custom
        # endpoint and no region it signs for us-east-1, as the reader did through boto3
        "region": environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "endpoint": endpoint,
        "virtual_hosted_style_request": False,
    }
    token = environ.get("AWS_SESSION_TOKEN") or environ.get("AWS_SECURITY_TOKEN")
    if token:
        config["session_token"] = token
    return config


class RangeReader:
    """Ranged reads of the objects of one bucket; safe to share between threads.

    *bucket* gives the boto3 side of the same bucket; it is called only when the
    credentials, endpoint or region have to come from boto3 (`environment_settings`)."""

    def __init__(self, name: str, store_url: str, endpoint_url: str | None,
                 bucket: Callable[[], Bucket], *, stream_retries: int = 5) -> None:
        self.name = name
        self.store_url = store_url
        self.endpoint_url = endpoint_url
        self._bucket = bucket
        self.stream_retries = max(1, stream_retries)

    def where(self, key: str) -> str:
        return s3_url(self.name, key)

    def _boto3_settings(self) -> tuple[S3Config, Boto3CredentialProvider, str | None]:
        """The endpoint and region boto3 resolved, its credential chain and CA bundle."""
        from obstore.auth.boto3 import Boto3CredentialProvider  # imports boto3

        bucket = self._bucket()
        client = bucket.client
        try:
            credentials = Boto3CredentialProvider(bucket.session, ttl=CREDENTIALS_TTL)
        except ValueError as exc:  # boto3 found no credentials anywhere in the chain
            raise StoreError(
                f"no AWS credentials for {self.where('')}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run on a node with an instance role",
                url=self.store_url, operation="get_object") from exc
        endpoint = self.endpoint_url or custom_endpoint(client.meta.endpoint_url)
        config: S3Config = {
            "region": (client.meta.region_name if endpoint else bucket.region())
            or "us-east-1",
            "virtual_hosted_style_request": False,
        }
        if endpoint:
            config["endpoint"] = endpoint
        # AWS_CA_BUNDLE or `ca_bundle` in the AWS config file, as the control calls trust it
        bundle = bucket.session._session.get_config_variable("ca_bundle")
        return config, credentials, str(bundle) if bundle else None

    def _certificates(self, bundle: str) -> bytes:
        """The PEM file a private CA's certificates are in (AWS_CA_BUNDLE), for obstore to
        trust beside the system's roots; boto3 trusts it alone, so whatever boto3 can reach
        obstore can too."""
        try:
            return Path(bundle).expanduser().read_bytes()
        except OSError as exc:
            raise StoreError(
                f"cannot read the CA bundle {bundle} (AWS_CA_BUNDLE or ca_bundle in the AWS "
                f"config file): {exc.strerror or exc}",
                url=self.store_url, operation="get_object") from exc

    @cached_property
    def _settings(self) -> tuple[S3Config, Boto3CredentialProvider | None, str | None]:
        """obstore's settings, credentials and CA bundle: the environment's, else boto3's."""
        config = environment_settings(self.endpoint_url)
        if config is None:
            return self._boto3_settings()
        return config, None, os.environ.get("AWS_CA_BUNDLE") or None

    @cached_property
    def _store(self) -> ObjectStore:
        from obstore.store import S3Store as ObjectStore

        config, credentials, bundle = self._settings
        client_options: ClientConfig = {
            "allow_http": True,  # only an http:// endpoint the user gave is ever http
            "connect_timeout": timedelta(seconds=10),
            "read_timeout": timedelta(seconds=60),  # as botocore's: no byte for 60 s
            "timeout": timedelta(hours=1),  # a whole part, however slow the link
            "pool_max_idle_per_host": "64",
        }
        if bundle and not str(config.get("endpoint", "")).startswith("http:"):
            client_options["root_certificate"] = self._certificates(bundle)
        return ObjectStore(
            self.name,
            config=config,
            credential_provider=credentials,
            client_options=client_options,
            retry_config={
                "max_retries": 7,  # 8 attempts, as botocore's standard mode here
                "backoff": {"init_backoff": timedelta(milliseconds=100),
                            "max_backoff": timedelta(seconds=20), "base": 2},
                "retry_timeout": timedelta(minutes=3),
            },
        )

    def _get(self, key: str, what: str, byte_range: tuple[int, int] | None = None) -> GetResult:
        """A GET's answer, its body not yet read; obstore's failures as enginectl's."""
        try:
            if byte_range is None:
                return obstore.get(self._store, key)
            return obstore.get(self._store, key, options={"range": byte_range})
        except FileNotFoundError as exc:  # obstore's 404 (its NotFoundError is deprecated)
            raise NotFoundError(what, url=self.store_url, key=key) from exc
        except (ObstoreError, ValueError) as exc:
            if byte_range is not None and MISANSWERS.search(str(exc)):
                raise MisanswerError(first_line(exc)) from exc
            raise StoreError(f"get_object {self.where(key)} failed: {first_line(exc)}",
                             url=self.store_url, key=key, operation="get_object") from exc

    def _cut_off(self, key: str, failure: BaseException | None) -> StoreError:
        if isinstance(failure, MisanswerError):
            return StoreError(
                f"get_object {self.where(key)} failed: {self.stream_retries} answers in a row "
                f"did not keep to the protocol, last: {failure}",
                url=self.store_url, key=key, operation="get_object")
        return StoreError(
            f"get_object {self.where(key)} failed: the body was cut off "
            f"{self.stream_retries} times, last: {first_line(failure or ObstoreError())}",
            url=self.store_url, key=key, operation="get_object")

    def read_all(self, key: str, what: str) -> bytes:
        """The whole of a small object (a manifest). A body cut off mid-read is asked for
        again whole; NotFoundError when there is no such key (or no such bucket: the
        caller asks boto3 which, `S3Store.get_manifest`)."""
        failure: BaseException | None = None
        for _attempt in range(self.stream_retries):
            result = self._get(key, what)
            try:
                return result.bytes().to_bytes()
            except ObstoreError as exc:  # the body broke off: ask again
                failure = exc
        raise self._cut_off(key, failure) from failure

    @cached_property
    def _splicer(self) -> Splicer | None:
        """The plain-http path for blob bodies (`registry.store.s3splice`), where it can be used."""
        from registry.store import s3splice

        if not s3splice.usable(str(self._settings[0].get("endpoint", "")) or None):
            return None
        store = self._store
        return s3splice.Splicer(lambda key: obstore.sign(store, "GET", key, SIGNED_FOR))

    @property
    def splices(self) -> bool:
        """Whether blob bodies take the plain-http path (`registry.store.s3splice`)."""
        return self._splicer is not None

    def read_into(
        self,
        key: str,
        what: str,
        fd: int,
        byte_range: tuple[int, int],
        *,
        size: int | None = None,
        stop: threading.Event | None = None,
        landed: Callable[[int], None] | None = None,
    ) -> int:
        """Write the bytes in [start, end) of *key* to their offsets in *fd*, telling
        `landed(n)` of each piece, and return the object's total size. Over plain http the
        kernel splices the body into the file (`registry.store.s3splice`); otherwise, and from
        wherever that stops, obstore streams it in chunks of at most CHUNK. A body cut off
        mid-read is asked for again from the byte where it stopped. Once *stop* is set,
        StoppedError ends the read at its next chunk.

        An answer that breaks the protocol (a 200 to the Range, a Content-Range for other
        bytes) is a fault of that one answer (a proxy, a server's bug) and is asked again,
        its body unread, like a body cut off; so is one whose Content-Range total is not
        *size*, the object's size as the caller knows it (a manifest's). The total
        returned disagrees with *size* only when every answer said the same. That alone
        proves nothing against the stored bytes (`registry.ops.damage` reads them whole)."""
        start, end = byte_range
        done = 0
        failure: BaseException | None = None
        total: int | None = None
        landed = landed or _ignore
        splicer = self._splicer
        if splicer is not None and splicer.on:
            done, total = splicer.get(key, fd, byte_range, size=size, stop=stop,
                                      landed=landed)
        for _attempt in range(self.stream_retries):
            check_stop(stop)
            if start + done >= end:
                break  # cut off after the last byte: nothing is left to ask for
            try:
                result = self._get(key, what, (start + done, end))
            except MisanswerError as exc:  # this answer broke the protocol: ask again
                failure = exc
                continue
            total = int(result.meta["size"])
            got = tuple(result.range)
            if got[0] != start + done:  # misplaced bytes are worse than none: ask again
                failure = MisanswerError("the server ignored the Range header")
                continue
            if size is not None and total != size:  # this answer's word against the
                failure = WrongTotalError(  # manifest's: ask again, read none of it
                    f"the answer said the object has {total} bytes, {size} expected")
                continue
            try:
                for chunk in result.stream(min_chunk_size=CHUNK):
                    check_stop(stop)
                    pwrite_all(fd, chunk, start + done)
                    done += len(chunk)
                    landed(len(chunk))
            except ObstoreError as exc:  # the body broke off: ask for the rest
                failure = exc
                continue
            return total
        else:
            if not isinstance(failure, WrongTotalError):
                raise self._cut_off(key, failure) from failure
        assert total is not None  # noqa: S101 - a GET ran before the loop could end
        return total


MISANSWERS: Final = re.compile(
    r"NotPartial|NoContentRange|ParseContentRange|UnexpectedRange|InvalidRangeRequest")
"""obstore's names for an answer to a ranged GET that breaks the protocol (a 200 to a
Range, a Content-Range missing, unreadable or for other bytes): that answer's fault."""


class MisanswerError(Exception):
    """One answer to a ranged GET that broke the protocol; the GET is asked again."""


class WrongTotalError(MisanswerError):
    """An answer whose Content-Range total is not the object's size the caller knows."""


def _ignore(_n: int) -> None:
    pass
