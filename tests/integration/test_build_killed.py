"""`kill -9` of `enginectl build` while its smoke server runs leaves no server running: the
server starts through the process runner's guard, which ends its whole group when the build
dies, even of a signal it cannot catch.

The server is vLLM's entry point as a stand-in: a `vllm` package on PYTHONPATH whose
`vllm.entrypoints.openai.api_server` runs tests/fakes/openai_server.py, slowed down
(FAKE_OPENAI_TOKEN_DELAY_S) so that the smoke is still running when the build is killed. The
next build then proceeds at once: the lease the killed one held is a dead process's.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.cli_forkserver import run_cli
from tests.integration.builds import ENGINECTL, cpu_recipe
from tests.processes import FAKE_SERVER, TAG, tagged_processes

TIMEOUT_S = 120  # a guard against a hang, not a timing assertion


def fake_vllm(directory: Path) -> Path:
    """A directory for PYTHONPATH holding a `vllm` whose OpenAI server is the stand-in."""
    package = directory / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for level in (directory / "vllm", directory / "vllm" / "entrypoints", package):
        (level / "__init__.py").write_text("")
    (package / "api_server.py").write_text(
        "import runpy, sys\n"
        f"sys.argv[0] = {str(FAKE_SERVER)!r}\n"
        f"runpy.run_path({str(FAKE_SERVER)!r}, run_name='__main__')\n")
    return directory


def server_port(tag: str) -> int | None:
    """The --port of the tagged stand-in server, once it runs."""
    for pid in tagged_processes(tag):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "vllm.entrypoints.openai.api_server" in argv and "--port" in argv:
            return int(argv[argv.index("--port") + 1])
    return None


def answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def wait_for_server(build: subprocess.Popen[str], tag: str) -> int:
    """The smoke server's port once it answers; fails if the build ends first."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        assert build.poll() is None, build.communicate()
        port = server_port(tag)
        if port is not None and answers(port):
            return port
        time.sleep(0.1)
    raise AssertionError("the smoke server never answered")


def test_a_build_killed_during_its_smoke_leaves_no_server_running(tmp_path: Path) -> None:
    recipe = cpu_recipe(tmp_path)
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "ENGINECTL_HOME": str(tmp_path / "home"),
        "ENGINECTL_REGISTRY_URL": f"sqlite:///{tmp_path / 'home' / 'registry.db'}",
        "ENGINECTL_PYTHON": sys.executable,
        "ENGINECTL_VLLM_PYTHON": sys.executable,
        "PYTHONPATH": str(fake_vllm(tmp_path / "fake-vllm")),
        "FAKE_OPENAI_TOKEN_DELAY_S": "2",  # the smoke's checks take minutes
        "ENGINECTL_LEASE_TTL_S": "3600",
        "HF_HUB_OFFLINE": "1",
        TAG: tag,
    }
    build = subprocess.Popen([ENGINECTL, "build", str(recipe)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        port = wait_for_server(build, tag)
        os.kill(build.pid, signal.SIGKILL)  # the build alone: it cannot clean up
        build.communicate(timeout=TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tagged_processes(tag) == [], "the smoke server outlived its build"
        assert not answers(port)
        # and the next build proceeds at once: the killed build's lease on the smoke key is
        # a dead process's on this host (waiting out its hour-long TTL would hit the guard)
        again = run_cli([ENGINECTL, "build", str(recipe)], timeout=TIMEOUT_S,
                        env={**env, "FAKE_OPENAI_TOKEN_DELAY_S": "0"})
        assert again.returncode == 0, again.stderr
        assert re.search(r"^built +smoke ", again.stdout, re.MULTILINE), again.stdout
        assert tagged_processes(tag) == []
    finally:  # what a failure leaves behind is ours to end
        for pid in tagged_processes(tag):
            os.kill(pid, signal.SIGKILL)
        if build.poll() is None:
            build.kill()
            build.communicate()
