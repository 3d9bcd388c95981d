"""A rich progress bar on stderr for byte-counting work, shown only on a terminal."""

from __future__ import annotations

import sys
import threading
from typing import Any

from registry.progress import NoProgress, Progress


class RichProgress:
    """Thread-safe bar; each `start` begins a new task line (hashing, uploading, …)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as Bar

        self._bar = Bar(
            TextColumn("{task.description:<10}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True,
        )
        self._lock = threading.Lock()
        self._task: Any = None

    def start(self, description: str, total_bytes: int) -> None:
        with self._lock:
            if self._task is None:
                self._bar.start()
            self._task = self._bar.add_task(description, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.advance(self._task, nbytes)

    def finish(self) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.remove_task(self._task)
                self._task = None
                self._bar.stop()


def terminal_progress() -> Progress:
    return RichProgress() if sys.stderr.isatty() else NoProgress()
