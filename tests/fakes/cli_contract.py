"""Argument parsing for the stand-in TensorRT-LLM programs, from the real flag tables.

tests/data/cli/<tool>.json lists every flag the real program defines (read from its
source). The stand-ins accept exactly those, with their arity and choices, and reject the
rest the way argparse does (exit 2), so an argv enginectl emits that the real tool would
refuse fails here too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TABLES = Path(__file__).resolve().parent.parent / "data" / "cli"


def parser_for(tool: str, prog: str) -> argparse.ArgumentParser:
    table = json.loads((TABLES / f"{tool}.json").read_text(encoding="utf-8"))
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    for positional in table.get("positional") or []:
        parser.add_argument(positional["name"].lower())
    seen: set[str] = set()
    for flag, spec in table["flags"].items():
        if flag in seen or not flag.startswith("-"):
            continue
        names = [flag, *[a for a in spec.get("aliases") or [] if a not in seen]]
        seen.update(names)
        kwargs: dict[str, Any] = {"dest": flag.lstrip("-").replace("-", "_")}
        if not spec.get("takes_value", True):
            kwargs["action"] = "store_true"
        else:
            choices = spec.get("choices")
            if choices:
                kwargs["choices"] = [*choices, *(spec.get("value_aliases") or {})]
            if spec.get("nargs") in ("+", "*", "?"):
                kwargs["nargs"] = spec["nargs"]
        parser.add_argument(*names, **kwargs)
    return parser
