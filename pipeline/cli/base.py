"""What every `enginectl` command shares: the root group, error handling, JSON output.

Commands live in the modules beside this one, grouped by what they act on (`build`:
recipes and stage chains; `artifacts`: the registry and store verbs a user or deploy tool
calls; `maintenance`: fsck, gc, reindex and the schema; `info`: this machine's setup). Only
the CLI catches errors; each carries its exit code (`EXIT_CODES`, shown by `--help`), and
`--traceback` shows the stack. A closed stdout (`| head`) ends a command quietly with 0.
Heavy modules are imported inside commands so that `enginectl --help` stays fast.
Commands that only read the registry open it with `context(readonly=True)`: they never
create or migrate one.

Every command gets `-q/--quiet` and `-v/--verbose` from the root group (`EnginectlGroup`),
read back with `verbosity()`; `note` and `detail` print the informational lines they govern.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, Final, NoReturn, TypeVar

import click

from registry.errors import EnginectlError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES: Final = (
    (0, "ok"),
    (1, "unexpected error (one line; --traceback shows the stack)"),
    (2, "bad usage, recipe or setting (ENGINECTL_*)"),
    (3, "a stage failed, or this machine cannot run it (GPU SKU, GPU count, runtime)"),
    (4, ("registry, store or integrity error (unreachable, missing, damaged, a `deleted` "
         "artifact), or a full disk (naming the path)")),
    (5, "a smoke check failed, a regression held an alias, or a toolchain regression"),
    (6, "not found: no such alias, ref or model in the registry"),
    (130, "interrupted (Ctrl-C)"),
)
"""What a script can branch on; the root group's --help prints it, README.md has the same."""

QUIET: Final = -1
NORMAL: Final = 0
VERBOSE: Final = 1
_VERBOSITY: Final = "enginectl.verbosity"


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr and the exit code (a closed stderr loses the line, not the code)."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(f"enginectl: error: {message}", err=True)
    sys.exit(code)


def stdout_closed() -> NoReturn:
    """The reader of stdout went away (`enginectl … | head`): stop quietly, status 0.

    What was written is what the reader wanted. stdout is pointed at /dev/null so that the
    interpreter's own flush at exit cannot fail a second time."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)


def is_closed_stdout(exc: BaseException) -> bool:
    """Whether *exc* is a write to a stdout whose reader is gone (not, say, a server that
    closed a socket: that is the command's business)."""
    if not isinstance(exc, OSError) or exc.errno != errno.EPIPE:
        return False
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP)
                   for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll, or stdout already closed
        return True


def verbosity() -> int:
    """QUIET (-q), NORMAL or VERBOSE and above (-v, -vv) for the command running now."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return NORMAL
    level: int = ctx.find_root().meta.get(_VERBOSITY, NORMAL)
    return level


def note(message: str) -> None:
    """An informational line on stderr (`enginectl: note: …`); silenced by -q."""
    if verbosity() > QUIET:
        click.echo(f"enginectl: note: {message}", err=True)


def detail(message: str) -> None:
    """A line of detail on stderr, shown only with -v."""
    if verbosity() >= VERBOSE:
        click.echo(message, err=True)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if not value:
        return
    meta = ctx.find_root().meta
    level = QUIET if param.name == "quiet" else int(value)
    previous = meta.get(_VERBOSITY, NORMAL)
    if (previous < NORMAL < level) or (level < NORMAL < previous):
        raise click.UsageError("-q/--quiet and -v/--verbose contradict each other; pick one",
                               ctx=ctx)
    meta[_VERBOSITY] = min(previous, level) if level < NORMAL else max(previous, level)


def common_options() -> list[click.Option]:
    """-q/--quiet and -v/--verbose, as every command takes them."""
    return [
        click.Option(["-q", "--quiet"], is_flag=True, expose_value=False,
                     callback=_set_verbosity,
                     help="Print only results and errors: no progress, no notes."),
        click.Option(["-v", "--verbose"], count=True, expose_value=False,
                     callback=_set_verbosity,
                     help="Print more detail (log paths and tails, timings); repeatable."),
    ]


def _with_common_options(command: click.Command) -> click.Command:
    names = {name for param in command.params for name in getattr(param, "opts", ())}
    if "--quiet" not in names:
        command.params.extend(common_options())
    return command


class EnginectlCommand(click.Command):
    """A command with -q/-v."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _with_common_options(self)


class EnginectlGroup(click.Group):
    """A group whose commands, and groups, all take -q/-v (so no command declares them)."""

    command_class = EnginectlCommand
    group_class = type  # `@group.group()` makes an EnginectlGroup too

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _with_common_options(self)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(_with_common_options(cmd), name)


class ModelName(click.ParamType[str]):
    """`--model`: a model's name as recipes call it; never empty."""

    name = "MODEL"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail(f"{text!r} is empty; give the model's name as its recipe names it "
                      "(model.name, e.g. llama-3.3-70b-instruct)", param, ctx)
        return text


MODEL: Final = ModelName()


class Ref(click.ParamType[str]):
    """REF: a digest, a digest prefix or an alias (`registry.identity.refs.check_ref`),
    checked as the command line is parsed: a malformed one is exit 2, before anything is
    opened; with *keys*, a stage key (`k1:…`) too."""

    name = "REF"

    def __init__(self, *, keys: bool = False) -> None:
        self.keys = keys

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from registry.errors import UsageError
        from registry.identity.refs import check_ref

        text = str(value)
        if self.keys and text.startswith("k1:"):
            return text
        try:
            return check_ref(text)
        except UsageError as exc:
            self.fail(str(exc) + (", or a stage key (k1:…)" if self.keys else ""), param, ctx)


REF: Final = Ref()


class AliasName(click.ParamType[str]):
    """ALIAS: an alias name (`registry.identity.refs.check_alias_name`), checked as the
    command line is parsed."""

    name = "ALIAS"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from registry.errors import UsageError
        from registry.identity.refs import check_alias_name

        try:
            return check_alias_name(str(value))
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


ALIAS: Final = AliasName()


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
                import traceback  # only for --traceback: not on every start-up

                traceback.print_exc()
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except click.exceptions.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - the one place that catches everything
            if is_closed_stdout(exc):
                stdout_closed()
            if show_traceback:
                import traceback  # only for --traceback: not on every start-up

                traceback.print_exc()
            fail(f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())} "
                 "(rerun with --traceback)", 1)

    return wrapper  # type: ignore[return-value]


def echo_json(value: Any) -> None:
    """Indented for a person at a terminal; compact (and several times faster to write,
    through json's C encoder) for the programs that read `--json`."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(value, indent=indent, default=str))


@click.group(cls=EnginectlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--traceback", is_flag=True, help="Show the Python stack on errors.")
@click.version_option(package_name="enginectl", help="Show enginectl's version and exit.")
def main(traceback: bool) -> None:
    """Turn a model recipe into TensorRT-LLM engines, quantized checkpoints and vLLM
    profiles, each proven to serve, stored by content and fetched by hash.

    \b
    Examples:
      enginectl plan recipes/llama70b-h100.yaml      # what a build would do
      enginectl build recipes/tiny-llama-cpu.yaml    # build, publish and smoke-test
      enginectl info                                 # where things are, what runs here
      enginectl -q fetch llama70b/h100/prod -o /models/llama70b

    \b
    Exit codes:
      {exit_codes}
    """
    del traceback  # read through the context by handle_errors


main.help = (main.help or "").replace(  # the table is kept once, in EXIT_CODES
    "{exit_codes}", "\n      ".join(f"{code:<5}{meaning}" for code, meaning in EXIT_CODES))


def context(*, readonly: bool = False) -> Any:
    """The registry context (store, SQL registry, cache) from the environment; *readonly*
    for a command that only reads the registry (it is never created or migrated)."""
    from registry.context import Context

    return Context(readonly=readonly)


def announce(ctx: Any) -> None:
    """One stderr line naming the store and registry a command uses (silenced by -q), said
    when its work begins (`Context.begin`): input it refuses stays a one-line error."""
    from registry.config import masked_url

    def say() -> None:
        note(f"using store {ctx.config.store_url} and registry "
             f"{masked_url(ctx.config.registry_url)}")

    ctx.on_begin = say


def progress() -> Any:
    """A progress bar on stderr at a terminal; nothing otherwise, or with -q."""
    from pipeline.cli.progress import terminal_progress
    from registry.progress import NoProgress

    return NoProgress() if verbosity() <= QUIET else terminal_progress()
