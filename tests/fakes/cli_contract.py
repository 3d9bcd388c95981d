"""Argument parsing for the stand-in TensorRT-LLM programs, from the real flag tables.

tests/data/cli/<tool>.json lists every flag the real program defines (read from its
source), with its arity, choices and value type. The stand-ins accept exactly those and
reject the rest the way argparse (and click, for trtllm-serve) does, with exit 2: an unknown
flag, a value outside the choices, and a value of the wrong type (`--workers abc` where the
real parser has `type=int`), so an argv enginectl emits that the real tool would refuse fails
here too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

TABLES = Path(__file__).resolve().parent.parent / "data" / "cli"


def _existing_path(value: str) -> str:
    if not Path(value).exists():
        raise argparse.ArgumentTypeError(f"Path '{value}' does not exist.")
    return value


# The table's value types, as the real parser converts (and so validates) them.
VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "path": _existing_path,
}


def table_of(tool: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TABLES / f"{tool}.json").read_text(encoding="utf-8"))
    return data


def parser_for(tool: str, prog: str) -> argparse.ArgumentParser:
    table = table_of(tool)
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    for positional in table.get("positional") or []:
        parser.add_argument(positional["name"].lower())
    seen: set[str] = set()
    for flag, spec in table["flags"].items():
        if flag in seen or not flag.startswith("-"):
            continue
        names = [flag, *[a for a in spec.get("aliases") or [] if a not in seen]]
        seen.update(names)
        kwargs: dict[str, Any] = {"dest": (spec.get("dest") or flag.lstrip("-")).replace("-", "_")}
        if spec.get("required"):  # the real parser's required=True
            kwargs["required"] = True
        if not spec.get("takes_value", True):
            kwargs["action"] = "store_true"
        else:
            choices = spec.get("choices")
            kind = spec.get("value_type") if spec.get("type") in ("choice", "enum") else spec.get(
                "type")
            if kind in VALUE_TYPES:
                kwargs["type"] = VALUE_TYPES[kind]
            if spec.get("type") == "enum":  # KVCacheType.from_string takes any case
                kwargs["type"] = str.lower
            if choices:
                kwargs["choices"] = [*choices, *(spec.get("value_aliases") or {})]
            if spec.get("nargs") in ("+", "*", "?"):
                kwargs["nargs"] = spec["nargs"]
            if spec.get("multiple"):
                kwargs["action"] = "append"
        parser.add_argument(*names, **kwargs)
    return parser


def parse(tool: str, prog: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The parsed flags as a dict of dest -> value (None where not given)."""
    return vars(parser_for(tool, prog).parse_args(argv))
