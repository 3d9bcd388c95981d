"""Progress reporting: the library reports bytes (`Progress`) and lines (`Echo`), the CLI
decides how to show them."""

from __future__ import annotations

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
