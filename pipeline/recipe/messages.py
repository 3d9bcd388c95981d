"""How a recipe error is worded: the field path (`matrix.shape[0].max_batch_size`), the YAML
line of a field, a bad value quoted short, and a pydantic `ValidationError` turned into one
`RecipeError` with a "did you mean" for a misspelt key. Pure."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.errors import RecipeError
from pipeline.recipe.fields import GOT_MAX
from pipeline.recipe.schema import Recipe
from registry.errors import did_you_mean


def one_line(text: object) -> str:
    """Messages are one line: third-party text (YAML marks, OS errors) may span several."""
    return " ".join(str(text).split())


def quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= GOT_MAX else text[: GOT_MAX - 1] + "…"



def line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The YAML line of the deepest node along *loc* (1-based), or None."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((kv for kv in node.value if str(kv[0].value) == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


_PLAIN_KEY = re.compile(r"[A-Za-z_][\w-]*")


def field_path(loc: tuple[int | str, ...]) -> str:
    """`matrix.shape[0].max_batch`; a key that is not a plain word is quoted: `smoke['a b']`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":  # pydantic's marker for an error in a mapping's key
            text += " (key)"
        elif not _PLAIN_KEY.fullmatch(part):
            text += f"[{quote(part)}]"
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def _known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed at *loc* (for "did you mean"), walking the pydantic models."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not _is_model(current):
            continue
        field = current.model_fields.get(part) or next(
            (f for f in current.model_fields.values() if f.alias == part), None
        )
        if field is None:
            return []
        current = _model_in(field.annotation)
    if _is_model(current):
        return [f.alias or name for name, f in current.model_fields.items()]
    return []


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


_KEY_ERRORS = ("extra_forbidden", "invalid_key")


def explain(path: Path, node: yaml.Node | None, exc: ValidationError) -> RecipeError:
    # A misspelt key comes first: it is what also makes the right key "missing".
    error = sorted(exc.errors(), key=lambda e: e["type"] not in _KEY_ERRORS)[0]
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        hint = did_you_mean(key, _known_keys(Recipe, parent))
        return RecipeError(
            path, f"unknown key {quote(key)}{hint}", field=field_path(loc),
            line=line_of(node, loc),
        )
    if kind == "invalid_key":
        return RecipeError(
            path, f"keys are strings, not {quote(error.get('input'))}",
            field=field_path(loc[:-1]), line=line_of(node, loc[:-1]),
        )
    if kind == "missing":
        return RecipeError(
            path, "required field is missing", field=field_path(loc), line=line_of(node, loc[:-1])
        )
    message = one_line(error["msg"].removeprefix("Value error, "))
    value = error.get("input")
    if kind.endswith("_type") or kind.startswith(("literal", "greater", "less", "too_")):
        message = f"{message} (got {quote(value)})"
    return RecipeError(path, message, field=field_path(loc), line=line_of(node, loc))

