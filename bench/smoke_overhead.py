"""How much time `smoke()` adds beyond the server's own start-up, for the tiny model.

Target: smoke overhead beyond the server's own start-up < 2 s for the tiny model.
Run: `.venv/bin/python bench/smoke_overhead.py [--fake-runs 5] [--vllm-runs 1]` from the
repository root (≈1.5 min per vLLM run on 2 cores; the vLLM part is skipped with a message
when `scripts/install-vllm --check` fails; `--quick`: one run on the stand-in, no vLLM, to
check the script runs).

`smoke()` runs with a tiny load (1 prompt, max_tokens 4, concurrency [1], 1 request) against
(a) vLLM's CPU build serving the tiny Llama (scripts/make_tiny_model.py, made once under
`$ENGINECTL_BENCH_CACHE`) with the argv a vLLM manifest stores, and (b) the stdlib stand-in
tests/fakes/openai_server.py, whose model answers at once. The harness is instrumented from
the outside (pipeline.serving.server's `Client` and `Server.start/stop`, and
pipeline.serving.smoke's `run_checks` are wrapped; no product code changes):

    wall        smoke() call, start to return
    ready_s     what smoke() reports: process start to the first successful generation
    model_s     the sum of the latencies of every request the checks and the load sent after
                readiness (each measured around its HTTP call: time in the server, plus
                loopback and http.client, which is the best available stand-in for "time
                spent in the model answering")
    stop_s      Server.stop(): SIGTERM, wait for the group to exit (the server's own shutdown)
    overhead    wall - ready_s - model_s (includes stop_s); also shown without stop_s
The log is also watched for the server's "I listen" line, to show how long after it the
first generation was seen (inside ready_s: the first generation plus the 0.5 s poll step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _support import CACHE, add_quick, exit_on_signals, loadavg, log, machine, quick_mode

from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import SmokeSettings, VllmServe
from pipeline.serving import server as server_module
from pipeline.serving import smoke as smoke_module
from pipeline.serving.loadgen import Client, Response, Streamed
from pipeline.serving.server import Server
from pipeline.serving.smoke import SmokeServer, smoke
from pipeline.stages.serve import VllmServing, vllm_argv

ROOT = Path(__file__).resolve().parent.parent
FAKE_SERVER = ROOT / "tests" / "fakes" / "openai_server.py"
SERVED_NAME = "tiny-llama"
SHAPE = Shape(max_batch_size=4, max_input_len=200, max_seq_len=256)  # as tests/smoke
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1"}
LISTEN_MARKERS = (b"Application startup complete", b"fake-openai: serving")
SETTINGS = SmokeSettings(prompts=["The capital of France is"], max_tokens=4, concurrency=[1],
                         requests=1, ready_timeout_s=600, request_timeout_s=120)


# --- shared with loadgen_capacity.py ---------------------------------------------------------


def vllm_python() -> Path | None:
    """scripts/install-vllm's python, or None (and why, on stderr) when it is not installed."""
    proc = subprocess.run([str(ROOT / "scripts" / "install-vllm"), "--check"],
                          capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0 or not proc.stdout.strip():
        log("SKIPPED vLLM: `scripts/install-vllm --check` failed "
            f"({proc.stderr.strip() or 'not installed'}); run scripts/install-vllm")
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def tiny_model() -> Path:
    """The tiny Llama, made once under the bench cache (make_tiny_model.py is idempotent)."""
    out = CACHE / "tiny-llama"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(out)],
                   cwd=ROOT, env=env, capture_output=True, check=True, timeout=600)
    return out


def vllm_template(python: Path) -> list[str]:
    return vllm_argv(str(python), VllmServing(SHAPE, VllmServe(enforce_eager=True), cpu=True),
                     model_dir=Path("{model_dir}"), served_name=SERVED_NAME)


def fake_template() -> list[str]:
    return [sys.executable, str(FAKE_SERVER), "--model", "{model_dir}", "--host", "127.0.0.1",
            "--port", "{port}", "--served-model-name", SERVED_NAME, "--max-model-len", "512"]


# --- instrumentation -------------------------------------------------------------------------


@dataclass
class Probe:
    """What the wrapped harness saw during one smoke() call."""

    checking: bool = False
    latencies: list[float] = field(default_factory=list)
    checks_s: float = 0.0
    stop_s: float = 0.0
    server: Server | None = None
    listening_at: float | None = None


@contextmanager
def instrumented() -> Iterator[Probe]:
    probe = Probe()
    original_client, original_checks = server_module.Client, smoke_module.run_checks
    original_start, original_stop = Server.start, Server.stop

    class TimedClient(Client):
        def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                    timeout_s: float | None = None) -> Response:
            started = time.perf_counter()
            try:
                return super().request(method, path, body, timeout_s=timeout_s)
            finally:
                if probe.checking:
                    probe.latencies.append(time.perf_counter() - started)

        def stream(self, path: str, body: Mapping[str, Any]) -> Streamed:
            started = time.perf_counter()
            try:
                return super().stream(path, body)
            finally:
                if probe.checking:
                    probe.latencies.append(time.perf_counter() - started)

    def run_checks(*args: Any, **kwargs: Any) -> Any:
        probe.checking = True
        started = time.perf_counter()
        try:
            return original_checks(*args, **kwargs)
        finally:
            probe.checks_s = time.perf_counter() - started
            probe.checking = False

    def start(self: Server) -> None:
        original_start(self)
        probe.server = self

    def stop(self: Server) -> None:
        started = time.perf_counter()
        try:
            original_stop(self)
        finally:
            probe.stop_s += time.perf_counter() - started

    server_module.Client = TimedClient  # type: ignore[misc]
    smoke_module.run_checks = run_checks
    Server.start = start  # type: ignore[method-assign]
    Server.stop = stop  # type: ignore[method-assign]
    done = threading.Event()
    watcher = threading.Thread(target=watch_log, args=(probe, done), daemon=True)
    watcher.start()
    try:
        yield probe
    finally:
        done.set()
        watcher.join(5)
        server_module.Client = original_client  # type: ignore[misc]
        smoke_module.run_checks = original_checks
        Server.start = original_start  # type: ignore[method-assign]
        Server.stop = original_stop  # type: ignore[method-assign]


def watch_log(probe: Probe, done: threading.Event) -> None:
    """Note when the server's log first says it listens (polled every 20 ms)."""
    while not done.wait(0.02):
        server = probe.server
        if server is None or probe.listening_at is not None:
            continue
        try:
            text = server.log_path.read_bytes()
        except OSError:
            continue
        if any(marker in text for marker in LISTEN_MARKERS):
            probe.listening_at = time.monotonic() - server.started_at


@dataclass
class Run:
    wall: float
    ready_s: float
    model_s: float
    requests: int
    checks_s: float
    stop_s: float
    listen_s: float | None

    @property
    def upper(self) -> float:
        return self.wall - self.ready_s

    @property
    def overhead(self) -> float:
        return self.wall - self.ready_s - self.model_s

    @property
    def overhead_without_stop(self) -> float:
        return self.overhead - self.stop_s


def one_run(template: list[str], model_dir: Path, workdir: Path,
            env: Mapping[str, str] | None) -> Run:
    with instrumented() as probe:
        started = time.perf_counter()
        server = SmokeServer(template, model_dir, SERVED_NAME,
                             workdir / f"smoke-{uuid.uuid4().hex}.log", env=env)
        report = smoke(server, settings=SETTINGS, max_input_len=SHAPE.max_input_len,
                       price_per_hour=None)
        wall = time.perf_counter() - started
    if not report.passed or report.ready_s is None:
        raise SystemExit(f"smoke did not pass: {report.failure}")
    return Run(wall, report.ready_s, sum(probe.latencies), len(probe.latencies),
               probe.checks_s, probe.stop_s, probe.listening_at)


def summarize(name: str, runs: list[Run]) -> None:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.3f}"

    print(f"\n{name}: {len(runs)} run(s), medians in s (max overhead "
          f"{max(r.overhead for r in runs):.3f})")
    print("| server | wall | ready_s | listen→ready | model_s (requests) | stop_s "
          "| wall − ready_s (upper bound) | overhead | overhead without stop |")
    listen = [r.ready_s - r.listen_s for r in runs if r.listen_s is not None]
    print(f"| {name} | {med([r.wall for r in runs])} | {med([r.ready_s for r in runs])} "
          f"| {med(listen) if listen else '?'} "
          f"| {med([r.model_s for r in runs])} ({runs[0].requests}) "
          f"| {med([r.stop_s for r in runs])} | {med([r.upper for r in runs])} "
          f"| **{med([r.overhead for r in runs])}** "
          f"| {med([r.overhead_without_stop for r in runs])} |")
    for run in runs:
        log(f"  {name}: wall {run.wall:.3f} ready {run.ready_s:.3f} listen {run.listen_s} "
            f"model {run.model_s:.3f}/{run.requests} req checks {run.checks_s:.3f} "
            f"stop {run.stop_s:.3f} overhead {run.overhead:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-runs", type=int, default=5)
    parser.add_argument("--vllm-runs", type=int, default=1)
    add_quick(parser)
    args = parser.parse_args()
    if quick_mode(args.quick):
        args.fake_runs, args.vllm_runs = 1, 0  # no vLLM start (~40 CPU-s)
    exit_on_signals()
    print(f"machine: {machine()}; load average before: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="smoke-overhead-") as tmp:
        workdir = Path(tmp)
        model_dir = workdir / "fake-model"
        model_dir.mkdir()
        fake_runs = [one_run(fake_template(), model_dir, workdir, None)
                     for _ in range(max(1, args.fake_runs))]
        summarize("fake (tests/fakes/openai_server.py)", fake_runs)
        python = vllm_python() if args.vllm_runs > 0 else None
        if python is not None:
            tiny = tiny_model()
            vllm_runs = [one_run(vllm_template(python), tiny, workdir, VLLM_ENV)
                         for _ in range(args.vllm_runs)]
            summarize("vLLM CPU, tiny Llama", vllm_runs)
    print(f"load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
