"""import: adopt an engine or checkpoint built elsewhere (the folders teams have today).

The directory is checked before anything is stored: an engine directory needs `config.json`
and exactly one `rank{N}.engine` per rank; checkpoints need `config.json`; links and special
files are refused. Shape and parallelism are read from the engine's build config when not
given, and must agree with it when they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.errors import ManifestError, UsageError
from registry.gpus import UnknownGpuError, lookup_gpu
from registry.manifest import KINDS
from registry.publish import Published, publish, scan_directory
from registry.records import ArtifactStatus

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
        try:
            gpu = lookup_gpu(spec.gpu)
        except UnknownGpuError as exc:
            raise UsageError(f"--gpu: {exc}") from exc
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
    scan_directory(root)  # links, odd names and special files are refused before the store opens
    ctx.begin(registry=True)
    reason = "imported" if spec.status == "built" else "imported as ready, not smoke-tested"
    # publish hashes the files itself: their sha256 runs while the blobs upload
    return publish(ctx, root, kind=spec.kind, labels=labels, status=spec.status,
                   status_reason=reason, progress=progress)
