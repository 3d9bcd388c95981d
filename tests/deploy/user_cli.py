"""A deploy user at the command line: `enginectl` run as they type it (a failure is one error
line), and every path under a folder with its bytes, which is what "untouched" means. The
user with two ready engines is the `user` fixture (conftest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import stderr_of

SERVER = sys.executable  # stands in for trtllm-serve: pull writes it, never runs it


def run(env: dict[str, str], *args: str, code: int = 0,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run enginectl; a failure is one error line (after the note naming the store)."""
    done = run_cli([ENGINECTL, *args], env=env, timeout=300, cwd=cwd)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if code:
        error = stderr_of(done)
        assert error.count("\n") == 1, done.stderr
        assert error.startswith("enginectl: error: "), done.stderr
    return done


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under *root* with its bytes (None for folders): what "untouched" means."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not p.name.endswith(("-wal", "-shm"))}
