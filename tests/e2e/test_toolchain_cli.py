"""`enginectl toolchain` on a machine without a GPU says so instead of failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENGINECTL = str(Path(sys.executable).parent / "enginectl")


def test_toolchain_without_a_gpu_reports_versions_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "ENGINECTL_IMAGE_DIGEST": "sha256:" + "1" * 64}
    done = subprocess.run([ENGINECTL, "toolchain", "--json"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["gpu"] is None
    assert found["gpu_count"] == 0
    assert "no NVIDIA GPU" in found["note"]
    assert found["image"] == "sha256:" + "1" * 64
    from importlib import metadata

    try:
        torch = metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        torch = None
    assert found["torch"] == torch
    table = subprocess.run([ENGINECTL, "toolchain"], env=env, capture_output=True, text=True,
                           timeout=120, check=True).stdout
    assert "no NVIDIA GPU on this machine" in table
