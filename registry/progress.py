"""Progress reporting: the library reports bytes (`Progress`) and lines (`Echo`), the CLI
decides how to show them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

Echo = Callable[[str], None]
"""Where a long run reports one line as it goes (a finished stage run, a note)."""


class Progress(Protocol):
    def start(self, description: str, total_bytes: int) -> None: ...

    def advance(self, nbytes: int) -> None:
        """Called from worker threads with bytes moved since the last call."""

    def finish(self) -> None: ...


class NoProgress:
    def start(self, description: str, total_bytes: int) -> None:
        del description, total_bytes

    def advance(self, nbytes: int) -> None:
        del nbytes

    def finish(self) -> None:
        pass


class CountingProgress:
    """Counts bytes; thread-safe. Used by tests and as a base for displays."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.done = 0

    def start(self, description: str, total_bytes: int) -> None:
        del description
        with self._lock:
            self.total, self.done = total_bytes, 0

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes

    def finish(self) -> None:
        pass
