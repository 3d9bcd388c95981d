"""The local executor (the default): stage runs on this machine's threads.

Independent runs go in parallel up to `jobs`; runs on the same GPU SKU never overlap (one
lock per SKU). A run that needs more GPUs than `gpu_count` (nvidia-smi's count of
`local_gpu`) fails before it starts (`pipeline.planning.capacity`). Each run is
`pipeline.executors.stage.StageWorker.run`, as on every executor.

Each run has a thread of its own (the walk never hands over more than `jobs` at once), a
daemon thread: Ctrl-C stops every child process at once, waits a moment for the runs to end
`cancelled`, and then lets the process exit, even past a run that is busy in-process (a
snapshot download, an upload) — its lease is released `cancelled` and what it leaves is what
a killed process leaves (nothing visible; see `registry.ops.publish`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, InvalidStateError, wait
from contextlib import contextmanager
from types import TracebackType
from typing import Final

from pipeline.executors.stage import CANCELLED, StageWorker, WorkerSite
from pipeline.host.runner import CANCEL_GRACE_S, stop_all
from pipeline.planning.outcome import Outcome
from pipeline.planning.plan import Plan
from pipeline.planning.stage_run import StageRun
from pipeline.settings import Settings
from registry.context import Context

CANCEL_WAIT_S: Final = 3.0
"""How long Ctrl-C waits for the runs in flight to end once their children are stopped."""


def owner_id() -> str:
    """Who holds a lease: host, process and a random part (two builders in one process
    differ)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _settle(future: Future[Outcome], outcome: Outcome | None = None,
            error: BaseException | None = None) -> None:
    with contextlib.suppress(InvalidStateError):  # abandoned: settled by `stop` already
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]


class LocalExecutor:
    """A `pipeline.executors.dag.Backend` on this machine; use it as a context manager."""

    def __init__(self, plan: Plan, ctx: Context, settings: Settings, *, jobs: int = 1,
                 force: bool = False, local_gpu: str | None = None,
                 gpu_count: int | None = None, keep_work: bool = False) -> None:
        self.capacity = max(1, jobs)
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._gpu_locks_lock = threading.Lock()
        self.worker = StageWorker(plan, ctx, settings,
                                  WorkerSite(owner_id(), local_gpu, gpu_count), force=force,
                                  gpu_slot=self._gpu_slot, keep_work=keep_work)
        self._inflight: dict[Future[Outcome], tuple[StageRun, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._stopped = False

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
        future: Future[Outcome] = Future()
        future.set_running_or_notify_cancel()
        copied = dict(digests)

        def work() -> None:
            try:
                outcome = self.worker.run(run, copied)
            except BaseException as exc:  # noqa: BLE001 - handed to the walk, which raises it
                _settle(future, error=exc)
            else:
                _settle(future, outcome)
            finally:
                with self._lock:
                    self._inflight.pop(future, None)

        thread = threading.Thread(target=work, name=f"stage-{run.stage}", daemon=True)
        with self._lock:
            self._inflight[future] = (run, thread)
        thread.start()
        return future

    def wind_down(self) -> None:
        self.worker.stop.set()

    def stop(self) -> None:
        """Ctrl-C: stop every child, give the runs CANCEL_WAIT_S to end `cancelled`, then
        release the leases of those still busy in-process and settle them `cancelled`."""
        self._stopped = True
        self.worker.cancel.set()
        self.worker.stop.set()
        stop_all(CANCEL_GRACE_S)
        from pipeline.serving.server import stop_all as stop_servers

        stop_servers()
        with self._lock:
            inflight = dict(self._inflight)
        _, busy = wait(inflight, timeout=CANCEL_WAIT_S)
        for future in busy:
            run, _thread = inflight[future]
            with contextlib.suppress(Exception):  # the registry may be what hangs
                self.worker.abandon(run)
            _settle(future, Outcome(run.stage, run.key, "cancelled", run.targets,
                                    error=CANCELLED))

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None and not self._stopped:
            with self._lock:
                threads = [thread for _run, thread in self._inflight.values()]
            for thread in threads:  # the walk has every outcome: these are ending now
                thread.join()
        self.worker.workdirs.close()
