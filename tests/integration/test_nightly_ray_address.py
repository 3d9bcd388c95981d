"""`nightly --executor ray` where no Ray cluster answers is the machine's fault, said as
`build` and `fleet` say it: one line on stderr, exit 2, no nightly run recorded (so the next
run's `since` is not the failed one), and no "no toolchain change" for a probe never made.
No cluster is started: a closed port, and an address that is not one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy import func, select

from registry.sql.db import open_registry
from registry.sql.models import NightlyRun
from tests.integration.nightly_box import Box


def closed_port() -> str:
    """HOST:PORT where nothing listens (a port the kernel just gave, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("address", ["closed", "ray://[::1"])
def test_a_nightly_whose_cluster_does_not_answer_exits_2_and_records_no_run(
        tmp_path: Path, address: str) -> None:
    url = f"sqlite:///{tmp_path / 'home' / 'registry.db'}"
    box = Box(tmp_path, url, max_regression=0.99)
    address = closed_port() if address == "closed" else address
    done = box.run("nightly", str(box.recipe), "--executor", "ray", "--address", address,
                   code=2)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"enginectl: error: cannot join the Ray cluster at {address!r}: "
                           "nothing answers at "), line
    assert done.stdout == ""  # no report, so no "no toolchain change"
    with open_registry(url) as registry, registry.session() as session:
        assert session.execute(select(func.count()).select_from(NightlyRun)).scalar() == 0
    report = box.nightly(str(box.recipe), "--dry-run")
    assert report["since"] is None
