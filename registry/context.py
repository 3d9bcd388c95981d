"""The handles every registry verb works with: store, SQL registry and fetch cache.

Opened lazily from `RegistryConfig`, so a command that needs only the store never opens the
database, and nothing heavy is imported until it is used. A directory setting that names a
file (ENGINECTL_HOME, ENGINECTL_CACHE_DIR) is refused when the handle that needs it opens.
A context manager, for deploy tools:

    with Context() as ctx:          # from the environment, like the CLI
        pull(ctx, "llama70b/h100/prod", "/models")

`Context(readonly=True)` is for verbs that only read the registry (ls, show, resolve, pull,
compare, logs): its registry is opened with `open_registry(readonly=True)`, which never
creates or migrates one and refuses a missing, behind or newer one in one line. What reads
on the database driver alone (resolve) uses `Context.reader`, one connection held until
`close`, refused in the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING

from registry.config import RegistryConfig, check_directory
from registry.store.cache import BlobCache

if TYPE_CHECKING:
    from registry.sql.db import Registry
    from registry.sql.held import HeldReader
    from registry.store.base import Store


@dataclass
class Context:
    config: RegistryConfig = field(default_factory=RegistryConfig.from_env)
    readonly: bool = False
    """Open the SQL registry for reading only (see the module doc)."""
    on_begin: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    """Called once, when a verb's input has been checked and its work on the store begins
    (the CLI names the store and registry then, so a refused input stays one line)."""

    def begin(self, *, store: bool = True, registry: bool = False) -> None:
        """A verb has checked its input and starts its work: open the store (unless not
        *store*: a cache hit never opens it, but its settings are checked all the same) and,
        with *registry*, the SQL registry, so that a bad setting is refused first; then call
        `on_begin`, once."""
        if store:
            self.store  # noqa: B018 - opening it checks ENGINECTL_STORE_URL and the home
        elif "store" not in self.__dict__:
            self.check_store()
        if registry:
            self.registry  # noqa: B018 - opening it checks the database (damaged, behind)
        hook, self.on_begin = self.on_begin, None
        if hook is not None:
            hook()

    @cached_property
    def store(self) -> Store:
        from registry.store.opener import open_store

        self._check_home_unless_set("store_url")
        return open_store(self.config.store_url, s3_endpoint_url=self.config.s3_endpoint_url)

    def check_store(self) -> None:
        """The store's settings as `store` checks them, without opening it (no boto3)."""
        from registry.store.opener import check_store_url

        self._check_home_unless_set("store_url")
        check_store_url(self.config.store_url, s3_endpoint_url=self.config.s3_endpoint_url)

    @cached_property
    def registry(self) -> Registry:
        from registry.sql.db import open_registry

        self._check_home_unless_set("registry_url")
        return open_registry(self.config.registry_url, readonly=self.readonly,
                             retry_s=self.config.registry_retry_s)

    @cached_property
    def reader(self) -> HeldReader:
        """The SQL registry read on its database driver alone, no SQLAlchemy: one connection
        held until `close` (`registry.sql.held`), for the reads that run there (resolve's,
        `registry.sql.resolving`). A registry not at the schema head is refused as `registry`
        refuses it with *readonly*; without *readonly*, `registry` is opened first, which
        creates or migrates it as before."""
        from registry.sql.held import HeldReader

        if not self.readonly:
            self.registry  # noqa: B018 - creates or migrates it, as before
        else:
            self._check_home_unless_set("registry_url")
        return HeldReader(self.config.registry_url, self.config.registry_retry_s)

    @cached_property
    def cache(self) -> BlobCache:
        check_directory(self.config.cache_dir, what="the fetch cache",
                        variable="ENGINECTL_CACHE_DIR")
        return BlobCache(self.config.cache_dir, self.config.legacy_cache_dirs)

    def _check_home_unless_set(self, setting: str) -> None:
        """The default store and registry live in the home: it must be a directory when
        *setting* (store_url, registry_url) is not set by its ENGINECTL_ variable."""
        if f"ENGINECTL_{setting.upper()}" not in self.config.origins.get(setting, ""):
            check_directory(self.config.home, what="enginectl's home",
                            variable="ENGINECTL_HOME")

    def close(self) -> None:
        """Close the registry's connections, if it was opened (idempotent)."""
        if "reader" in self.__dict__:
            self.__dict__.pop("reader").close()
        if "registry" in self.__dict__:
            self.registry.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
