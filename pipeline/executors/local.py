"""The local executor (the default): stage runs on this machine's threads.

Independent runs go in parallel up to `jobs`; runs on the same GPU SKU never overlap (one
lock per SKU). Each run is `pipeline.executors.stage.StageWorker.run`, as on every executor.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from types import TracebackType

from pipeline.executors.outcome import Outcome
from pipeline.executors.runner import stop_all
from pipeline.executors.stage import StageWorker
from pipeline.plan import Plan, StageRun
from pipeline.settings import Settings
from registry.context import Context


def owner_id() -> str:
    """Who holds a lease: host, process and a random part (two builders in one process
    differ)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LocalExecutor:
    """A `pipeline.executors.dag.Backend` on this machine; use it as a context manager."""

    def __init__(self, plan: Plan, ctx: Context, settings: Settings, *, jobs: int = 1,
                 force: bool = False, local_gpu: str | None = None) -> None:
        self.capacity = max(1, jobs)
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._gpu_locks_lock = threading.Lock()
        self.worker = StageWorker(plan, ctx, settings, owner=owner_id(), force=force,
                                  local_gpu=local_gpu, gpu_slot=self._gpu_slot)
        self._pool = ThreadPoolExecutor(self.capacity, thread_name_prefix="stage")

    @contextmanager
    def _gpu_slot(self, gpu: str | None) -> Iterator[None]:
        if gpu is None:
            yield
            return
        with self._gpu_locks_lock:
            lock = self._gpu_locks.setdefault(gpu, threading.Lock())
        with lock:
            yield

    def submit(self, run: StageRun, digests: Mapping[str, str]) -> Future[Outcome]:
        return self._pool.submit(self.worker.run, run, dict(digests))

    def wind_down(self) -> None:
        self.worker.stop.set()

    def stop(self) -> None:
        self.worker.stop.set()
        stop_all()
        from pipeline.smoke import stop_all as stop_servers

        stop_servers()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        # The workers return once their children are stopped, releasing their leases.
        self._pool.shutdown(wait=True)
