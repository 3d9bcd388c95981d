"""An engine's tokenizer directory: what it holds and where its files come from. Pure.

trtllm-serve loads the model config (transformers' AutoConfig) and the tokenizer from its
`--tokenizer` path, so a compiled engine is served with a directory holding the source
model's HF `config.json`, its tokenizer files and chat template. An engine carries it as
`tokenizer/` (the build copies it from the HF snapshot through convert or quantize; `import
--tokenizer-from` adds it); for an engine published before that, pull takes the files of the
hf-checkpoint in its provenance.
"""

from __future__ import annotations

from typing import Final

from registry.identity.manifest import FileEntry, Manifest

TOKENIZER_DIR: Final = "tokenizer"
HF_CONFIG: Final = "config.json"
# What a tokenizer directory holds besides the HF config.json.
TOKENIZER_FILES: Final = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja",
)


def carries_tokenizer(manifest: Manifest) -> bool:
    """Whether *manifest* holds `tokenizer/config.json` (an engine that carries its own)."""
    own = f"{TOKENIZER_DIR}/{HF_CONFIG}"
    return any(entry.path == own for entry in manifest.files)


def tokenizer_entries(manifest: Manifest) -> tuple[FileEntry, ...] | None:
    """The files of *manifest*'s tokenizer directory, with paths relative to it: an engine's
    `tokenizer/` files, or an hf-checkpoint's config.json and tokenizer files. None when it
    has neither (no HF config.json where it would be)."""
    if carries_tokenizer(manifest):
        prefix = f"{TOKENIZER_DIR}/"
        return tuple(FileEntry(entry.path.removeprefix(prefix), entry.size, entry.xxh3,
                               entry.sha256)
                     for entry in manifest.files if entry.path.startswith(prefix))
    names = {entry.path for entry in manifest.files}
    if manifest.kind != "hf-checkpoint" or HF_CONFIG not in names:
        return None
    wanted = (HF_CONFIG, *TOKENIZER_FILES)
    return tuple(entry for entry in manifest.files if entry.path in wanted)


def under_tokenizer_dir(entries: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
    """*entries* placed under `tokenizer/`."""
    return tuple(FileEntry(f"{TOKENIZER_DIR}/{entry.path}", entry.size, entry.xxh3,
                           entry.sha256) for entry in entries)
