"""snapshot: pin the source checkpoint — a local directory, `hf://org/repo` at a commit, or an
`s3://` prefix — and refuse what would quantize garbage (Git LFS pointers, empty weights)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import BinaryIO

from pipeline.errors import StageError
from pipeline.recipe.reader import LoadedRecipe, local_source_dir
from pipeline.stages.hub import HubError, download

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def check_checkpoint(root: Path, key: str) -> None:
    """A checkpoint directory has config.json and real weights."""
    if not (root / "config.json").is_file():
        raise StageError("snapshot", key, f"{root} has no config.json")
    weights = [p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    if not weights:
        kinds = ", ".join(WEIGHT_SUFFIXES)
        raise StageError("snapshot", key, f"{root} has no weight files ({kinds})")
    for path in weights:
        size = path.stat().st_size
        if size == 0:
            raise StageError("snapshot", key, f"{path} is empty; refusing to build from it")
        with path.open("rb") as handle:
            if handle.read(len(LFS_POINTER)) == LFS_POINTER:
                raise StageError(
                    "snapshot", key,
                    f"{path} is a Git LFS pointer, not weights; run `git lfs pull` in the source",
                )


def snapshot(loaded: LoadedRecipe, revision: str | None, out_dir: Path, key: str, *,
             s3_endpoint_url: str | None = None) -> Path:
    """The directory holding the source checkpoint (a local source is used in place);
    *revision*: the commit planning pinned a remote source to; *s3_endpoint_url*: the
    S3-compatible endpoint of an `s3://` source (the registry's, from its Context)."""
    model = loaded.recipe.model
    if model.is_local:
        root = local_source_dir(loaded.recipe, loaded.base_dir)
    elif model.source.startswith("hf://"):
        repo = model.source.removeprefix("hf://")
        try:
            root = download(repo, revision, out_dir)
        except HubError as exc:
            raise StageError("snapshot", key, f"cannot download {model.source}@{revision}: "
                             f"{exc.kind}: {exc.detail}") from exc
    else:
        root = _download_s3(model.source, out_dir, key, s3_endpoint_url)
    check_checkpoint(root, key)
    return root


def _download_s3(url: str, out_dir: Path, key: str, endpoint_url: str | None) -> Path:
    """Every object under the `s3://` prefix *url*, through the registry's own S3 bucket
    (`registry.store.s3bucket.Bucket`, which translates boto3's errors where they enter)."""
    from registry.errors import RegistryError
    from registry.store.s3bucket import Bucket

    name, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    bucket = Bucket(name, store_url=url, endpoint_url=endpoint_url)
    try:
        for item in bucket.list(prefix):
            relative = str(item["Key"])[len(prefix):]
            if not relative or relative.endswith("/") or ".." in relative.split("/"):
                continue
            target = out_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as handle:
                bucket.read_into(str(item["Key"]), relative, partial(_write_at, handle))
    except RegistryError as exc:
        raise StageError("snapshot", key, f"cannot download {url}: {exc}") from exc
    return out_dir


def _write_at(handle: BinaryIO, offset: int, chunk: bytes) -> None:
    handle.seek(offset)
    handle.write(chunk)
