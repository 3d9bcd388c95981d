"""The `enginectl` command line: parse, call one library function, print.

Only this module catches errors. Exit codes: 0 ok, 2 bad usage or recipe, 3 a stage failed,
4 registry, store or integrity error, 5 smoke check failed, 1 anything unexpected
(`--traceback` shows the stack). Heavy modules are imported inside commands so that
`enginectl --help` stays fast.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from registry.errors import EnginectlError

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int) -> None:
    click.echo(f"enginectl: error: {message}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn enginectl errors into one line and an exit code; anything else into exit 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        show_traceback = bool(ctx.find_root().params.get("traceback"))
        try:
            return func(*args, **kwargs)
        except EnginectlError as exc:
            if show_traceback:
                traceback.print_exc()
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the one place that catches everything
            if show_traceback:
                traceback.print_exc()
            _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --traceback)", 1)
        return None

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--traceback", is_flag=True, help="Show the Python stack on errors.")
@click.version_option(package_name="enginectl")
def main(traceback: bool) -> None:
    """Turn a model recipe into TensorRT-LLM engines, quantized checkpoints and vLLM
    profiles, each proven to serve, stored by content and fetched by hash."""
    del traceback  # read through the context by handle_errors


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--commands", is_flag=True, help="Print the argv of every program it would run.")
@handle_errors
def plan(recipe: Path, as_json: bool, commands: bool) -> None:
    """Show what RECIPE would build, what it shares, and what fits; touches no GPU."""
    from pipeline.plan import plan_recipe
    from pipeline.recipe import load_recipe
    from pipeline.settings import Settings

    the_plan = plan_recipe(load_recipe(recipe), Settings.from_env())
    if as_json:
        click.echo(json.dumps(the_plan.as_dict(), indent=2))
    elif commands:
        import shlex

        for argv in the_plan.commands():
            click.echo(shlex.join(argv))
    else:
        from pipeline.report import print_plan

        print_plan(the_plan)


if __name__ == "__main__":
    main()
