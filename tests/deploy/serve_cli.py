"""`enginectl serve` started as a deploy node starts it (its own session, its signals at their
defaults, tagged so that a test finds what it left running), and waiting for its server to
answer."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import uuid
from typing import Any

from tests.cli_forkserver import ENGINECTL
from tests.helpers import ROOT, with_default_signals
from tests.processes import TAG

BIN = [ROOT / "tests" / "fakes" / "bin"]
READY_TIMEOUT_S = 120  # a guard against a hung server, not a timing assertion


def get(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """The server's answer to GET *path*, or None while it does not listen yet."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    except OSError:
        return None
    finally:
        connection.close()


def wait_answering(process: subprocess.Popen[str], port: int) -> dict[str, Any]:
    """/v1/models once the server answers; fails if the process exits first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = get(port, "/v1/models")
        if answer is not None and answer[0] == 200:
            return answer[1]
        try:
            process.wait(timeout=0.2)  # the poll's pace, and it notices an exit
        except subprocess.TimeoutExpired:
            continue
        _, stderr = process.communicate()
        raise AssertionError(f"serve exited {process.returncode} before answering: {stderr}")
    raise AssertionError("serve did not answer in time")


def start(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    tag = uuid.uuid4().hex
    process = subprocess.Popen(with_default_signals([ENGINECTL, "serve", *args]),
                               env={**env, TAG: tag},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    return process, tag
