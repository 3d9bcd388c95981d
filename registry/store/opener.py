"""Opening a store from its URL: the one module that knows both backends.

    file:///abs/path       `registry.store.filestore.FileStore`
    s3://bucket/prefix     `registry.store.s3store.S3Store`

The backends are imported only when a store is opened, so checking a URL (and `--help`)
never imports boto3.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from registry.errors import ConfigError, StoreError
from registry.store.base import Store


def check_endpoint_url(url: str) -> str:
    """*url* when it is an http(s) endpoint (`http://host:port`); ConfigError otherwise."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok \
            or parts.query or parts.fragment:
        raise ConfigError(
            f"ENGINECTL_S3_ENDPOINT_URL {url!r} is not an endpoint URL: expected "
            "http(s)://host[:port], e.g. http://127.0.0.1:9000 (unset it for AWS)",
            variable="ENGINECTL_S3_ENDPOINT_URL", value=url,
        )
    return url


def open_store(url: str, *, s3_endpoint_url: str | None = None) -> Store:
    """Open the store at *url* (`file:///abs/path` or `s3://bucket/prefix`).

    Nothing is contacted or created here; the first operation does that."""
    where = check_store_url(url, s3_endpoint_url=s3_endpoint_url)
    if isinstance(where, Path):
        from registry.store.filestore import FileStore

        return FileStore(where)
    from registry.store.s3store import S3Store

    bucket, prefix = where
    return S3Store(bucket, prefix, endpoint_url=s3_endpoint_url)


def check_store_url(url: str, *, s3_endpoint_url: str | None = None) -> Path | tuple[str, str]:
    """What `open_store` would open: a `file://` store's folder, or an S3 store's (bucket,
    prefix); StoreError or ConfigError as `open_store` raises them. Pure: nothing is
    imported or contacted, so a command that may never need its store (a refetch from the
    cache) still refuses a bad setting first."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise StoreError(f"store URL {url!r} must not have a query or fragment", url=url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreError(
                f"store URL {url!r} names host {parts.netloc!r}; use file:///absolute/path",
                url=url,
            )
        root = Path(unquote(parts.path))
        if not parts.path or not root.is_absolute():
            raise StoreError(f"store URL {url!r} needs an absolute path: file:///path", url=url)
        return root
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StoreError(f"store URL {url!r} has no bucket: s3://bucket/prefix", url=url)
        if s3_endpoint_url is not None:
            check_endpoint_url(s3_endpoint_url)
        return parts.netloc, unquote(parts.path)
    raise StoreError(
        f"unknown store URL scheme {parts.scheme!r} in {url!r}; "
        "use file:///absolute/path or s3://bucket/prefix (ENGINECTL_STORE_URL)",
        url=url,
    )
