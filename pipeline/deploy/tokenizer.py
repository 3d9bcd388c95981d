"""Where an engine's tokenizer directory comes from: the engine's own `tokenizer/`, or for
one published before engines carried it, the hf-checkpoint its provenance reaches
(`pipeline.deploy.pull` places it; `pipeline.serving.smoke_here` smokes with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.identity.manifest import FileEntry, Manifest
from registry.ops.fetch import cached_manifest, lazy_store
from registry.tokenizer import carries_tokenizer, tokenizer_entries, under_tokenizer_dir

if TYPE_CHECKING:
    from registry.context import Context


@dataclass(frozen=True)
class Tokenizer:
    """Where an engine's tokenizer directory comes from: its own files (*source* None), or
    *files* (under `tokenizer/`) of the hf-checkpoint *source* in its provenance."""

    files: tuple[FileEntry, ...] = ()
    source: str | None = None


def engine_tokenizer(ctx: Context, manifest: Manifest, *, depth: int = 4) -> Tokenizer | None:
    """Where *manifest*'s tokenizer directory comes from (`Tokenizer`), None when neither it
    nor the hf-checkpoints its provenance reaches within *depth* steps hold an HF config."""
    if carries_tokenizer(manifest):
        return Tokenizer()
    level, seen = list(manifest.inputs), set()
    for _ in range(depth):
        following: list[str] = []
        for digest in level:
            if digest in seen:
                continue
            seen.add(digest)
            source = cached_manifest(lazy_store(ctx), ctx.cache, digest)
            entries = tokenizer_entries(source) if source.kind == "hf-checkpoint" else None
            if entries is not None:
                return Tokenizer(under_tokenizer_dir(entries), str(source.digest))
            following += source.inputs
        level = following
    return None
