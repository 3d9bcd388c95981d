"""The `enginectl` command line: parse, call one library function, print.

`base` holds the root group and the error handling; each module beside it adds its commands
to that group when imported. Heavy modules are imported inside commands so that
`enginectl --help` stays fast.
"""

from __future__ import annotations

import click

from pipeline.cli import artifacts, build, deploy, maintenance  # noqa: F401 - they register
from pipeline.cli.base import fail, main

__all__ = ["entry", "main"]


def entry() -> None:
    """The console script: click's own usage errors become one line and exit 2, too."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Abort:
        fail("interrupted", 130)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # usage errors know their command
        where = f"{ctx.command_path}: " if ctx is not None else ""
        fail(f"{where}{exc.format_message()} (see --help)", exc.exit_code)
