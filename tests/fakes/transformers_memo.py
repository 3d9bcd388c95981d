"""What transformers answered for a tokenizer and a model config, remembered by content.

The trtllm-serve stand-in loads a tokenizer (AutoTokenizer) and a model config
(PretrainedConfig.get_config_dict, then AutoConfig) with transformers before it listens, as
the real server does. Importing transformers is ~1 CPU-s of each start, and the suite starts
the stand-in ~350 times on a handful of distinct tokenizer and config files.

With FAKE_TRTLLM_MEMO=DIR, a load that succeeded is remembered in DIR under a key of
everything its answer depends on:
- the transformers version of the Python that loaded it, and the load's options;
- which directory was read for the tokenizer and which for the config (the same one or not);
- the name and bytes of every file at the top of those directories, except weights and
  engines (*.safetensors, *.bin, *.engine, *.pt, *.pth: AutoTokenizer and AutoConfig open
  none of them; they read config.json, tokenizer*.json, special_tokens_map.json, vocabulary
  and chat-template files).
A load whose answer may depend on where the files are is never remembered: when config.json
names no model_type (and, for the tokenizer, tokenizer_config.json no tokenizer_class),
AutoConfig and AutoTokenizer fall back to model names found in the path
(configuration_auto.py's AutoConfig.from_pretrained, tokenization_auto.py's
AutoTokenizer.from_pretrained). A later start with the same key answers as that load did (the
model_type it printed) without importing transformers, and loads the tokenizer itself, with
transformers, on first use (a chat request renders with it). The answer is a function of the
key, so it is the answer a fresh load would give. A load that failed is never remembered: a
directory that does not load fails on every start, through transformers. The same holds one
level down: a chat request rendered by the tokenizer of a remembered load is remembered under
that load's key, the request as sent and the jinja2 version (`question`), so the same request
to the same files later answers without loading the tokenizer (~0.8 CPU-s), and a rendering
that failed (no chat template, a template error) fails through transformers every time.
Without FAKE_TRTLLM_MEMO nothing is remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOT_READ = (".safetensors", ".bin", ".engine", ".pt", ".pth")


def _files(directory: Path) -> list[list[str]]:
    """Name and sha256 of each file at the top of *directory* that transformers may read."""
    found = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file() and not entry.name.endswith(NOT_READ):
            found.append([entry.name, hashlib.sha256(Path(entry.path).read_bytes()).hexdigest()])
    return found


def _typed(directory: Path, *, tokenizer: bool) -> bool:
    """Whether transformers learns what *directory* holds from its files alone: config.json
    names a model_type, or (for a tokenizer) tokenizer_config.json names its class."""
    wanted = {"config.json": "model_type"}
    if tokenizer:
        wanted["tokenizer_config.json"] = "tokenizer_class"
    for name, field in wanted.items():
        try:
            data = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get(field):
            return True
    return False


def key(version: str, options: dict[str, Any], tokenizer_dir: str, config_dir: str) -> str | None:
    """The key of a load from these directories; None when one is not a local directory (a
    hub id is never remembered) or its answer may depend on its path (module doc)."""
    if not (Path(tokenizer_dir).is_dir() and Path(config_dir).is_dir()):
        return None
    if not (_typed(Path(tokenizer_dir), tokenizer=True)
            and _typed(Path(config_dir), tokenizer=False)):
        return None
    same = Path(tokenizer_dir).resolve() == Path(config_dir).resolve()
    parts = {"transformers": version, "options": options, "same_dir": same,
             "tokenizer": _files(Path(tokenizer_dir)),
             "config": None if same else _files(Path(config_dir))}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def question(memo_key: str | None, asked: dict[str, Any]) -> str | None:
    """The key of a question asked of a remembered load (a chat request to render): the
    load's key and the question as given (its keys in their order). None without a load key."""
    if memo_key is None:
        return None
    return hashlib.sha256(json.dumps([memo_key, asked]).encode()).hexdigest()


def recall(memo_dir: str | None, memo_key: str | None) -> dict[str, Any] | None:
    """The answer remembered under *memo_key*, or None."""
    if not memo_dir or memo_key is None:
        return None
    try:
        answer: dict[str, Any] = json.loads((Path(memo_dir) / f"{memo_key}.json").read_text())
    except (OSError, ValueError):
        return None
    return answer


def remember(memo_dir: str | None, memo_key: str | None, answer: dict[str, Any]) -> None:
    """Keep *answer* under *memo_key* (written whole: a reader never sees half of it)."""
    if not memo_dir or memo_key is None:
        return
    Path(memo_dir).mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=memo_dir, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        json.dump(answer, out)
    Path(tmp).replace(Path(memo_dir) / f"{memo_key}.json")


class LoadedOnUse:
    """A tokenizer loaded by *load* the first time one of its attributes is asked for."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._loaded: Any = None
        self._lock = threading.Lock()  # the server answers requests on threads

    def __getattr__(self, name: str) -> Any:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load()
        return getattr(self._loaded, name)
