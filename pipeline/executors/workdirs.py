"""A build's stage outputs on this machine, and when each one can go.

A published output is in the store, so its local copy (tens of GB for a 70B checkpoint) is
only worth keeping while a later run of the same build reads it. `WorkDirs` holds each
output until every run that reads it (the runs that take it as an input, and the smoke runs
that serve it through an entry) has finished here, checks that the store holds its manifest
and every blob, and removes it; `close` removes what no run came back for (a failed or
skipped consumer). A run that finds its input gone fetches it from the store through the
fetch cache instead (see `StageWorker._input_dir`).

Only what a stage wrote under its own work directory is ever removed, never a local source
used in place; the logs beside it (`<stage>.log`, `smoke.log`) stay. `keep=True`
(`enginectl build --keep-work`) keeps everything.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from pipeline.planning.plan import Plan
from pipeline.planning.stage_run import StageRun
from registry.identity.manifest import Manifest
from registry.store.base import Store


def readers(plan: Plan) -> dict[str, set[str]]:
    """For each key, the keys of the runs that read its files: its consumers, and the smoke
    runs of the entries made from it (an entry is small; its server reads the checkpoint)."""
    found: dict[str, set[str]] = {key: set() for key in plan.stages}
    for run in plan.stages.values():
        for key in run.inputs:
            found[key].add(run.key)
            if run.stage == "smoke":
                for upstream in plan.stages[key].inputs:
                    found[upstream].add(run.key)
    return found


class WorkDirs:
    """Thread-safe: the local executor's threads share one."""

    def __init__(self, plan: Plan, store: Store, *, keep: bool = False) -> None:
        self.store, self.keep = store, keep
        self._readers = readers(plan)
        self._dirs: dict[str, Path] = {}  # key -> a local directory with its files
        self._owned: dict[str, tuple[Path, Manifest]] = {}  # removable once verified
        self._lock = threading.Lock()

    def get(self, key: str) -> Path | None:
        with self._lock:
            return self._dirs.get(key)

    def fetched(self, key: str, directory: Path) -> None:
        """*directory* holds input *key*, fetched from the store (hard links into the cache)."""
        with self._lock:
            self._dirs[key] = directory

    def published(self, run: StageRun, directory: Path, manifest: Manifest) -> None:
        """*run* wrote *directory* and published it as *manifest*."""
        ours = directory.resolve().is_relative_to(run.workdir.resolve())
        with self._lock:
            self._dirs[run.key] = directory
            if ours and not self.keep:
                self._owned[run.key] = (directory, manifest)
            unread = not self._readers.get(run.key)
        if unread:
            self._remove(run.key)

    def finished(self, run: StageRun) -> None:
        """*run* ended (any way): it reads none of its inputs' files any more."""
        done: list[str] = []
        with self._lock:
            for key, readers in self._readers.items():
                if run.key in readers:
                    readers.discard(run.key)
                    if not readers:
                        done.append(key)
        for key in done:
            self._remove(key)

    def close(self) -> None:
        """The build is over: remove every output still held."""
        with self._lock:
            keys = list(self._owned)
        for key in keys:
            self._remove(key)

    def _remove(self, key: str) -> None:
        with self._lock:
            owned = self._owned.pop(key, None)
            if owned is None:
                return
            self._dirs.pop(key, None)
        directory, manifest = owned
        if not self._stored(manifest):
            return  # never lose the only copy: it stays, and the next run's _fresh clears it
        shutil.rmtree(directory, ignore_errors=True)

    def _stored(self, manifest: Manifest) -> bool:
        """Whether the store holds the manifest and every blob it names."""
        from registry.errors import RegistryError

        try:
            return self.store.has_manifest(manifest.digest) and not self.store.missing_blobs(
                entry.xxh3 for entry in manifest.files)
        except RegistryError:
            return False
