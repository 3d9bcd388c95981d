"""import: adopt an engine or checkpoint built elsewhere (the folders teams have today).

The directory is checked before anything is stored: an engine directory needs `config.json`
and exactly one `rank{N}.engine` per rank; checkpoints need `config.json`; links and special
files are refused. Shape and parallelism are read from the engine's build config when not
given, and must agree with it when they are.

An engine is served with a tokenizer directory (`registry.tokenizer`): `tokenizer/` inside
it, with the source model's HF config.json, tokenizer files and chat template. One the
directory lacks comes from *tokenizer_from*: a Hugging Face model directory (its config.json
and tokenizer files are copied, never its weights), or a REF to an hf-checkpoint or an engine
that carries one (its files come from the store, and the REF is recorded as the engine's
input). Without either the engine is imported as it is: it can answer completions but not
chat, so `enginectl smoke` refuses it (it is never proven `ready` on completions alone; the
CLI says so, and how to supply one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.errors import ManifestError, UsageError
from registry.gpus import lookup_gpu
from registry.identity.manifest import KINDS, Manifest
from registry.identity.refs import check_ref
from registry.ops.publish import Published, publish, scan_directory
from registry.sql.records import ArtifactStatus
from registry.tokenizer import HF_CONFIG, TOKENIZER_DIR, TOKENIZER_FILES, tokenizer_entries

if TYPE_CHECKING:
    from registry.context import Context
    from registry.progress import Progress

RUNTIME_OF = {"trtllm-engine": "trtllm", "trtllm-checkpoint": "trtllm-pytorch", "vllm": "vllm"}
SHAPE_FIELDS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
_RANK = re.compile(r"^rank(\d+)\.engine$")


@dataclass(frozen=True)
class ImportSpec:
    kind: str
    model: str
    gpu: str | None = None
    quant: str | None = None
    kv_cache_dtype: str | None = None
    tp: int | None = None
    pp: int | None = None
    shape: dict[str, int] | None = None
    status: ArtifactStatus = "built"
    tokenizer_from: str | None = None  # an engine's tokenizer: an HF model DIR or a REF


def _read_config(root: Path) -> dict[str, Any]:
    path = root / "config.json"
    if not path.is_file():
        raise ManifestError(f"{root} has no config.json; not a {_kind_word(root)} directory")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ManifestError(f"{path} is not a JSON object")
    return config


def _kind_word(root: Path) -> str:
    return "engine" if any(root.glob("rank*.engine")) else "checkpoint"


def _engine_labels(root: Path, spec: ImportSpec) -> dict[str, Any]:
    config = _read_config(root)
    build = config.get("build_config") or {}
    mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
    tp = spec.tp or int(mapping.get("tp_size", 1))
    pp = spec.pp or int(mapping.get("pp_size", 1))
    for name, given, found in (("tp", spec.tp, mapping.get("tp_size")),
                               ("pp", spec.pp, mapping.get("pp_size"))):
        if given is not None and found is not None and int(found) != given:
            raise UsageError(f"--{name} {given} disagrees with config.json's {name}_size {found}")
    ranks = sorted(int(m.group(1)) for p in root.iterdir() if (m := _RANK.match(p.name)))
    if ranks != list(range(tp * pp)):
        raise ManifestError(
            f"{root} has engine ranks {ranks or 'none'}; tp {tp} × pp {pp} needs "
            f"rank0.engine … rank{tp * pp - 1}.engine"
        )
    shape = dict(spec.shape or {})
    for name in SHAPE_FIELDS:
        found = build.get(name)
        if name in shape and found is not None and int(found) != shape[name]:
            raise UsageError(f"--shape {name}={shape[name]} disagrees with config.json's {found}")
        if found is not None:
            shape.setdefault(name, int(found))
    return {"tp": tp, "pp": pp, **shape}


def _labels(root: Path, spec: ImportSpec) -> dict[str, Any]:
    if spec.kind not in KINDS:
        raise UsageError(f"--kind {spec.kind!r} is not one of {', '.join(sorted(KINDS))}")
    labels: dict[str, Any] = {"model": spec.model, "runtime": RUNTIME_OF.get(spec.kind),
                              "quant": spec.quant, "kv_cache_dtype": spec.kv_cache_dtype}
    if spec.gpu is not None:
        gpu = lookup_gpu(spec.gpu, option="--gpu")
        labels |= {"gpu": gpu.sku, "sm": gpu.sm}
    if spec.kind == "trtllm-engine":
        if spec.gpu is None:
            raise UsageError("an engine is tied to its GPU: pass --gpu (e.g. --gpu h100)")
        return labels | _engine_labels(root, spec)
    if spec.kind != "vllm" or any(root.iterdir()):
        _read_config(root)
    return labels | {"tp": spec.tp or 1, "pp": spec.pp or 1, **(spec.shape or {})}


def import_artifact(
    ctx: Context, root: Path | str, spec: ImportSpec, progress: Progress | None = None
) -> Published:
    """Validate *root* for *spec.kind*, then publish it (a no-op if already stored)."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    labels = _labels(root, spec)
    files = scan_directory(root)  # links, odd names, special files: refused before the store opens
    from_dir = _check_tokenizer(root, spec)
    ctx.begin(registry=True)
    reason = "imported" if spec.status == "built" else "imported as ready, not smoke-tested"
    if spec.tokenizer_from is None:
        # publish hashes the files itself: their sha256 runs while the blobs upload
        return publish(ctx, root, kind=spec.kind, labels=labels, status=spec.status,
                       status_reason=reason, progress=progress)
    ctx.config.home.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".import-", dir=ctx.config.home))
    try:
        for relative, path in files:
            _place(path, stage / relative)
        inputs: tuple[str, ...] = ()
        if from_dir is not None:
            for name in (HF_CONFIG, *TOKENIZER_FILES):
                if (from_dir / name).is_file():
                    _place(from_dir / name, stage / TOKENIZER_DIR / name, link=False)
        else:
            inputs = (_fetch_tokenizer(ctx, spec.tokenizer_from, stage / TOKENIZER_DIR),)
        return publish(ctx, stage, kind=spec.kind, labels=labels, status=spec.status,
                       status_reason=reason, progress=progress, inputs=inputs)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def has_tokenizer(root: Path) -> bool:
    """Whether the engine directory *root* carries its tokenizer directory."""
    return (root / TOKENIZER_DIR / HF_CONFIG).is_file()


def _check_tokenizer(root: Path, spec: ImportSpec) -> Path | None:
    """Refuse what cannot be: --tokenizer-from for a non-engine or an engine that carries its
    own, or naming no HF model directory. The HF model directory when
    *spec.tokenizer_from* is one (checked), None otherwise (a REF, or nothing)."""
    given = spec.tokenizer_from
    if spec.kind != "trtllm-engine":
        if given is not None:
            raise UsageError("--tokenizer-from is for engines (--kind trtllm-engine); a "
                             "checkpoint serves with its own tokenizer")
        return None
    if given is not None and has_tokenizer(root):
        raise UsageError(f"{root} carries its own {TOKENIZER_DIR}/{HF_CONFIG}; drop "
                         "--tokenizer-from")
    if given is None:
        return None
    directory = Path(given)
    if not directory.is_dir():  # a REF, resolved once the registry is open
        try:
            check_ref(given)
        except UsageError as exc:
            raise UsageError(f"--tokenizer-from {given!r} is neither a directory nor a REF: "
                             f"{exc}") from exc
        return None
    try:
        config = json.loads((directory / HF_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer-from {given}: no readable {HF_CONFIG} ({exc})") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise UsageError(f"--tokenizer-from {given}: its {HF_CONFIG} has no model_type, so it "
                         "is not a Hugging Face model config (an engine's is TensorRT-LLM's); "
                         "name the model directory the engine was built from")
    if not any((directory / name).is_file()
               for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise UsageError(f"--tokenizer-from {given}: no tokenizer.json, tokenizer.model or "
                         "vocab.json there")
    return directory


def _place(source: Path, target: Path, *, link: bool = True) -> None:
    """*source* at *target*: a hard link where the file system allows, else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(source, target)
        except OSError:
            pass
        else:
            return
    shutil.copy2(source, target)


def _fetch_tokenizer(ctx: Context, ref: str, dest: Path) -> str:
    """The tokenizer directory of the artifact *ref* names, fetched to *dest*; its digest."""
    from registry.ops.fetch import cached_manifest, find, lazy_store
    from registry.ops.fetch_files import fetch_manifest

    found = find(ctx, ref)
    store = lazy_store(ctx)
    manifest = cached_manifest(store, ctx.cache, found.digest)
    entries = tokenizer_entries(manifest)
    if entries is None:
        raise UsageError(f"--tokenizer-from {ref}: {found.digest} is a {manifest.kind} without "
                         f"an HF {HF_CONFIG}; name the hf-checkpoint the engine was built from")
    fetch_manifest(store, Manifest(kind="hf-checkpoint", files=entries), dest, cache=ctx.cache)
    return found.digest
