"""Where things live on this machine, from the environment. Nothing here changes a key.

    ENGINECTL_HOME            data directory
                              (default: $XDG_DATA_HOME/enginectl, else ~/.local/share/enginectl)
    ENGINECTL_WORK_DIR        stage work directories (default: <home>/work)
    ENGINECTL_TRTLLM_EXAMPLES TensorRT-LLM's examples/
                              (default: /app/tensorrt_llm/examples, as in the release image)
    ENGINECTL_PYTHON          the Python that runs TRT-LLM and modelopt scripts
                              (default: the Python running enginectl)
    ENGINECTL_VLLM_PYTHON     the Python of vLLM's environment (default: the one
                              scripts/install-vllm made, else python3: the one order of
                              pipeline.host.runtimes.vllm_pythons); vLLM is started
                              through it, `-m vllm.entrypoints.cli.main serve` (`vllm serve`)
                              or on the CPU its API server module (pipeline.stages.serve)
    ENGINECTL_LEASE_TTL_S     how long a builder's lease on a stage key lasts unless renewed
                              (default: 120; renewed every third of it while the stage runs)
    ENGINECTL_NOTIFY_TIMEOUT_S  the whole of `nightly --notify`'s POST: connect, send, answer
                              (default: 10; a webhook slower than that is a warning)
    ENGINECTL_WARM_CAPTURE_MAX_BYTES  the most a smoke copies of its server's caches into a
                              warm cache (default: 4 GiB; a K, M, G or T suffix counts in
                              powers of 1024; what would pass it is skipped, with a note)

A value that cannot be used (a relative ENGINECTL_HOME or ENGINECTL_WORK_DIR, seconds out of
range) is refused in one line naming the variable, exit 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.host.runtimes import vllm_pythons
from registry.config import absolute_path, data_home
from registry.errors import UsageError

LEASE_TTL_DEFAULT_S = 120.0
NOTIFY_TIMEOUT_DEFAULT_S = 10.0
WARM_CAPTURE_MAX_DEFAULT = 4 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    work_dir: Path
    trtllm_examples: Path
    python: str
    vllm_python: str
    lease_ttl_s: float = LEASE_TTL_DEFAULT_S
    warm_capture_max_bytes: int = WARM_CAPTURE_MAX_DEFAULT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = data_home(env)
        return cls(
            home=home,
            work_dir=(absolute_path(env, "ENGINECTL_WORK_DIR", what="the work directory")
                      if env.get("ENGINECTL_WORK_DIR") else home / "work"),
            trtllm_examples=Path(
                env.get("ENGINECTL_TRTLLM_EXAMPLES") or "/app/tensorrt_llm/examples"
            ),
            python=env.get("ENGINECTL_PYTHON") or sys.executable,
            vllm_python=vllm_pythons(env)[0].python,
            lease_ttl_s=_seconds(env, "ENGINECTL_LEASE_TTL_S", LEASE_TTL_DEFAULT_S),
            warm_capture_max_bytes=_bytes(env, "ENGINECTL_WARM_CAPTURE_MAX_BYTES",
                                          WARM_CAPTURE_MAX_DEFAULT),
        )

    def input_dir(self, digest: str) -> Path:
        """Where this machine keeps the files of artifact *digest* when a stage or a smoke
        reads them (work/inputs/<16 hex digits>, shared by its processes:
        `registry.ops.fetch_files.fetch_once`)."""
        return self.work_dir / "inputs" / digest.removeprefix("sha256:")[:16]


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.5 <= value <= 86400:  # NaN fails too
        raise UsageError(f"{name}={text!r}: expected seconds between 0.5 and 86400, e.g. 120")
    return value


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    number, unit = text.strip().upper().removesuffix("B"), ""
    if number[-1:] in _UNITS:
        number, unit = number[:-1], number[-1]
    if not number.isdigit():
        raise UsageError(f"{name}={text!r}: expected a size in bytes, e.g. 4G or 1073741824")
    return int(number) * _UNITS[unit]


def notify_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """ENGINECTL_NOTIFY_TIMEOUT_S (module doc); UsageError for a value out of range."""
    return _seconds(os.environ if env is None else env, "ENGINECTL_NOTIFY_TIMEOUT_S",
                    NOTIFY_TIMEOUT_DEFAULT_S)
