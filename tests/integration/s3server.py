"""Real S3-compatible servers over HTTP for integration tests, each in its own process.

`start_s3_server` launches moto's (`python -m moto.server`), `start_s3rver` s3rver (npm
`@20minutes/s3rver`, installed by scripts/install-s3rver, whose start script
ENGINECTL_S3RVER names), each on a free loopback port in a new process group; both wait
(bounded) until the server answers HTTP, and return a handle whose `stop` kills the group.

moto takes any request, whatever its signature or checksum; s3rver checks SigV4 signatures
(headers and presigned URLs) and refuses a wrong one with 403 SignatureDoesNotMatch, so
the paths enginectl signs itself (presigned GETs and part PUTs) are tested against it too.
Neither checks x-amz-checksum-* values: the tests recompute those themselves. Both take
CREDENTIALS (s3rver knows only that key pair; moto takes any).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# the one loopback-port picker
from pipeline.serving.server import PORT_TAKEN, PORT_TRIES, free_port

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "S3RVER",
    "AWS_SECRET_ACCESS_KEY": "S3RVER",
    "AWS_DEFAULT_REGION": "us-east-1",
}
S3_SERVERS = ("moto", "s3rver")
"""The servers `each_s3_server` (tests/integration/conftest.py) gives a test, in turn."""
S3RVER_VARIABLE = "ENGINECTL_S3RVER"
"""Names s3rver's start script (scripts/install-s3rver prints it; scripts/test sets it)."""
# Anything that could point boto3 at a real account or another endpoint is cleared.
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
START_TIMEOUT_S = 60.0


class S3ServerError(RuntimeError):
    pass


@dataclass(eq=False)
class S3Server:
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log: Path
    kind: str = "moto"
    """"moto" or "s3rver"."""

    @functools.cached_property
    def client(self) -> S3Client:
        """A client for the tests' own raw access (setup, corruption, cleanup)."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        # path style and SigV4, as enginectl asks a custom endpoint (registry.store.s3bucket)
        config = Config(signature_version="s3v4", s3={"addressing_style": "path"})
        return session.client("s3", endpoint_url=self.endpoint_url, config=config)

    def create_bucket(self) -> str:
        name = f"enginectl-test-{uuid.uuid4().hex[:16]}"
        self.client.create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Empty and remove *name* so the server's memory does not grow across tests."""
        client = self.client
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys: list[ObjectIdentifierTypeDef] = [
                {"Key": entry["Key"]} for entry in page.get("Contents", []) if "Key" in entry
            ]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys})
        client.delete_bucket(Bucket=name)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
    except OSError:
        return False
    finally:
        connection.close()
    return True


def start_s3_server(workdir: Path) -> S3Server:
    """Start moto's S3 server; S3ServerError (with its log) if it does not answer in time."""
    return _on_a_free_port("moto", lambda port: [
        sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], workdir)


def start_s3rver(start_script: Path, workdir: Path) -> S3Server:
    """Start s3rver (*start_script*: what scripts/install-s3rver printed), storing under
    *workdir*; S3ServerError (with its log) if it does not answer in time."""
    return _on_a_free_port("s3rver", lambda port: [
        str(start_script), "-d", str(workdir / "data"), "-a", "127.0.0.1", "-p", str(port),
        "--silent"], workdir)


def _on_a_free_port(kind: str, argv: Callable[[int], list[str]], workdir: Path) -> S3Server:
    """Start *kind* on a free port, again on another when a process took that one before the
    server bound it (a busy machine's race: pipeline.serving.server.PORT_TRIES)."""
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        try:
            return _start(kind, argv(port), port, workdir)
        except S3ServerError as exc:
            if attempt == PORT_TRIES or not PORT_TAKEN.search(str(exc)):
                raise
    raise AssertionError("unreachable")


def _start(kind: str, argv: list[str], port: int, workdir: Path) -> S3Server:
    log = workdir / f"{kind}-{port}.log"
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(CREDENTIALS)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", process, log, kind)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _answers(port):
            return server
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.1)  # the pause between polls doubles as an exit check
        if process.returncode is not None:
            break
    server.stop()
    tail = log.read_text(errors="replace")[-2000:]
    raise S3ServerError(
        f"{kind} S3 server on port {port} did not answer within {START_TIMEOUT_S:.0f}s "
        f"(exit code {process.returncode}); log tail:\n{tail}"
    )
