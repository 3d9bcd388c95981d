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
    ENGINECTL_CACHE_DIR       fetch cache keyed by file digest (default: $XDG_CACHE_HOME/
                              enginectl, else ~/.cache/enginectl; its entries are under
                              `xxh3-128/`, beside the vLLM environment scripts/install-vllm
                              puts there). Without the variable, entries of the cache's old
                              place, <home>/cache, are still used (and moved over).

The environment is enough; nothing here is read from a file. `check_directory` is the one
check against the file system: a directory setting that names a file is refused in one line
naming the variable, before anything writes there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from registry.errors import ConfigError


def data_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("ENGINECTL_HOME"):
        return Path(env["ENGINECTL_HOME"]).expanduser()
    xdg = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "enginectl"


def cache_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/enginectl`, else `~/.cache/enginectl`: the fetch cache's default,
    shared with the vLLM environment that scripts/install-vllm makes there."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "enginectl"


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    home: Path
    store_url: str
    s3_endpoint_url: str | None
    registry_url: str
    cache_dir: Path
    legacy_cache_dirs: tuple[Path, ...] = ()
    """Older cache places whose entries are still used (moved into *cache_dir* on use)."""
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
            cache_dir = Path(env["ENGINECTL_CACHE_DIR"]).expanduser()
        else:
            cache_dir, legacy = cache_home(env), (home / "cache",)
        return cls(
            home=home,
            store_url=env.get("ENGINECTL_STORE_URL") or (home / "store").as_uri(),
            s3_endpoint_url=env.get("ENGINECTL_S3_ENDPOINT_URL") or None,
            registry_url=env.get("ENGINECTL_REGISTRY_URL") or f"sqlite:///{home / 'registry.db'}",
            cache_dir=cache_dir,
            legacy_cache_dirs=tuple(p for p in legacy if p != cache_dir),
            origins=origins,
        )

    def variable(self, setting: str) -> str:
        """The variable a user changes to move *setting* (`home`, `cache_dir`, …)."""
        return {
            "home": "ENGINECTL_HOME", "store_url": "ENGINECTL_STORE_URL",
            "registry_url": "ENGINECTL_REGISTRY_URL", "cache_dir": "ENGINECTL_CACHE_DIR",
        }[setting]


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
