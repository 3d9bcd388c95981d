"""A real S3-compatible server over HTTP for integration tests: moto's server, in its own process.

`start_s3_server` launches `python -m moto.server` on a free loopback port in a new process
group, waits (bounded) until it answers HTTP, and returns a handle whose `stop` kills the group.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.smoke import free_port  # the one loopback-port picker

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}
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

    @functools.cached_property
    def client(self) -> S3Client:
        """A client for the tests' own raw access (setup, corruption, cleanup)."""
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        return session.client("s3", endpoint_url=self.endpoint_url)

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
    port = free_port()
    log = workdir / f"moto-{port}.log"
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(CREDENTIALS)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = S3Server(f"http://127.0.0.1:{port}", process, log)
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
        f"moto S3 server on port {port} did not answer within {START_TIMEOUT_S:.0f}s "
        f"(exit code {process.returncode}); log tail:\n{tail}"
    )
