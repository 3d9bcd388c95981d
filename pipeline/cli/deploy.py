"""Commands that put an artifact on a serving node: pull and serve."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pipeline.cli.base import (
    MODEL,
    REF,
    announce,
    context,
    echo_json,
    handle_errors,
    main,
    note,
    progress,
)

F = TypeVar("F", bound=Callable[..., Any])


def _selection_options(func: F) -> F:
    """What pull and serve share: REF, or --model and what resolve needs for this node."""
    options = [
        click.argument("ref", type=REF, required=False),
        click.option("--model", type=MODEL,
                     help="Resolve for this node instead of naming a REF."),
        click.option("--gpu", default="auto", show_default=True,
                     help="This node's GPU SKU, or 'auto' to read nvidia-smi (with --model)."),
        click.option("--gpus", "gpu_count", type=click.IntRange(min=1),
                     help="GPUs on the node (auto: counted)."),
        click.option("--min-seq-len", type=click.IntRange(min=1),
                     help="Only artifacts whose max_seq_len is at least this (with --model)."),
        click.option("--min-batch", type=click.IntRange(min=1),
                     help="Only artifacts whose max_batch_size is at least this (with --model)."),
        click.option("--prefer", multiple=True,
                     type=click.Choice(["engine", "checkpoint", "vllm"]),
                     help="Kinds to try first, in order (repeatable)."),
        click.option("--host", default="0.0.0.0", show_default=True,  # noqa: S104 - a deploy node
                     help="Where the server listens."),
        click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True,
                     help="The port the server listens on."),
        click.option("--executable",
                     help="The runtime program to write (a Python with vLLM, or trtllm-serve) "
                          "instead of the one found here."),
        click.option("--allow-unready", is_flag=True,
                     help="Take a REF that is built or quarantined, not proven to serve."),
        click.option("--allow-unproven", is_flag=True,
                     help="With --model: take an artifact proven only on another GPU (or "
                          "none); serve.json then says `unproven on <SKU>`."),
        click.option("--no-warm", "no_warm", is_flag=True,
                     help="Leave out the warm cache (compile and tuning caches) captured for "
                          "this node: the runtime starts cold."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _check(ref: str | None, model: str | None, gpu: str, allow_unproven: bool = False) -> None:
    from registry.errors import UsageError

    if ref is None and model is None:
        raise UsageError("give a REF (digest, prefix or alias) or --model MODEL")
    if ref is not None and model is not None:
        raise UsageError(f"give a REF or --model, not both (REF {ref!r}, --model {model!r})")
    if ref is not None and gpu != "auto":
        raise UsageError(f"--gpu {gpu!r} is for --model; a REF names one artifact already")
    if ref is not None and allow_unproven:
        raise UsageError("--allow-unproven is for --model; a REF names one artifact already "
                         "(an alias takes its latest target proven on this node's toolchain)")


def _notes(notes: tuple[str, ...]) -> None:
    for line in notes:
        note(line)


@main.command()
@_selection_options
@click.option("-o", "--output", "output", required=True,
              type=click.Path(path_type=Path, file_okay=False), help="Target directory.")
@click.option("--verify", type=click.Choice(["fast", "strict"]), default="fast",
              show_default=True, help="strict adds sha256 to xxh3-128.")
@click.option("--force", is_flag=True,
              help="Replace a directory an earlier fetch filled too (an earlier pull is "
                   "replaced without it); never one holding files enginectl did not write.")
@click.option("--json", "as_json", is_flag=True, help="Print what was pulled as JSON.")
@handle_errors
def pull(ref: str | None, model: str | None, gpu: str, gpu_count: int | None,
         min_seq_len: int | None, min_batch: int | None, prefer: tuple[str, ...], host: str,
         port: int, executable: str | None, allow_unready: bool, allow_unproven: bool,
         no_warm: bool, output: Path, verify: str, force: bool, as_json: bool) -> None:
    """Fetch REF, or what this node should serve of --model, with everything it serves from,
    into a directory; write its serve.json and print the command that serves it here.

    \b
    Examples:
      enginectl pull --model llama-3.3-70b-instruct --gpu auto -o /models
      enginectl pull llama70b/h100/prod -o /models --port 9000 --json
      enginectl pull --model tiny-llama --gpu cpu -o ./served   # then run what it prints
    """
    from pipeline.deploy.pull import PullOptions
    from pipeline.deploy.pull import pull as pull_artifact

    _check(ref, model, gpu, allow_unproven)
    with context(readonly=True) as ctx:  # reads the registry, never writes it
        announce(ctx)
        pulled = pull_artifact(
            ctx, ref, output, model=model, gpu=gpu, min_seq_len=min_seq_len, host=host,
            port=port, executable=executable, options=PullOptions(
                gpu_count=gpu_count, min_batch=min_batch, prefer=tuple(prefer),
                allow_unready=allow_unready, allow_unproven=allow_unproven,
                verify="strict" if verify == "strict" else "fast", force=force,
                progress=progress(), warm=not no_warm))
    _notes(pulled.notes)
    if as_json:
        echo_json(pulled.as_dict())
        return
    click.echo(f"pulled {pulled.digest} ({pulled.kind}"
               + (f" with its checkpoint {pulled.sources[1]}" if len(pulled.sources) > 1
                  else "")
               + (f", {pulled.unproven}" if pulled.unproven else "")
               + f") into {pulled.directory}: {pulled.downloaded_bytes} bytes downloaded, "
               f"{pulled.cached_bytes} from cache; serve it with:", err=True)
    click.echo(pulled.command)


@main.command()
@_selection_options
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, file_okay=False),
              help="Serve from this directory, placed as `pull -o` places it (default: "
                   "enginectl's own serving directory).")
@handle_errors
def serve(ref: str | None, model: str | None, gpu: str, gpu_count: int | None,
          min_seq_len: int | None, min_batch: int | None, prefer: tuple[str, ...], host: str,
          port: int, executable: str | None, allow_unready: bool, allow_unproven: bool,
          no_warm: bool, output: Path | None) -> None:
    """Pull REF (or what this node should serve of --model) if needed and run its server in
    the foreground; signals go to the server, and its exit code is enginectl's.

    \b
    Examples:
      enginectl serve --model llama-3.3-70b-instruct --gpu auto --port 8000
      enginectl serve llama70b/h100/prod --host 127.0.0.1
    """
    import sys

    from pipeline.deploy.serve import ServeOptions
    from pipeline.deploy.serve import serve as serve_artifact

    _check(ref, model, gpu, allow_unproven)

    def started(pulled: Any) -> None:
        _notes(pulled.notes)
        click.echo(f"enginectl: serving {pulled.digest} from {pulled.directory} as "
                   f"{pulled.served_model_name!r} on {pulled.host}:{pulled.port}: "
                   f"{pulled.command}", err=True)

    with context(readonly=True) as ctx:  # reads the registry, never writes it
        code = serve_artifact(
            ctx, ref, model=model, gpu=gpu, min_seq_len=min_seq_len, host=host, port=port,
            executable=executable, options=ServeOptions(
                gpu_count=gpu_count, min_batch=min_batch, prefer=tuple(prefer),
                allow_unready=allow_unready, allow_unproven=allow_unproven,
                progress=progress(), started=started, warm=not no_warm, output=output))
    sys.exit(code)
