"""Where the store, the registry and the caches are, from the environment.

    ENGINECTL_HOME            data directory (default: $XDG_DATA_HOME/enginectl,
                              else ~/.local/share/enginectl)
    ENGINECTL_STORE_URL       file:///path or s3://bucket/prefix (default: file://<home>/store)
    ENGINECTL_S3_ENDPOINT_URL an S3-compatible endpoint (MinIO, R2, Ceph, a test server);
                              credentials and region come from the standard AWS variables/profiles
    ENGINECTL_REGISTRY_URL    SQLAlchemy URL (default: sqlite:///<home>/registry.db);
                              PostgreSQL: postgresql+psycopg://user@host/db
    ENGINECTL_CACHE_DIR       fetch cache keyed by file digest (default: <home>/cache)

The environment is enough; nothing here is read from a file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def data_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("ENGINECTL_HOME"):
        return Path(env["ENGINECTL_HOME"]).expanduser()
    xdg = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "enginectl"


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    home: Path
    store_url: str
    s3_endpoint_url: str | None
    registry_url: str
    cache_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistryConfig:
        env = os.environ if env is None else env
        home = data_home(env)
        return cls(
            home=home,
            store_url=env.get("ENGINECTL_STORE_URL") or (home / "store").as_uri(),
            s3_endpoint_url=env.get("ENGINECTL_S3_ENDPOINT_URL") or None,
            registry_url=env.get("ENGINECTL_REGISTRY_URL") or f"sqlite:///{home / 'registry.db'}",
            cache_dir=Path(env.get("ENGINECTL_CACHE_DIR") or home / "cache").expanduser(),
        )
