"""The TensorRT timing cache of engine builds, one per scope: (GPU SKU, SM, TensorRT version,
CUDA version, the builder flags that change tactics).

While it builds an engine, TensorRT times candidate kernels ("tactics") for each layer
configuration and keeps the fastest in a timing cache; a build that starts from a cache does
not time again what the cache holds. The cache changes how long a build takes, never what the
engine computes, so it is not in the build key: its flags are added to trtllm-build's argv when
the build runs (`pipeline.executors.work`), never to the planned flags that the key is made of
(`pipeline.stages.build.build_flags`). TensorRT's developer guide says a timing cache is
specific to the device, the CUDA and TensorRT versions, and the builder configuration flags
that change which implementations a layer may take (BuilderFlag TF32 and REFIT among them):
the store keeps one per scope (`CacheScope`), so another scope's is never offered, and
TensorRT itself refuses one of another version or device (its header), so one that got under
the wrong prefix is not used either. The flags (`tactic_flags`): `refit` and `strip`
(trtllm-build's --strip_plan builds a refittable engine stripped of its weights: TensorRT's
STRIP_PLAN with REFIT_IDENTICAL) and `no-tf32` (NVIDIA_TF32_OVERRIDE=0 in the build's
environment turns TF32 off under every library); a build with none of them is `default`.

Store layout (beside the artifacts' objects, never under blobs/ or manifests/, which gc sweeps):

    timing-caches/<GPU SKU>/sm<SM>/tensorrt-<TensorRT version>/cuda-<CUDA>/<flags>/
        <sha256 of the bytes>.cache

Every build's output is an object of its own, named by its content, so builds of one pool that
run at once never overwrite each other: both start from C and publish C+a and C+b side by side.
A build
  1. lists its pool's objects and downloads the newest `MAX_MERGED`;
  2. merges them into one input with TensorRT (`MERGE`, run in the builder's Python through
     the process runner): a new cache of this TensorRT on this GPU into which each is
     `ITimingCache.combine`d with ignore_mismatch False, which refuses one of another
     TensorRT version or device and one that TensorRT cannot read (those are left out of the
     input, and left in the store);
  3. when it combined two or more, stores the merge and only then deletes what it combined
     (every entry stays in some object; a concurrent build that listed a deleted one merges
     the others), so a pool's objects do not pile up;
  4. runs trtllm-build with --input_timing_cache (the merge) and --output_timing_cache (a file
     of the run's work directory: TRT-LLM 1.2 opens a relative path, and its default
     'model.cache', in the current directory);
  5. stores the output (the input's entries plus what this build timed) as a new object.

Nothing here fails a build: an unreadable store, no TensorRT in the builder's Python, a damaged
or foreign object, an output that was not written: the build runs, or goes on, cold, and the
run's log says why (lines starting with `NOTE`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pipeline.host.runner import capture
from registry.errors import NotFoundError
from registry.gpus import GpuSpec
from registry.store.base import ObjectInfo, Store

ROOT: Final = "timing-caches/"
MAX_MERGED: Final = 16
"""The newest objects of a pool one build merges; older ones wait for a later build's merge."""
MERGE_TIMEOUT_S: Final = 300.0
NOTE: Final = "enginectl: timing cache: "
_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_NAME: Final = re.compile(r"[0-9a-f]{64}\.cache")

# Runs in the builder's Python (any Python 3.8+ with TensorRT's `tensorrt`; nothing of
# enginectl): argv is the merged file to write, then the caches to merge; prints the TensorRT
# version and the caches it combined. The calls are TensorRT's Python API
# (Builder.create_builder_config, IBuilderConfig.create_timing_cache, ITimingCache.combine and
# serialize: python/docstrings/infer/pyCoreDoc.h of NVIDIA/TensorRT).
MERGE: Final = (
    "import json, os, sys\n"
    "import tensorrt as trt\n"
    "out, paths = sys.argv[1], sys.argv[2:]\n"
    "config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()\n"
    "merged = config.create_timing_cache(b'')\n"
    "combined = []\n"
    "for path in paths:\n"
    "    with open(path, 'rb') as f:\n"
    "        data = f.read()\n"
    "    try:\n"
    "        cache = config.create_timing_cache(data)\n"
    "    except Exception:\n"
    "        cache = None\n"
    "    if cache is not None and merged.combine(cache, False):\n"
    "        combined.append(path)\n"
    "with open(out + '.part', 'wb') as f:\n"
    "    f.write(memoryview(merged.serialize()))\n"
    "os.replace(out + '.part', out)\n"
    "print(json.dumps({'tensorrt': trt.__version__, 'combined': combined}))\n"
)


def tactic_flags(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """The builder flags of a trtllm-build *argv* run in *env* that change which tactics
    TensorRT may time (module doc), in a fixed order."""
    strip = "--strip_plan" in argv
    found = [name for name, on in (("refit", strip or "--refit" in argv), ("strip", strip),
                                   ("no-tf32", env.get("NVIDIA_TF32_OVERRIDE") == "0")) if on]
    return tuple(found)


@dataclass(frozen=True, slots=True)
class CacheScope:
    """The builds that share a timing cache: one GPU SKU and SM, one TensorRT and CUDA
    version, the same tactic-changing builder flags (`tactic_flags`, "default" for none)."""

    sku: str
    sm: int
    tensorrt: str
    cuda: str
    flags: str = "default"

    @classmethod
    def of(cls, gpu: GpuSpec, tensorrt: str | None, cuda: str | None,
           flags: Sequence[str] = ()) -> CacheScope | None:
        """The scope of a build on *gpu* with *tensorrt*, *cuda* and *flags*; None when a
        version is unknown or a part would not be a safe key segment."""
        named = "+".join(flags) or "default"
        if tensorrt is None or cuda is None or not all(
                _SEGMENT.fullmatch(part) for part in (gpu.sku, tensorrt, cuda, named)):
            return None
        return cls(gpu.sku, gpu.sm, tensorrt, cuda, named)

    @property
    def prefix(self) -> str:
        return (f"{ROOT}{self.sku}/sm{self.sm}/tensorrt-{self.tensorrt}/cuda-{self.cuda}/"
                f"{self.flags}/")

    def __str__(self) -> str:
        return (f"{self.sku} (SM {self.sm}, TensorRT {self.tensorrt}, CUDA {self.cuda}, "
                f"{self.flags} flags)")


def cache_name(pool: CacheScope, data: bytes) -> str:
    """Where *data*, a serialized timing cache of *pool*, is stored."""
    return f"{pool.prefix}{hashlib.sha256(data).hexdigest()}.cache"


def is_cache_name(pool: CacheScope, key: str) -> bool:
    """Whether *key* is a cache of *pool* as `cache_name` names it (not a temp file, not one of
    a deeper prefix)."""
    return key.startswith(pool.prefix) and _NAME.fullmatch(key[len(pool.prefix):]) is not None


def newest(objects: Iterable[ObjectInfo], pool: CacheScope) -> list[ObjectInfo]:
    """*pool*'s caches among *objects*, newest first."""
    found = [info for info in objects if is_cache_name(pool, info.key)]
    return sorted(found, key=lambda info: (info.modified, info.key), reverse=True)


@dataclass
class TimingCache:
    """One engine build's timing cache: `flags()` before trtllm-build runs, `publish()` after
    it succeeded. Neither raises."""

    store: Store | None
    pool: CacheScope | None
    directory: Path
    """Where the inputs, the merge and the output are (in the run's work directory)."""
    python: str
    """The builder's Python, which has TensorRT (`Settings.python`)."""
    log_path: Path

    @property
    def output(self) -> Path:
        return self.directory / "output.cache"

    def flags(self) -> list[str]:
        """trtllm-build's timing-cache flags: always --output_timing_cache (in the work
        directory), and --input_timing_cache when this pool has a cache TensorRT accepts."""
        flags = ["--output_timing_cache", str(self.output)]
        try:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory.mkdir(parents=True)
            merged = self._input()
        except Exception as exc:  # noqa: BLE001 - an optimisation: nothing here fails a build
            self._note(f"not read ({type(exc).__name__}: {exc}); building cold")
            return flags
        return flags if merged is None else ["--input_timing_cache", str(merged), *flags]

    def publish(self) -> None:
        """Store the cache trtllm-build wrote as an object of its own, then remove the local
        files (the work directory keeps the run's log, not its caches)."""
        try:
            self._publish()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _publish(self) -> None:
        if self.store is None or self.pool is None:
            return
        try:
            data = self.output.read_bytes() if self.output.is_file() else b""
            if not data:
                self._note(f"trtllm-build wrote none to {self.output}: nothing to publish")
                return
            key = cache_name(self.pool, data)
            self.store.put_object(key, data)
        except Exception as exc:  # noqa: BLE001 - an optimisation: nothing here fails a build
            self._note(f"not published ({type(exc).__name__}: {exc})")
            return
        self._note(f"published {key}")

    def _input(self) -> Path | None:
        """The merge of this pool's caches that TensorRT accepts here, or None (cold)."""
        if self.store is None or self.pool is None:
            self._note("the pool's TensorRT version is unknown: building cold")
            return None
        found = newest(self.store.list_objects(self.pool.prefix), self.pool)
        if not found:
            self._note(f"none yet for {self.pool}: building cold")
            return None
        if len(found) > MAX_MERGED:
            self._note(f"{len(found)} caches for {self.pool}; merging the newest {MAX_MERGED}")
        paths: dict[str, str] = {}  # local file -> its key
        for number, info in enumerate(found[:MAX_MERGED]):
            try:
                data = self.store.get_object(info.key)
            except NotFoundError:  # merged away by a build of the same pool meanwhile
                continue
            path = self.directory / f"in-{number}.cache"
            path.write_bytes(data)
            paths[str(path)] = info.key
        merged = self.directory / "input.cache"
        combined = self._merge(merged, paths) if paths else []
        if not combined:
            self._note(f"no cache of {self.pool} usable here: building cold")
            return None
        if len(combined) > 1:
            self._compact(self.store, self.pool, merged.read_bytes(), combined)
        self._note(f"starting from {len(combined)} of {self.pool}: {', '.join(combined)}")
        return merged

    def _merge(self, merged: Path, paths: dict[str, str]) -> list[str]:
        """Merge the caches at *paths* into *merged* with TensorRT; the keys it combined."""
        done = capture([self.python, "-c", MERGE, str(merged), *paths], timeout_s=MERGE_TIMEOUT_S)
        for line in done.stderr.splitlines()[-20:]:
            self._note(f"merge: {line}")
        report: dict[str, object] = {}
        if done.ok:
            try:
                report = json.loads(done.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                report = {}
        accepted = report.get("combined")
        if not done.ok or not isinstance(accepted, list) or not merged.is_file():
            why = ("no answer in time" if done.timed_out else f"exit {done.returncode}"
                   if not done.ok else "no report")
            self._note(f"cannot merge with TensorRT in {self.python} ({why}): building cold")
            return []
        for path, key in paths.items():
            if path not in accepted:
                self._note(f"TensorRT {report.get('tensorrt')} on this GPU refused {key} "
                           "(another TensorRT or GPU, or damaged): not used")
        return [key for path, key in paths.items() if path in accepted]

    def _compact(self, store: Store, pool: CacheScope, data: bytes, combined: list[str]) -> None:
        """Store the merge of *combined*, then delete them: it holds all their entries."""
        key = cache_name(pool, data)
        try:
            store.put_object(key, data)
            for old in combined:
                if old != key:
                    store.delete_object(old)
        except Exception as exc:  # noqa: BLE001 - an optimisation: nothing here fails a build
            self._note(f"merge not stored ({type(exc).__name__}: {exc}); the caches stay")
            return
        self._note(f"stored the merge of {len(combined)} as {key}")

    def _note(self, text: str) -> None:
        try:
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(f"{NOTE}{text}\n")
        except OSError:
            pass


def for_build(store: Store | None, gpu: GpuSpec, tensorrt: str | None, workdir: Path, *,
              python: str, log_path: Path, cuda: str | None = None,
              argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> TimingCache:
    """The timing cache of an engine build on *gpu* with TensorRT *tensorrt* and CUDA *cuda*
    (the pool's toolchain, whether or not the key's rebuild policy counts them), of the
    trtllm-build *argv* run in *env* (this process's by default), kept in *workdir*."""
    flags = tactic_flags(argv, os.environ if env is None else env)
    return TimingCache(store, CacheScope.of(gpu, tensorrt, cuda, flags),
                       workdir / "timing-cache", python, log_path)
