"""Commands on a Ray cluster of GPU pools: fleet."""

from __future__ import annotations

import click

from pipeline.cli.base import echo_json, handle_errors, main

ADDRESS_HELP = "The Ray cluster: auto, HOST:6379, or ray://HEAD:10001 (default $RAY_ADDRESS)."


@main.command()
@click.option("--address", envvar="RAY_ADDRESS", default="auto", show_default=True,
              help=ADDRESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the pools as JSON.")
@handle_errors
def fleet(address: str, as_json: bool) -> None:
    """The pools a Ray cluster has: per GPU SKU its nodes, GPUs total and free, the last
    probed toolchain and when, and the groups of nodes that probing found when they differ
    (a rolling driver upgrade: each group builds and smokes its own keys); the CPU nodes;
    the Ray and enginectl versions.

    \b
    Examples:
      enginectl fleet                                # RAY_ADDRESS, else a local cluster
      enginectl fleet --address ray://head:10001 --json
    """
    from pipeline.executors.fleet import fleet as read_fleet
    from pipeline.executors.fleet import fleet_lines
    from registry.context import Context

    with Context() as ctx:
        info = read_fleet(address, ctx=ctx)
    if as_json:
        echo_json(info)
    else:
        click.echo("\n".join(fleet_lines(info)))
