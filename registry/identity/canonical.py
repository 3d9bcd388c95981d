"""Canonical JSON: the only input to any hash in enginectl.

Sorted keys, no whitespace, UTF-8, and no floats: a float's text form depends on the
writer, so numbers that are not integers must be written as strings by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

JsonValue = None | bool | int | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"]


def _check(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        raise TypeError(f"canonical JSON refuses floats: {path} = {value!r}; write it as a string")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON needs string keys: {path} has {key!r}")
            _check(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    raise TypeError(f"canonical JSON cannot encode {type(value).__name__} at {path}")


def canonical_json(value: Any) -> bytes:
    """Encode *value* as canonical JSON bytes (sorted keys, compact, UTF-8, no floats)."""
    _check(value, "$")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def floats_as_strings(value: Any) -> Any:
    """A copy of *value* with every float written as its shortest round-trip string."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return {key: floats_as_strings(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [floats_as_strings(item) for item in value]
    return value
