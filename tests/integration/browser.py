"""Headless Chromium (scripts/install-browser) as a test drives it: load a page, dump its DOM or
print it. The browser itself is the `chromium` fixture (conftest)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BROWSER_TIMEOUT_S = 120  # a guard against a hung browser, not a timing assertion


def browse(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
                          check=False, env={**os.environ, "HOME": str(profile)})
    assert done.returncode == 0, done.stderr[-2000:]  # stderr is noise unless it failed
    return done
