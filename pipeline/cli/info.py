"""`enginectl info`: where things are on this machine, whether they answer, what runs here."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.base import VERBOSE, echo_json, handle_errors, main, verbosity


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the same as JSON.")
@handle_errors
def info(as_json: bool) -> None:
    """Show home, store, registry, cache and work directory (and the variable or default
    each came from), the registry's schema, whether the store and registry answer, and the
    runtimes found here (vLLM's Python and its vllm, trtllm-serve, trtllm-build, nvidia-smi).
    Exits 4 when the store or registry does not answer.

    \b
    Examples:
      enginectl info
      ENGINECTL_REGISTRY_URL=postgresql+psycopg://me@db/enginectl enginectl info --json
    """
    from pipeline.info import info as gather
    from registry.errors import RegistryError

    found = gather()
    if as_json:
        echo_json(found.as_dict())
    else:
        click.echo("\n".join(_lines(found, verbose=verbosity() >= VERBOSE)))
    failed = [name for name, reach in (("store", found.store), ("registry", found.registry))
              if not reach.ok]
    if failed:
        name = failed[0]
        reach = found.store if name == "store" else found.registry
        variable = "ENGINECTL_STORE_URL" if name == "store" else "ENGINECTL_REGISTRY_URL"
        raise RegistryError(f"the {name} does not answer: {reach.detail}; check {variable}")


def _lines(found: Any, *, verbose: bool) -> list[str]:
    names = [loc.name for loc in found.locations] + [r.name for r in found.runtimes]
    width = max(len(name) for name in names) + 2
    lines = [f"{loc.name:<{width}}{loc.value}  ({loc.source})" for loc in found.locations]
    schema = found.schema
    if schema.get("head"):
        lines.append(f"{'schema':<{width}}{schema.get('revision') or 'none yet'} "
                     f"(this enginectl: {schema['head']})")
    for name, reach in (("store", found.store), ("registry", found.registry)):
        lines.append(f"{name + '?':<{width}}{'ok' if reach.ok else 'FAIL'}: {reach.detail}")
    for runtime in found.runtimes:
        if runtime.path is None:
            text = f"- ({runtime.detail})"
        else:
            text = f"{runtime.version or ''} {runtime.path}".strip()
            if runtime.detail and (verbose or runtime.name in ("vllm", "nvidia-smi")):
                text += f"  ({runtime.detail})"
        lines.append(f"{runtime.name:<{width}}{text}")
    return lines
