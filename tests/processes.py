"""The fake OpenAI server's argv parts, and finding what a test's servers left running.

A test puts a fresh TAG=<tag> in a server's environment (inherited by all it starts) and
checks with `tagged_processes(tag)` that nothing it started outlives the harness.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import ROOT

FAKE_SERVER = ROOT / "tests" / "fakes" / "openai_server.py"
FAKE_NAME = "fake-model"
FAKE_MAX_MODEL_LEN = 512
TAG = "ENGINECTL_SMOKE_TEST_TAG"


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries TAG=tag: the server and all it started."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def process_names(pids: list[int]) -> list[str]:
    """The kernel's name (/proc/PID/comm) of each of *pids* still running: vLLM names its
    processes (`VLLM::EngineCore`, `VLLM::Worker`, cut to 15 bytes)."""
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return names
