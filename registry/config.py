"""Where the store, the registry and the caches are, from the environment.

    ENGINECTL_HOME            data directory (default: $XDG_DATA_HOME/enginectl,
                              else ~/.local/share/enginectl)
    ENGINECTL_STORE_URL       file:///path or s3://bucket/prefix (default: file://<home>/store)
    ENGINECTL_S3_ENDPOINT_URL an S3-compatible endpoint (MinIO, R2, Ceph, a test server),
                              http(s)://host[:port]; credentials and region come from the
                              standard AWS variables/profiles
    ENGINECTL_S3_SPLICE       0: over plain http, fetch's GETs go through obstore instead of
                              the kernel splicing their bodies into the file (s3splice),
                              and publish's parts through boto3 instead of the kernel
                              sending them from the file (s3sendfile)
    ENGINECTL_REGISTRY_URL    SQLAlchemy URL (default: sqlite:///<home>/registry.db);
                              PostgreSQL: postgresql+psycopg://user@host/db
    ENGINECTL_REGISTRY_RETRY_S  seconds a registry call made while no lease is held (pull,
                              fetch, plan, ls) retries a PostgreSQL connection fault
                              (default 30); under a lease, the lease's time left bounds it
    ENGINECTL_CACHE_DIR       fetch cache keyed by file digest (default: $XDG_CACHE_HOME/
                              enginectl, else ~/.cache/enginectl; its entries are under
                              `xxh3-128/`, beside the vLLM environment scripts/install-vllm
                              puts there). Without the variable, entries of the cache's old
                              place, <home>/cache, are still used (and moved over).

The environment is enough; nothing here is read from a file. A setting that cannot be
what it names is `ConfigError` (exit 2) in one line naming the variable and its value:
ENGINECTL_HOME or ENGINECTL_CACHE_DIR that is not an absolute path (`~` is expanded), and
ENGINECTL_REGISTRY_URL that is not a sqlite:// or postgresql:// URL, when the settings are
read. `check_directory` is the one check against the file system: a directory setting that
names a file is refused the same way, before anything writes there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from registry.errors import ConfigError

REGISTRY_RETRY_DEFAULT_S: Final = 30.0
"""How long a registry call made without a lease retries a connection fault."""
_REGISTRY_URL: Final = re.compile(r"(sqlite|postgresql|postgres)(\+[A-Za-z0-9_]+)?://.*",
                                  re.DOTALL)
_PASSWORD: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@?#]*):[^?#]*@", re.DOTALL)


def masked_url(url: str) -> str:
    """*url* with its password replaced by `***`, for messages and logs (the one masker:
    the settings, the SQL registry and the CLI print a registry URL through it). Everything
    up to the last `@` before the query is taken for the password, so a password with an
    unescaped `@` or `/` is masked whole."""
    return _PASSWORD.sub(r"\1:***@", url, count=1)


def absolute_path(env: Mapping[str, str], variable: str, *, what: str) -> Path:
    """*variable*'s path with `~` expanded; ConfigError unless it is absolute (a relative
    one would mean another place in every directory a command is started from)."""
    value = env[variable]
    try:
        path = Path(value).expanduser()
    except RuntimeError as exc:  # `~user` of a user that does not exist
        raise ConfigError(f"{variable}={value!r}: {exc}; give {what} as an absolute path",
                          variable=variable, value=value) from exc
    if not path.is_absolute():
        raise ConfigError(f"{variable}={value!r} is not an absolute path; give {what} as one "
                          f"(e.g. {variable}=$PWD/{value})", variable=variable, value=value)
    return path


def registry_url_of(env: Mapping[str, str]) -> str | None:
    """ENGINECTL_REGISTRY_URL when set; ConfigError when it is not a SQLite or PostgreSQL
    URL (it would otherwise read as a database that does not answer)."""
    url = env.get("ENGINECTL_REGISTRY_URL")
    if not url:
        return None
    if _REGISTRY_URL.fullmatch(url) is None:
        raise ConfigError(
            f"ENGINECTL_REGISTRY_URL={masked_url(url)!r} is not a registry URL: use "
            "sqlite:////abs/path/registry.db or postgresql+psycopg://user@host/db",
            variable="ENGINECTL_REGISTRY_URL", value=masked_url(url))
    return url


def data_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("ENGINECTL_HOME"):
        return absolute_path(env, "ENGINECTL_HOME", what="enginectl's home")
    return _xdg(env, "XDG_DATA_HOME", Path.home() / ".local" / "share") / "enginectl"


def _xdg(env: Mapping[str, str], variable: str, default: Path) -> Path:
    """An XDG base directory: a relative one is ignored, as the XDG spec says."""
    path = Path(env.get(variable) or default).expanduser()
    return path if path.is_absolute() else default


def cache_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/enginectl`, else `~/.cache/enginectl`: the fetch cache's default,
    shared with the vLLM environment that scripts/install-vllm makes there."""
    env = os.environ if env is None else env
    return _xdg(env, "XDG_CACHE_HOME", Path.home() / ".cache") / "enginectl"


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    home: Path
    store_url: str
    s3_endpoint_url: str | None
    registry_url: str
    cache_dir: Path
    legacy_cache_dirs: tuple[Path, ...] = ()
    """Older cache places whose entries are still used (moved into *cache_dir* on use)."""
    registry_retry_s: float = REGISTRY_RETRY_DEFAULT_S
    """How long a registry call made without a lease retries a connection fault."""
    origins: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """Where each setting came from: the variable that set it, or how its default was made."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistryConfig:
        env = os.environ if env is None else env
        home = data_home(env)
        origins = {
            "home": "ENGINECTL_HOME" if env.get("ENGINECTL_HOME")
            else "default: $XDG_DATA_HOME/enginectl or ~/.local/share/enginectl",
            "store_url": "ENGINECTL_STORE_URL" if env.get("ENGINECTL_STORE_URL")
            else "default: <home>/store",
            "registry_url": "ENGINECTL_REGISTRY_URL" if env.get("ENGINECTL_REGISTRY_URL")
            else "default: <home>/registry.db",
            "cache_dir": "ENGINECTL_CACHE_DIR" if env.get("ENGINECTL_CACHE_DIR")
            else "default: $XDG_CACHE_HOME/enginectl or ~/.cache/enginectl",
        }
        legacy: tuple[Path, ...] = ()
        if env.get("ENGINECTL_CACHE_DIR"):
            cache_dir = absolute_path(env, "ENGINECTL_CACHE_DIR", what="the fetch cache")
        else:
            cache_dir, legacy = cache_home(env), (home / "cache",)
        return cls(
            home=home,
            store_url=env.get("ENGINECTL_STORE_URL") or (home / "store").as_uri(),
            s3_endpoint_url=env.get("ENGINECTL_S3_ENDPOINT_URL") or None,
            registry_url=registry_url_of(env) or f"sqlite:///{home / 'registry.db'}",
            cache_dir=cache_dir,
            legacy_cache_dirs=tuple(p for p in legacy if p != cache_dir),
            registry_retry_s=_retry_s(env),
            origins=origins,
        )

    def variable(self, setting: str) -> str:
        """The variable a user changes to move *setting* (`home`, `cache_dir`, …)."""
        return {
            "home": "ENGINECTL_HOME", "store_url": "ENGINECTL_STORE_URL",
            "registry_url": "ENGINECTL_REGISTRY_URL", "cache_dir": "ENGINECTL_CACHE_DIR",
        }[setting]


def _retry_s(env: Mapping[str, str]) -> float:
    """ENGINECTL_REGISTRY_RETRY_S, a number of seconds >= 0 (default 30)."""
    raw = env.get("ENGINECTL_REGISTRY_RETRY_S", "").strip()
    if not raw:
        return REGISTRY_RETRY_DEFAULT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"ENGINECTL_REGISTRY_RETRY_S={raw!r} is not a number of seconds "
                          "(0 or more)", variable="ENGINECTL_REGISTRY_RETRY_S", value=raw)
    return value


def check_directory(path: Path, *, what: str, variable: str) -> Path:
    """*path*, when it is a directory or can become one; ConfigError naming *variable* when
    it, or a folder above it, is a file (or anything else that is not a directory)."""
    for candidate in (path, *path.parents):
        try:
            if candidate.is_dir():
                return path
            if candidate.exists() or candidate.is_symlink():
                raise ConfigError(
                    f"{what} {path} cannot be a directory: {candidate} is not one; "
                    f"point {variable} at a directory", variable=variable, value=str(path),
                )
        except OSError as exc:  # a permission denied on the way up
            raise ConfigError(f"{what} {path} cannot be used: {exc.strerror or exc}; "
                              f"check {variable}", variable=variable, value=str(path)) from exc
    return path
