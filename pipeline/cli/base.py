"""What every `enginectl` command shares: the root group, error handling, JSON output.

Commands live in the modules beside this one, grouped by what they act on (`build`:
recipes and stage chains; `artifacts`: the registry and store verbs a user or deploy tool
calls; `maintenance`: fsck, gc, reindex and the schema). Only the CLI catches errors.
Exit codes: 0 ok, 2 bad usage or recipe, 3 a stage failed, 4 registry, store or integrity
error, 5 smoke check failed, 1 anything unexpected (`--traceback` shows the stack).
Heavy modules are imported inside commands so that `enginectl --help` stays fast.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from registry.errors import EnginectlError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int) -> None:
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
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the one place that catches everything
            if show_traceback:
                traceback.print_exc()
            fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --traceback)", 1)
        return None

    return wrapper  # type: ignore[return-value]


def echo_json(value: Any) -> None:
    """Indented for a person at a terminal; compact (and several times faster to write,
    through json's C encoder) for the programs that read `--json`."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(value, indent=indent, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--traceback", is_flag=True, help="Show the Python stack on errors.")
@click.version_option(package_name="enginectl")
def main(traceback: bool) -> None:
    """Turn a model recipe into TensorRT-LLM engines, quantized checkpoints and vLLM
    profiles, each proven to serve, stored by content and fetched by hash."""
    del traceback  # read through the context by handle_errors




def context() -> Any:
    """The registry context (store, SQL registry, cache) from the environment."""
    from registry.context import Context

    return Context()


def progress() -> Any:
    """A progress bar on stderr at a terminal; nothing otherwise."""
    from pipeline.progress import terminal_progress

    return terminal_progress()
