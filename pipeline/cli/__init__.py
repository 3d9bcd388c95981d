"""The `enginectl` command line: parse, call one library function, print.

`base` holds the root group and the error handling; each module beside it adds its commands
to that group when imported. Heavy modules are imported inside commands so that
`enginectl --help` stays fast. `progress` is the rich progress bar, shown only on a terminal.

The top layer: may import every other part of `pipeline` and `registry`, and is the only
package that imports `click`; no other package imports it.
"""

from __future__ import annotations

import logging
import sys

import click

from pipeline.cli import (  # noqa: F401 - they register their commands
    advise,
    artifacts,
    build,
    deploy,
    fleet,
    info,
    maintenance,
    nightly,
)
from pipeline.cli.base import fail, is_closed_stdout, main, note, stdout_closed

__all__ = ["entry", "main"]


class _Notes(logging.Handler):
    """What the library logs at WARNING or above (a registry that does not answer yet) is a
    note on stderr, silenced by -q like the others."""

    def emit(self, record: logging.LogRecord) -> None:
        note(record.getMessage())


def entry() -> None:
    """The console script: click's own usage errors become one line and exit 2, too; a
    closed stdout (`enginectl plan … | head -n 3`) ends quietly with 0."""
    library = logging.getLogger("enginectl")
    library.addHandler(_Notes(logging.WARNING))
    library.propagate = False
    try:
        main.main(standalone_mode=False)
        sys.stdout.flush()  # a reader gone by now is met here, not at interpreter exit
    except click.exceptions.Abort:
        fail("interrupted", 130)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # usage errors know their command
        where = f"{ctx.command_path}: " if ctx is not None else ""
        fail(f"{where}{exc.format_message()} (see --help)", exc.exit_code)
    except OSError as exc:
        if not is_closed_stdout(exc):
            raise
        stdout_closed()
