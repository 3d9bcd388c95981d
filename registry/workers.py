"""A thread pool whose threads never hold the process up: what moves bytes uses it.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, so a
Ctrl-C'd fetch would wait for every blob in flight (for a 140 GB model, a very long time)
before it could exit. These threads are daemons: once the caller has stopped what is in
flight (a `stop` event the transfers check between chunks), cleaned up and reported, the
process exits at once, and a transfer still blocked in a read dies with it (leaving only a
temp file or an unfinished multipart upload, which `gc` removes).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Final, ParamSpec, TypeVar

WORKERS: Final = min(16, 2 * (os.cpu_count() or 2))
"""How many blobs a publish, fetch or fsck moves at once."""

P = ParamSpec("P")
T = TypeVar("T")

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class Workers(Executor):
    """Up to *max_workers* daemon threads, started as work arrives."""

    def __init__(self, max_workers: int, *, name: str = "enginectl") -> None:
        self._max = max(1, max_workers)
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._queue.put((future, fn, args, kwargs))
            if len(self._threads) < self._max:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # wake the next thread too
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                    future.set_exception(exc)
                else:
                    future.set_result(result)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """A block that raised (KeyboardInterrupt included) does not wait for the work in
        flight: what has not started is cancelled, and the rest stops on its own checks."""
        if exc_type is None:
            self.shutdown(wait=True)
        else:
            self.shutdown(wait=False, cancel_futures=True)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        self._queue.put(None)
        if wait:
            for thread in list(self._threads):
                thread.join()
