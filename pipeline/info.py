"""info: where enginectl keeps things on this machine, whether it can reach them, and which
runtimes it would use (the `enginectl info` verb).

Every location says where it came from (the variable that set it, or the default), so a
wrong store or registry is found before a build writes to it. The store and the registry are
each asked one cheap question under a timeout (an unreachable PostgreSQL or S3 endpoint
answers "no answer in 5 s", not a hang); nothing is created or migrated — a registry file
that does not exist yet stays that way, and is said to be missing with the command that
creates it. A setting that cannot be used (a relative path, a home or cache directory that is
a file, a registry URL that is not one) is `ConfigError` (exit 2), not a line of the report.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pipeline.host.runtimes import CONFIGURED, program, vllm_in, vllm_pythons
from pipeline.settings import Settings
from registry.config import RegistryConfig, check_directory

CHECK_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Location:
    name: str
    value: str
    source: str  # the variable that set it, or "default (...)"


@dataclass(frozen=True, slots=True)
class Reach:
    """The answer to one quick question: ok, what it said, or why not."""

    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class ProgramCheck:
    name: str
    path: str | None
    version: str | None = None
    detail: str | None = None


@dataclass
class Info:
    locations: list[Location]
    store: Reach
    registry: Reach
    schema: dict[str, str | None]  # revision, head, state
    runtimes: list[ProgramCheck] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "locations": {loc.name: {"value": loc.value, "source": loc.source}
                          for loc in self.locations},
            "store": {"ok": self.store.ok, "detail": self.store.detail},
            "registry": {"ok": self.registry.ok, "detail": self.registry.detail},
            "schema": self.schema,
            "runtimes": {r.name: {"path": r.path, "version": r.version, "detail": r.detail}
                         for r in self.runtimes},
        }


def _source(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    if env.get(name):
        return name
    return f"default: {default}" if default else "default"


def locations(env: Mapping[str, str]) -> list[Location]:
    """Home, store, registry, cache and work directory, each with where it came from."""
    from registry.config import masked_url

    config = RegistryConfig.from_env(env)
    settings = Settings.from_env(env)
    if env.get("ENGINECTL_HOME"):
        home_source = "ENGINECTL_HOME"
    elif env.get("XDG_DATA_HOME") and Path(env["XDG_DATA_HOME"]).expanduser().is_absolute():
        home_source = "XDG_DATA_HOME, + /enginectl"
    else:
        home_source = "default: ~/.local/share/enginectl"
    return [
        Location("home", str(config.home), home_source),
        Location("store", config.store_url, _source(env, "ENGINECTL_STORE_URL", "<home>/store")),
        Location("registry", masked_url(config.registry_url),
                 _source(env, "ENGINECTL_REGISTRY_URL", "<home>/registry.db")),
        Location("cache", str(config.cache_dir), _source(env, "ENGINECTL_CACHE_DIR")),
        Location("work", str(settings.work_dir), _source(env, "ENGINECTL_WORK_DIR", "<home>/work")),
    ]


def _within(timeout_s: float, question: Callable[[], Reach]) -> Reach:
    """*question*'s answer, or "no answer" after *timeout_s* (its thread is left behind,
    a daemon: a hung connection must not hang `info`)."""
    answers: list[Reach] = []

    def ask() -> None:
        try:
            answers.append(question())
        except Exception as exc:  # noqa: BLE001 - any failure is the answer here
            answers.append(Reach(False, " ".join(f"{type(exc).__name__}: {exc}".split())))

    thread = threading.Thread(target=ask, daemon=True, name="info-check")
    thread.start()
    thread.join(timeout_s)
    return answers[0] if answers else Reach(False, f"no answer in {timeout_s:g} s")


def _store_reach(config: RegistryConfig) -> Reach:
    from registry.identity.digest import Digest
    from registry.store.opener import open_store

    store = open_store(config.store_url, s3_endpoint_url=config.s3_endpoint_url)
    store.has_manifest(Digest.parse("sha256:" + "0" * 64))  # one cheap request
    return Reach(True, f"reachable ({config.store_url})")


def _registry_reach(url: str, schema: dict[str, str | None], *, retry_s: float) -> Reach:
    from registry.sql.listing import schema_revision
    from registry.sql.lookup import HEAD

    revision = schema_revision(url, retry_s=retry_s)  # on the driver: no SQLAlchemy
    if revision is None or revision == HEAD:
        state = "empty" if revision is None else "current"
    else:  # behind or newer: Alembic's scripts say which
        from registry.sql.schema import schema_state

        state = schema_state(revision)
    schema.update(revision=revision, head=HEAD, state=state)
    if revision is None:
        return Reach(True, "reachable; no registry yet: `enginectl db upgrade` creates it, and "
                           "so does the first command that writes to it (import, build)")
    return Reach(True, f"reachable; schema {revision} ({schema['state']})")


def runtimes(settings: Settings, env: Mapping[str, str]) -> list[ProgramCheck]:
    """vLLM's Python and its vllm, trtllm-serve, trtllm-build and nvidia-smi."""
    from pipeline.planning.probe import probe

    vllm = vllm_in(settings.vllm_python)
    source = (CONFIGURED if vllm_pythons(env)[0].found_by == CONFIGURED
              else "default: scripts/install-vllm's venv, else python3")
    found = [ProgramCheck("vllm", vllm.path, vllm.version, vllm.problem or source)]
    for name in ("trtllm-serve", "trtllm-build"):
        path = program(name)
        found.append(ProgramCheck(name, path, None, None if path else "not on PATH"))
    smi = program("nvidia-smi")
    if smi is None:
        found.append(ProgramCheck("nvidia-smi", None, None, "not on PATH: no NVIDIA GPU is used"))
    else:
        probed = probe(settings)
        gpu = probed.toolchain.gpu or probed.gpu_name
        found.append(ProgramCheck("nvidia-smi", smi, probed.toolchain.driver,
                             f"{probed.gpu_count} x {gpu}" if gpu else probed.note))
    return found


def info(env: Mapping[str, str] | None = None, *,
         timeout_s: float = CHECK_TIMEOUT_S) -> Info:
    """What `enginectl info` shows (see the module doc)."""
    env = os.environ if env is None else env
    config = RegistryConfig.from_env(env)
    settings = Settings.from_env(env)
    check_directory(config.home, what="enginectl's home", variable=config.variable("home"))
    check_directory(config.cache_dir, what="the fetch cache",
                    variable=config.variable("cache_dir"))
    schema: dict[str, str | None] = {"revision": None, "head": None, "state": None}
    store = _within(timeout_s, lambda: _store_reach(config))
    registry = _within(timeout_s, lambda: _registry_reach(  # its own time-out bounds the retry
        config.registry_url, schema, retry_s=min(config.registry_retry_s, timeout_s)))
    return Info(locations(env), store, registry, dict(schema), runtimes(settings, env))
