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


def process_titles(pids: list[int]) -> list[str]:
    """The command line (/proc/PID/cmdline) of each of *pids* still running, its arguments
    joined by spaces: vLLM titles its processes `VLLM::EngineCore`, `VLLM::Worker` there."""
    titles = []
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        titles.append(raw.replace(b"\0", b" ").decode(errors="replace").strip())
    return titles
