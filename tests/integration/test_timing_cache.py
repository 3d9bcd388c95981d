"""The TensorRT timing cache per pool (issue 25, point 4), through the trtllm-build stand-in.

A build starts from its pool's (GPU SKU, SM, TensorRT version) timing cache and publishes the
one trtllm-build wrote; a cache of another pool is never offered, and one that got into the
pool but is not of this TensorRT or GPU (or is damaged) is refused by TensorRT and the build
runs cold; two builds at once both keep their entries; the cache never changes a key.

The builders here have the stand-in `tensorrt` (tests/fakes/python) in their Python, as a real
builder has TensorRT's; the trtllm-build stand-in records what its timing cache did in
FAKE_TRTLLM_TIMING_LOG. The registry is SQLite and the store a file store: the SQL side is not
what this is about; the merge is also run on an S3 store.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from pipeline.stages.timing_cache import NOTE, CacheScope, TimingCache, cache_name, tactic_flags
from registry.gpus import lookup_gpu
from registry.store.base import Store
from registry.store.opener import open_store
from tests.helpers import FAKES, builder_env, enginectl
from tests.integration.builds import GUARD_S, build, engines, make_model, start

FAKE_PYTHON = FAKES / "python"


def _stand_in_tensorrt() -> ModuleType:
    """tests/fakes/python/tensorrt, loaded under a name of its own (this process's
    `import tensorrt` stays what it was)."""
    spec = importlib.util.spec_from_file_location("fake_tensorrt",
                                                  FAKE_PYTHON / "tensorrt" / "__init__.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fake_trt = _stand_in_tensorrt()

H100 = CacheScope("H100-SXM5-80GB", 90, "10.14.1.48", "13.1")
SHAPES = {
    "small": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
    "wide": {"max_batch_size": 16, "max_input_len": 256, "max_seq_len": 512},
    "tall": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048},
    "deep": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024},
}


@pytest.fixture
def registry_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'home' / 'registry.db'}"


@pytest.fixture
def env(tmp_path: Path, registry_url: str) -> dict[str, str]:
    """A builder on the stand-ins whose Python has (the stand-in) TensorRT."""
    base = builder_env(tmp_path, registry_url)
    path = os.pathsep.join(p for p in (str(FAKE_PYTHON), base.get("PYTHONPATH")) if p)
    return {**base, "PYTHONPATH": path, "FAKE_TRTLLM_TIMING_LOG": str(tmp_path / "timing.jsonl")}


def engine_recipe(directory: Path, *shapes: str, gpu: str = "h100",
                  toolchain: dict[str, str] | None = None, name: str = "toy") -> Path:
    if not (directory / "model").is_dir():
        make_model(directory / "model")
    recipe: dict[str, Any] = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": [gpu], "quant": ["bf16"],
                   "shape": [{"name": shape, **SHAPES[shape]} for shape in shapes]},
        "serve": {"trtllm": {}},
    }
    if toolchain:
        recipe["toolchain"] = toolchain
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def timings(tmp_path: Path) -> list[dict[str, Any]]:
    """What the stand-in's timing cache did, one line per trtllm-build run."""
    record = tmp_path / "timing.jsonl"
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def home_store(tmp_path: Path) -> Store:
    return open_store((tmp_path / "home" / "store").as_uri())


def stored(store: Store, pool: CacheScope = H100) -> list[str]:
    """The keys of the pool's stored caches, temp files aside."""
    return [info.key for info in store.list_objects(pool.prefix) if info.key.endswith(".cache")]


def caches(store: Store, pool: CacheScope = H100) -> dict[str, dict[str, Any]]:
    """The pool's stored caches (key -> the stand-in's cache)."""
    return {key: json.loads(store.get_object(key)) for key in stored(store, pool)}


def planned_engines(env: dict[str, str], recipe: Path) -> set[str]:
    plan = json.loads(build(env, recipe, "--dry-run", "--json").stdout)
    return {s["key"] for s in plan["stages"] if s["kind"] == "trtllm-engine"}


def log_of(env: dict[str, str], key: str) -> str:
    done = enginectl(env, "logs", key)
    return done.stdout


def notes(log: str) -> list[str]:
    return [line.removeprefix(NOTE) for line in log.splitlines() if line.startswith(NOTE)]


def serialized(tensorrt: str, sm: int, entries: dict[str, Any]) -> bytes:
    """A cache as the stand-in TensorRT writes one."""
    return fake_trt.ITimingCache(tensorrt, {"sm": sm, "name": None}, entries).serialize()


# --- through enginectl build ---------------------------------------------------------------------


def test_a_build_publishes_its_cache_and_the_next_shape_starts_from_it_under_the_same_keys(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    both = engine_recipe(tmp_path, "small", "wide", name="both")
    planned = planned_engines(env, both)  # before any cache exists
    build(env, engine_recipe(tmp_path, "small"))
    (first,) = timings(tmp_path)
    assert (first["input_timing_cache"], first["loaded"]) == (None, None)  # cold
    store = home_store(tmp_path)
    (published,) = caches(store).values()
    assert (published["tensorrt"], published["device"]["sm"]) == ("10.14.1.48", 90)
    assert len(published["entries"]) == first["entries"] > 0
    assert Path(first["output_timing_cache"]).is_relative_to(tmp_path / "home" / "work")

    build(env, both)  # small is a hit; wide builds, from small's cache
    _, second = timings(tmp_path)
    assert second["input_timing_cache"] is not None
    assert second["loaded"] == len(published["entries"])
    assert second["hits"] >= 1  # the layers both shapes share were not timed again
    stored = caches(store)
    assert len(stored) == 2
    grown = max(stored.values(), key=lambda cache: len(cache["entries"]))
    assert set(published["entries"]) < set(grown["entries"])
    assert len(grown["entries"]) == second["entries"]

    built = {engine.key for engine in engines(registry_url)}
    assert built == planned == planned_engines(env, both)  # the cache is in no key
    wide = next(e for e in engines(registry_url) if e.max_batch_size == 16)
    said = notes(log_of(env, wide.key or ""))
    assert said[0].startswith(f"starting from 1 of {H100}: {H100.prefix}")
    assert said[-1].startswith(f"published {H100.prefix}")


def test_a_cache_of_another_tensorrt_version_or_gpu_is_never_offered(
    env: dict[str, str], tmp_path: Path
) -> None:
    older = CacheScope("H100-SXM5-80GB", 90, "10.13.1.1", "13.1")
    a100 = CacheScope("A100-SXM4-80GB", 80, "10.14.1.48", "13.1")
    store = home_store(tmp_path)
    build({**env, "FAKE_TENSORRT_VERSION": older.tensorrt},
          engine_recipe(tmp_path, "small", toolchain={"tensorrt": older.tensorrt}, name="old"))
    assert len(caches(store, older)) == 1
    build(env, engine_recipe(tmp_path, "small", name="new"))
    build({**env, "FAKE_TRTLLM_SM": "80"}, engine_recipe(tmp_path, "small", gpu="a100",
                                                           name="a100"))
    runs = timings(tmp_path)
    assert [run["input_timing_cache"] for run in runs] == [None, None, None]
    for pool, tensorrt, sm in ((older, "10.13.1.1", 90), (H100, "10.14.1.48", 90),
                               (a100, "10.14.1.48", 80)):
        (cache,) = caches(store, pool).values()
        assert (cache["tensorrt"], cache["device"]["sm"]) == (tensorrt, sm)


FOREIGN = {
    "damaged": b"\x00\x01 half a timing cache",
    "of-another-tensorrt": serialized("10.13.1.1", 90, {"gemm|x": {"tactic": "0x1", "ms": "1"}}),
    "of-another-gpu": serialized("10.14.1.48", 80, {"gemm|x": {"tactic": "0x1", "ms": "1"}}),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_cache_in_the_pool_that_tensorrt_refuses_is_not_used_and_the_build_runs_cold(
    kind: str, env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """One in the pool's prefix that is not a cache of this TensorRT on this GPU (the prefix
    lied, or the bytes were damaged): TensorRT's merge refuses it, the build runs cold and
    succeeds, and its own cache is published beside the refused one (left as it is)."""
    store = home_store(tmp_path)
    foreign = cache_name(H100, FOREIGN[kind])
    store.put_object(foreign, FOREIGN[kind])
    build(env, engine_recipe(tmp_path, "small"))
    (run,) = timings(tmp_path)
    assert (run["input_timing_cache"], run["loaded"], run["hits"]) == (None, None, 0)
    (engine,) = engines(registry_url)
    said = notes(log_of(env, engine.key or ""))
    assert any(line.startswith(f"TensorRT 10.14.1.48 on this GPU refused {foreign}")
               for line in said), said
    assert f"no cache of {H100} usable here: building cold" in said
    assert store.get_object(foreign) == FOREIGN[kind]
    assert len(stored(store)) == 2


def test_without_tensorrt_in_the_builders_python_the_build_runs_cold(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    build(env, engine_recipe(tmp_path, "small"))
    bare = {**env, "PYTHONPATH": ""}  # the builder's Python cannot import tensorrt
    build(bare, engine_recipe(tmp_path, "small", "wide", name="both"))
    _, second = timings(tmp_path)
    assert second["input_timing_cache"] is None
    wide = next(e for e in engines(registry_url) if e.max_batch_size == 16)
    said = notes(log_of(env, wide.key or ""))
    assert any(line.startswith("cannot merge with TensorRT in ") and "building cold" in line
               for line in said), said
    assert len(caches(home_store(tmp_path))) == 2  # it still published its own


def test_two_builds_at_once_both_keep_their_entries_and_the_next_merges_them(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Both start from C and publish C+a and C+b side by side; the next build of the pool
    merges all three (so it starts from a and b's entries), stores the merge and deletes what
    it merged, and nothing any build timed is lost."""
    store = home_store(tmp_path)
    build(env, engine_recipe(tmp_path, "small"))
    (start_cache,) = caches(store).values()
    builders = []
    for shape in ("wide", "tall"):
        fifo, pidfile = tmp_path / f"{shape}.fifo", tmp_path / f"{shape}.pid"
        os.mkfifo(fifo)
        held = {**env, "FAKE_TRTLLM_WAIT_FIFO": str(fifo), "FAKE_TRTLLM_PIDFILE": str(pidfile)}
        builders.append((start(held, engine_recipe(tmp_path, "small", shape, name=shape)),
                         fifo, pidfile))
    try:
        for proc, _fifo, pidfile in builders:  # both trtllm-builds run: both merged C alone
            wait_running(proc, pidfile)
    finally:
        for proc, fifo, _pidfile in builders:
            release(fifo, proc)
    for proc, _fifo, _pidfile in builders:
        _out, err = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 0, err
    runs = timings(tmp_path)
    assert [run["loaded"] for run in runs[1:]] == [len(start_cache["entries"])] * 2
    side_by_side = caches(store)
    assert len(side_by_side) == 3  # C, C+a and C+b: neither overwrote the other
    everything = {key for cache in side_by_side.values() for key in cache["entries"]}

    build(env, engine_recipe(tmp_path, "small", "deep", name="deep"))
    last = timings(tmp_path)[-1]
    assert last["loaded"] == len(everything)  # it started from a's and b's entries
    after = caches(store)
    assert not set(side_by_side) & set(after)  # merged away, once the merge was stored
    assert len(after) == 2  # the merge, and the deep build's own
    assert everything <= {key for cache in after.values() for key in cache["entries"]}


def wait_running(proc: subprocess.Popen[str], pidfile: Path) -> None:
    """Wait until the held stand-in trtllm-build of *proc* runs (a guard, not a timing)."""
    deadline = time.monotonic() + GUARD_S
    while not (pidfile.exists() and pidfile.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


def release(fifo: Path, proc: subprocess.Popen[str]) -> None:
    """Let the stand-in trtllm-build of *proc* waiting on *fifo* go on, once it has opened it
    (nothing, when *proc* has ended)."""
    deadline = time.monotonic() + GUARD_S
    while True:
        try:
            handle = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader yet (ENXIO)
            if proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.05)
            continue
        try:
            os.write(handle, b"go")
        finally:
            os.close(handle)
        return


# --- the merge on each store backend -------------------------------------------------------------


def test_concurrent_publishes_survive_the_merge_on_every_store(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same as above with TimingCache itself, on a file store and an S3 store."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_PYTHON))
    monkeypatch.delenv("FAKE_TRTLLM_SM", raising=False)
    monkeypatch.delenv("FAKE_TENSORRT_VERSION", raising=False)
    pool = CacheScope.of(lookup_gpu("h100"), "10.14.1.48", "13.1")
    assert pool == H100

    def cache(name: str) -> TimingCache:
        return TimingCache(store, pool, tmp_path / name, sys.executable, tmp_path / "log")

    start_entries = {"rmsnorm|c": {"tactic": "0x0", "ms": "1"}}
    store.put_object(cache_name(pool, data := serialized(H100.tensorrt, 90, start_entries)), data)
    first, second = cache("a"), cache("b")
    flags = [first.flags(), second.flags()]
    assert all(f[0] == "--input_timing_cache" for f in flags)  # both from C
    for timing, extra in ((first, "a"), (second, "b")):
        began = json.loads(Path(timing.directory / "input.cache").read_bytes())["entries"]
        timing.output.write_bytes(serialized(H100.tensorrt, 90, {**began, f"gemm|{extra}": {}}))
        timing.publish()
    assert len(caches(store)) == 3
    third = cache("c")
    flags3 = third.flags()
    merged = json.loads(Path(flags3[1]).read_bytes())["entries"]
    assert set(merged) == {"rmsnorm|c", "gemm|a", "gemm|b"}
    (kept,) = caches(store).values()  # C, C+a, C+b merged into one
    assert set(kept["entries"]) == set(merged)
    log = (tmp_path / "log").read_text()
    assert "stored the merge of 3 as" in log
    third.publish()
    assert not third.directory.exists()  # the local copies go once published


def test_no_tensorrt_version_no_store_means_only_an_output_in_the_work_directory(
    tmp_path: Path,
) -> None:
    """Without a pool (its TensorRT version unknown) trtllm-build still gets an output path of
    the run's own, never TRT-LLM's default 'model.cache' in the current directory."""
    assert CacheScope.of(lookup_gpu("h100"), None, "13.1") is None
    assert CacheScope.of(lookup_gpu("h100"), "10.14.1.48", None) is None
    assert CacheScope.of(lookup_gpu("h100"), "../10", "13.1") is None
    timing = TimingCache(None, None, tmp_path / "tc", sys.executable, tmp_path / "log")
    assert timing.flags() == ["--output_timing_cache", str(tmp_path / "tc" / "output.cache")]
    timing.publish()
    assert "building cold" in (tmp_path / "log").read_text()


def test_a_scope_is_one_cuda_version_and_one_set_of_tactic_flags() -> None:
    """TensorRT's timing cache is specific to the CUDA version and the builder flags that
    change tactics (TF32, REFIT) beside the device and TensorRT: each is a scope of its own."""
    h100 = lookup_gpu("h100")
    assert tactic_flags(["trtllm-build", "--gemm_plugin", "auto"], {}) == ()
    assert tactic_flags(["trtllm-build", "--strip_plan"], {}) == ("refit", "strip")
    assert tactic_flags(["trtllm-build"], {"NVIDIA_TF32_OVERRIDE": "0"}) == ("no-tf32",)
    scopes = [CacheScope.of(h100, "10.14.1.48", "13.1"),
              CacheScope.of(h100, "10.14.1.48", "13.0"),
              CacheScope.of(h100, "10.14.1.48", "13.1", ("refit", "strip")),
              CacheScope.of(h100, "10.14.1.48", "13.1", ("no-tf32",))]
    prefixes = {scope.prefix for scope in scopes if scope is not None}
    assert len(prefixes) == 4
    assert scopes[0] == H100
    assert H100.prefix == "timing-caches/H100-SXM5-80GB/sm90/tensorrt-10.14.1.48/cuda-13.1/default/"
