"""Commands from proofs to a fleet's decision: advise, route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.base import context, echo_json, handle_errors, main

SLO_OPTIONS = [
    click.option("--model", required=True, help="The model, as its recipe names it."),
    click.option("--ttft-p95", "ttft", required=True, metavar="DURATION",
                 help="The ceiling of the time to first token's p95: 300ms, 0.3s."),
    click.option("--tpot-p95", "tpot", metavar="DURATION",
                 help="The ceiling of the time per output token's p95: 50ms (optional)."),
    click.option("--rate", required=True, metavar="RATE",
                 help="The traffic to serve: 20/s, 1200/min."),
    click.option("--gpu", help="Only proofs measured on this GPU SKU (or CPU)."),
    click.option("--price", "prices", multiple=True, metavar="SKU=USD",
                 help="$ per GPU-hour of a SKU, over the price its proofs recorded "
                      "(the recipe's smoke.gpu_price_per_hour); repeatable."),
]


def _slo_options(command: Any) -> Any:
    for option in reversed(SLO_OPTIONS):
        command = option(command)
    return command


def _advice(model: str, ttft: str, tpot: str | None, rate: str, gpu: str | None,
            prices: tuple[str, ...]) -> Any:
    from pipeline.advise.advise import advise
    from pipeline.advise.inputs import parse_duration, parse_prices, parse_rate
    from pipeline.serving.capacity import Slo
    from registry.gpus import lookup_gpu

    slo = Slo(parse_duration("--ttft-p95", ttft),
              None if tpot is None else parse_duration("--tpot-p95", tpot))
    per_s = parse_rate("--rate", rate)
    sku = None if gpu is None else lookup_gpu(gpu, option="--gpu").sku
    return advise(context(readonly=True), model, slo=slo, rate=per_s, gpu=sku,
                  prices=parse_prices("--price", prices))


def _nothing_meets(advice: Any) -> None:
    from pipeline.advise.text import objective
    from registry.errors import NothingResolvableError

    near = advice.nearest
    reasons = [f"{o.digest[:19]}… {o.kind} on {o.gpu} at {o.capacity.lowest_rate:g} "
               f"requests/s: {'; '.join(o.capacity.missed)}" for o in advice.short]
    hint = "" if near is None else f" (nearest: {near.digest[:19]}… on {near.gpu})"
    raise NothingResolvableError(
        advice.model, "any proven GPU", reasons,
        next_step=f"nothing meets {objective(advice.slo, advice.rate)}{hint}; relax the "
                  "objective or measure higher rates (smoke.capacity)")


@main.command()
@_slo_options
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
@handle_errors
def advise(model: str, ttft: str, tpot: str | None, rate: str, gpu: str | None,
           prices: tuple[str, ...], as_json: bool) -> None:
    """What serving RATE of a model within a latency objective takes on each proven
    artifact: the capacity read from its proof's open-loop curve (never past the highest
    rate measured), the replicas, GPUs, $/hour and $ per 1M output tokens; cheapest first.
    Each row names its proof (digest, when, fingerprint); artifacts without a proof with a
    curve on their pool's current fingerprint are listed apart. Exit 6 when nothing is
    proven, or nothing proven meets the objective (the nearest is said, with by how much).

    \b
    Examples:
      enginectl advise --model tiny-llama --ttft-p95 300ms --rate 2/s
      enginectl advise --model llama-3.1-8b --ttft-p95 300ms --tpot-p95 50ms --rate 20/s --json
    """
    advice = _advice(model, ttft, tpot, rate, gpu, prices)
    if as_json:
        echo_json(advice.as_dict())
    else:
        from pipeline.advise.text import advice_lines

        click.echo("\n".join(advice_lines(advice)))
    if not advice.ranked:
        _nothing_meets(advice)


@main.command()
@_slo_options
@click.option("--format", "fmt", type=click.Choice(["litellm", "envoy-ai-gateway",
                                                    "inference-pool"]),
              help="The router's configuration to write (required unless --json).")
@click.option("--endpoint", "endpoints", multiple=True, metavar="ROLE=URL",
              help="Where a variant's OpenAI API answers: primary=URL, fallback=URL or "
                   "NAME=URL (default http://NAME:8000/v1, its Service); repeatable.")
@click.option("--gateway", default="enginectl", show_default=True,
              help="The Gateway the Kubernetes routes attach to.")
@click.option("--namespace", default="default", show_default=True,
              help="The namespace of the Kubernetes resources.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write to this file (replaced whole) instead of stdout.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the neutral manifest every format is rendered from.")
@handle_errors
def route(model: str, ttft: str, tpot: str | None, rate: str, gpu: str | None,
          prices: tuple[str, ...], fmt: str | None, endpoints: tuple[str, ...],
          gateway: str, namespace: str, output: Path | None, as_json: bool) -> None:
    """The router configuration that follows from advise's ranking: the cheapest proven
    variant that meets the objective first, the best of the other runtime (an engine's
    vLLM entry, or the reverse) as its fallback, each limited to its measured capacity.
    LiteLLM: deployments with order, rpm and max_parallel_requests, pre-call checks and
    fallbacks. Envoy AI Gateway: an AIGatewayRoute with backend priorities and a retry
    policy. inference-pool: an InferencePool per variant and an HTTPRoute.

    \b
    Examples:
      enginectl route --model tiny-llama --ttft-p95 300ms --rate 2/s --format litellm -o r.yaml
      enginectl route --model llama-3.1-8b --ttft-p95 300ms --rate 20/s --format inference-pool
      enginectl route --model tiny-llama --ttft-p95 300ms --rate 2/s --json
    """
    from pipeline.advise.manifest import route_manifest
    from pipeline.advise.routers import render
    from registry.errors import UsageError

    if fmt is None and not as_json:
        raise UsageError("route needs --format litellm|envoy-ai-gateway|inference-pool, "
                         "or --json for the neutral manifest")
    pairs = {}
    for pair in endpoints:
        name, _, url = pair.partition("=")
        if not name or not url.startswith(("http://", "https://")):
            raise UsageError(f"--endpoint {pair!r} is not ROLE=URL (primary=http://host:8000/v1)")
        pairs[name] = url
    advice = _advice(model, ttft, tpot, rate, gpu, prices)
    if not advice.ranked:
        _nothing_meets(advice)
    manifest = route_manifest(advice, pairs)
    if as_json:
        text = _json_text(manifest.as_dict())
    else:
        text = _yaml_text(render(manifest, fmt or "litellm", gateway=gateway,
                                 namespace=namespace))
    if output is None:
        click.echo(text, nl=False)
    else:
        _write_whole(output, text)


def _json_text(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def _yaml_text(value: Any) -> str:
    import yaml

    if isinstance(value, list):
        return yaml.safe_dump_all(value, sort_keys=False, explicit_start=True)
    return str(yaml.safe_dump(value, sort_keys=False))


def _write_whole(path: Path, text: str) -> None:
    """Write *text* to *path* through a temporary file beside it, renamed over it."""
    import os
    import tempfile

    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
