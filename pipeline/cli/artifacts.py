"""Commands on artifacts: import, ls, show, fetch, logs, tag, untag, rollback, resolve."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import (
    ALIAS,
    MODEL,
    REF,
    Ref,
    announce,
    context,
    echo_json,
    handle_errors,
    main,
    note,
    progress,
)


def _parse_shape(text: str | None) -> dict[str, int] | None:
    """`--shape max_batch_size=8,max_input_len=1024,max_seq_len=2048`"""
    if not text:
        return None
    from registry.errors import UsageError
    from registry.ops.adopt import SHAPE_FIELDS

    shape: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in SHAPE_FIELDS or not value.strip().isdigit():
            raise UsageError(
                f"--shape {part!r}: expected NAME=INT with NAME in {', '.join(SHAPE_FIELDS)}"
            )
        shape[name] = int(value)
    return shape


@main.command("import")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--kind", required=True, help="trtllm-engine, trtllm-checkpoint, vllm, …")
@click.option("--model", required=True, type=MODEL, help="Model name, as recipes call it.")
@click.option("--gpu", help="GPU SKU (required for engines).")
@click.option("--quant", help="Quantization (bf16, fp8, int4_awq, …).")
@click.option("--kv-cache-dtype", help="KV-cache dtype (auto, fp8, int8).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor parallelism.")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline parallelism.")
@click.option("--shape", "shape_text", help="max_batch_size=N,max_input_len=N,max_seq_len=N")
@click.option("--ready", is_flag=True,
              help="Register as ready (you vouch it serves) instead of built.")
@click.option("--tokenizer-from", metavar="DIR|REF",
              help="An engine's tokenizer: the HF model directory it was built from (its "
                   "config.json and tokenizer files) or a REF to that hf-checkpoint; without "
                   "it the engine cannot serve chat.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: digest, registered, blobs_uploaded, bytes_uploaded.")
@handle_errors
def import_(directory: Path, kind: str, model: str, gpu: str | None, quant: str | None,
            kv_cache_dtype: str | None, tp: int | None, pp: int | None,
            shape_text: str | None, ready: bool, tokenizer_from: str | None,
            as_json: bool) -> None:
    """Adopt an engine or checkpoint DIRECTORY built elsewhere.

    Only the blobs the store lacks are uploaded (a stored blob of the wrong size, or a
    damaged manifest, is replaced); Ctrl-C keeps what was uploaded and a re-run goes on
    from there (exit 130).

    \b
    Examples:
      enginectl import ./engines/llama70b-fp8-tp8 --kind trtllm-engine \\
          --model llama-3.3-70b-instruct --gpu h100 --quant fp8 \\
          --tokenizer-from ./hf/Llama-3.3-70B-Instruct
      enginectl import ./ckpt --kind trtllm-checkpoint --model m --json
    """
    from registry.ops.adopt import ImportSpec, import_artifact
    from registry.ops.target import check_name_lengths
    from registry.tokenizer import carries_tokenizer

    check_name_lengths(directory, "DIRECTORY")  # a name too long: one line, exit 2
    spec = ImportSpec(kind=kind, model=model, gpu=gpu, quant=quant,
                      kv_cache_dtype=kv_cache_dtype, tp=tp, pp=pp,
                      shape=_parse_shape(shape_text), status="ready" if ready else "built",
                      tokenizer_from=tokenizer_from)
    ctx = context()
    announce(ctx)
    result = import_artifact(ctx, directory, spec, progress=progress())
    if kind == "trtllm-engine" and not carries_tokenizer(result.manifest):
        note(f"{result.digest} has no tokenizer, so it cannot serve chat and is never "
             "smoke-tested ready; import it again with --tokenizer-from HF_DIR|REF (the model "
             "it was built from)")
    if as_json:
        echo_json({"digest": result.digest, "registered": result.registered,
                    "blobs_uploaded": result.blobs_uploaded,
                    "bytes_uploaded": result.bytes_uploaded})
        return
    state = "imported" if result.registered else "already registered"
    click.echo(f"{state}: {result.digest} ({len(result.manifest.files)} files, "
               f"{result.manifest.size} bytes, {result.blobs_uploaded} new blobs)")


@main.command("ls")
@click.option("--model", type=MODEL, help="Only this model's artifacts.")
@click.option("--gpu", help="Only artifacts for this GPU SKU (catalog names and aliases).")
@click.option("--kind", help="Only this kind: trtllm-engine, trtllm-checkpoint, vllm, …")
@click.option("--quant", help="Only this quantization (bf16, fp8, int4_awq, …).")
@click.option("--status", help="Only this status: building, built, ready, quarantined, …")
@click.option("--alias", type=ALIAS, help="Only the artifact this alias points at.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def ls_(as_json: bool, **filters: str | None) -> None:
    """List registered artifacts, oldest first, with their status and aliases.

    \b
    Examples:
      enginectl ls --model llama-3.3-70b-instruct --gpu h100
      enginectl ls --status quarantined --json
    """
    from registry.identity.manifest import KINDS
    from registry.ops.inventory import ls
    from registry.sql.statuses import ARTIFACT_STATUSES

    _one_of("--kind", filters.get("kind"), KINDS)
    _one_of("--status", filters.get("status"), ARTIFACT_STATUSES)

    if filters.get("gpu"):
        from registry.gpus import lookup_gpu

        filters["gpu"] = lookup_gpu(str(filters["gpu"]), option="--gpu").sku
    rows = ls(context(readonly=True), **filters)
    if as_json:
        echo_json(rows)
        return
    from pipeline.listings import artifact_table

    click.echo(artifact_table(rows))


def _one_of(option: str, value: str | None, valid: tuple[str, ...]) -> None:
    """Refuse a filter value no artifact can have, listing the valid ones."""
    if value is not None and value not in valid:
        from registry.errors import UsageError

        raise UsageError(f"{option} {value!r} is not one of {', '.join(valid)}")


@main.command()
@click.argument("ref", type=REF)
@click.option("--json", "as_json", is_flag=True,
              help="Print the artifact, manifest, provenance and reports as JSON.")
@handle_errors
def show(ref: str, as_json: bool) -> None:
    """Show an artifact: manifest, provenance, aliases, smoke reports (and where each ran)
    and the stage run that made it.

    \b
    Examples:
      enginectl show llama70b/h100/prod
      enginectl show 9f86d081884c --json
    """
    from registry.ops.inventory import show as show_artifact

    info = show_artifact(context(readonly=True), ref)
    if as_json:
        echo_json(info)
        return
    from pipeline.listings import show_lines

    click.echo("\n".join(show_lines(info)))


@main.command()
@click.argument("ref", type=REF)
@click.option("-o", "--output", "output", required=True,
              type=click.Path(path_type=Path, file_okay=False),
              help="Target directory: absent or empty (or --force); never /, your home, the "
                   "working directory or a folder above them, enginectl's home, the store, "
                   "the cache or a folder inside them, /proc, /sys or /dev.")
@click.option("--verify", type=click.Choice(["fast", "strict"]), default="fast",
              show_default=True,
              help="fast: cache entries proven unchanged since verified are trusted; strict: "
                   "re-hash every placed file with xxh3-128 and sha256.")
@click.option("--force", is_flag=True,
              help="Replace a directory an earlier fetch or pull filled (swapped in whole at "
                   "the end); never one holding files enginectl did not write.")
@click.option("--allow-unready", is_flag=True,
              help="Fetch a quarantined artifact too (it failed its smoke run).")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: digest, path, downloaded_bytes, cached_bytes.")
@handle_errors
def fetch(ref: str, output: Path, verify: str, force: bool, allow_unready: bool,
          as_json: bool) -> None:
    """Fetch REF (digest, 12+ hex prefix, or alias) into a directory, verified.

    Nothing changes at the target until every file checked out; a damaged blob in the
    store is set aside (exit 4; publish it again to heal). Ctrl-C stops at once (exit
    130): what was downloaded stays in the cache, and the same command resumes. A
    quarantined artifact is refused (exit 4) unless --allow-unready; an engine or entry not
    yet proven to serve is fetched with a note.

    \b
    Examples:
      enginectl fetch llama70b/h100/prod -o /models/llama70b
      enginectl fetch 9f86d081884c -o ./engine --verify strict --json
    """
    from registry.ops.fetch import fetch as fetch_artifact

    ctx = context()
    announce(ctx)
    result = fetch_artifact(ctx, ref, output, verify="strict" if verify == "strict"
                            else "fast", force=force, allow_unready=allow_unready,
                            progress=progress())
    for line in result.notes:
        note(line)
    if as_json:
        echo_json({"digest": str(result.manifest.digest), "path": str(result.path),
                    "downloaded_bytes": result.downloaded_bytes,
                    "cached_bytes": result.cached_bytes})
        return
    click.echo(f"fetched {result.manifest.digest} into {result.path} "
               f"({result.downloaded_bytes} bytes downloaded, {result.cached_bytes} from cache)")


@main.command()
@click.argument("ref", type=Ref(keys=True))
@click.option("--smoke", is_flag=True,
              help="The log of REF's latest smoke report instead of its stage run's.")
@handle_errors
def logs(ref: str, smoke: bool) -> None:
    """Print the log of the stage run that made REF (digest, prefix, alias) or of a stage
    key (k1:…), read from the store.

    \b
    Examples:
      enginectl logs llama70b/h100/prod            # the build that made it
      enginectl logs k1:3f2a…                      # any stage run, by key
      enginectl logs 9f86d081884c --smoke | less   # its latest smoke run's server log
    """
    import sys

    from registry.ops.logs import logs as read_log

    read_log(context(readonly=True), ref, sys.stdout.buffer, smoke=smoke)
    sys.stdout.buffer.flush()


@main.command()
@click.argument("ref", type=REF)
@click.argument("alias", type=ALIAS)
@click.option("--note", help="Why (kept in the alias history).")
@click.option("--allow-unready", is_flag=True,
              help="Tag a built (not yet smoke-tested) artifact; recorded in the history.")
@handle_errors
def tag(ref: str, alias: str, note: str | None, allow_unready: bool) -> None:
    """Point ALIAS at the artifact REF (only ready artifacts, unless overridden).

    Alias names are lowercase parts of letters, digits, '.', '_' and '-' joined by '/'
    (no empty, '.' or '..' part). Every move is kept, in the registry and in the store.

    \b
    Examples:
      enginectl tag 9f86d081884c llama70b/h100/prod --note "faster at 64"
      enginectl tag sha256:9f86… llama70b/h100/canary --allow-unready
    """
    from registry.ops.aliases import tag as tag_artifact

    digest, previous = tag_artifact(context(), ref, alias, note, allow_unready=allow_unready)
    moved = f" (was {previous})" if previous and previous != digest else ""
    click.echo(f"{alias} -> {digest}{moved}")


@main.command()
@click.argument("alias", type=ALIAS)
@handle_errors
def untag(alias: str) -> None:
    """Remove ALIAS (its history is kept, in the registry and in the store).

    \b
    Examples:
      enginectl untag llama70b/h100/canary
    """
    from registry.ops.aliases import untag as untag_alias

    click.echo(f"removed {alias} (was {untag_alias(context(), alias)})")


@main.command()
@click.argument("alias", type=ALIAS)
@click.option("--note", help="Why (kept in the alias history).")
@click.option("--json", "as_json", is_flag=True, help="Print {alias, digest, previous}.")
@handle_errors
def rollback(alias: str, note: str | None, as_json: bool) -> None:
    """Move ALIAS back to the artifact it pointed at before its last move (recorded).

    The artifact it leaves becomes superseded (it no longer resolves) unless another alias
    points at it; the one it returns to is ready again. The alias stays pinned there: no
    build or nightly moves it back (`show` says so, with --note); only a new digest that wins
    the nightly's gate, or `enginectl tag`, moves it.

    \b
    Examples:
      enginectl rollback llama70b/h100-sxm5-80gb/prod
      enginectl rollback llama70b/h100-sxm5-80gb/prod --note "TTFT regression in prod"
    """
    from registry.ops.aliases import rollback as roll_back

    digest, previous = roll_back(context(), alias, note)
    if as_json:
        echo_json({"alias": alias, "digest": digest, "previous": previous})
    else:
        click.echo(f"{alias} -> {digest} (was {previous})")


@main.command()
@click.option("--model", required=True, type=MODEL, help="The model, as recipes name it.")
@click.option("--gpu", required=True, help="GPU SKU, or 'auto' to read nvidia-smi.")
@click.option("--gpus", "gpu_count", type=click.IntRange(min=1),
              help="GPUs on the node (auto: counted).")
@click.option("--min-seq-len", type=click.IntRange(min=1),
              help="Only artifacts whose max_seq_len is at least this.")
@click.option("--min-batch", type=click.IntRange(min=1),
              help="Only artifacts whose max_batch_size is at least this.")
@click.option("--prefer", multiple=True, type=click.Choice(["engine", "checkpoint", "vllm"]),
              help="Kinds to try first, in order (repeatable).")
@click.option("--explain", is_flag=True, help="Say why every other artifact was rejected.")
@click.option("--allow-unproven", is_flag=True,
              help="Also rank artifacts with no passing smoke on this GPU SKU (proven only "
                   "elsewhere, or nowhere), each marked `unproven on <SKU>`.")
@click.option("--json", "as_json", is_flag=True, help="Print candidates and rejections as JSON.")
@handle_errors
def resolve(model: str, gpu: str, gpu_count: int | None, min_seq_len: int | None,
            min_batch: int | None, prefer: tuple[str, ...], explain: bool,
            allow_unproven: bool, as_json: bool) -> None:
    """Rank the artifacts of a model for a GPU: proven on this node's fingerprint first
    (then the nearest proof: same driver branch, then same SKU), engines, then checkpoints,
    then vLLM, by the latest smoke evidence measured there. An artifact with no passing
    smoke on the SKU (proven only on another GPU or the CPU) is rejected, saying where it was
    proven, unless --allow-unproven; nothing left is exit 6.

    With --gpu auto the fingerprint is this machine's (nvidia-smi's GPU and driver, the
    TRT-LLM, TensorRT, CUDA and vLLM installed here); with --gpu SKU only the SKU is known.
    --json shows the fingerprint and, per candidate, the proof used (`evidence_used`).

    \b
    Examples:
      enginectl resolve --model llama-3.3-70b-instruct --gpu h100 --min-seq-len 4096
      enginectl resolve --model tiny-llama --gpu auto --explain
    """
    from pipeline.deploy.node import node_request
    from registry.errors import RecordNotFoundError
    from registry.ops.resolve import resolve as rank_for

    ctx = context(readonly=True)
    request = node_request(model, gpu, gpu_count=gpu_count, min_seq_len=min_seq_len,
                           min_batch=min_batch, prefer=prefer, allow_unproven=allow_unproven,
                           ctx=ctx)
    spec = request.gpu
    ranked = rank_for(ctx, request, explain=explain)
    if as_json:
        echo_json(ranked.as_dict())
    else:
        from pipeline.listings import resolve_lines

        click.echo("\n".join(resolve_lines(ranked, explain)))
    if not ranked.candidates:
        elsewhere = [f"{c.digest[:19]}… {c.kind} ({reason.split(' (', 1)[-1]}"
                     for c, reason in ranked.rejected
                     if reason.startswith(f"unproven on {spec.sku} (")]
        raise RecordNotFoundError(
            "servable artifact for", f"{model} on {spec.sku}",
            hint=(f"unproven on {spec.sku}: {', '.join(elsewhere)}; --allow-unproven takes "
                  "them; " if elsewhere else "")
            + "rerun with --explain to see why each artifact was rejected",
        )
