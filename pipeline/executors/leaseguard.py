"""The lease guard: the heartbeat of one stage run's lease (`registry.sql.heartbeat`), and what
happens when the lease is lost (taken over by another builder, or the registry out of reach
until little of it was left): the run's children are stopped and the run fails with why,
nothing of it published (`pipeline.executors.stage`).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from pipeline.errors import StageError
from pipeline.host.runner import CANCEL_GRACE_S, stop_logging_to
from pipeline.planning.stage_run import StageRun
from registry.sql.db import Registry
from registry.sql.heartbeat import Heartbeat


class LeaseGuard:
    """The heartbeat of one run's lease. When the lease is lost it notes why in the run's
    log and stops the run's children (those logging to the run's log) until the run ends,
    also those started after the loss; the run then fails with `error()`."""

    def __init__(self, registry: Registry, run: StageRun, *, owner: str, ttl_s: float,
                 log: Path, taken_at: float | None = None) -> None:
        self.run, self.log = run, log
        self.ended = threading.Event()
        self.heartbeat = Heartbeat(registry, run.key, owner=owner, ttl_s=ttl_s,
                                   on_lost=self._lost, taken_at=taken_at).start()

    @property
    def lost(self) -> str | None:
        return self.heartbeat.lost

    def _lost(self, reason: str) -> None:
        with contextlib.suppress(OSError), self.log.open("ab") as log:
            log.write(f"\nenginectl: {reason}; stopping this run\n".encode())
        while True:
            stop_logging_to(self.log, CANCEL_GRACE_S)
            if self.ended.wait(0.2):
                return

    def error(self) -> StageError:
        return StageError(self.run.stage, self.run.key,
                          f"{self.lost}; this run was stopped and published nothing",
                          target=self.run.targets[0] if self.run.targets else None,
                          log_path=self.log)

    def check(self) -> None:
        """Raise `error()` once the lease is lost."""
        if self.lost is not None:
            raise self.error()

    def end(self) -> None:
        self.ended.set()
        self.heartbeat.stop()
