"""plan_cache: what a build planned, remembered beside everything the plan depends on, so
that a build with nothing to do takes it from there instead of reading the recipe again.

A no-op build (`pipeline.executors.noop`) needs of its plan only its facts (`PlanFacts`):
the recipe's digest, name and path, the stage runs by key, each target's chain and the
promotion channels. Validating the recipe, its model classes and planning cost more than the
rest of such a build, so a build that planned (`remember_plan`) keeps the facts in a file of
the work directory (`<work>/.cache/plans/`, one per recipe path, written atomically), keyed
by a digest (`_key`) of all that went into them:

    the recipe file's bytes, the path it was named by, where that resolves, the directory
    it was named from and $HOME (where its relative and `~` paths point)
    the Settings and every ENGINECTL_* variable, CUDA_VISIBLE_DEVICES
    the toolchain this machine's probe found (the build probes on every run: nvidia-smi's
    driver, the builder's and vLLM's Pythons)
    the local model directory (every entry's size, mtime, ctime and inode) and the
    calibration file, as the plan read them
    enginectl's own code (every module's stat) and the site-packages directories of this
    Python's path (an installed or upgraded package changes its directory)

`remembered_plan` answers the facts when that digest is the one stored, else None, and the
caller plans from the recipe. A plan is not remembered when its model directory or
calibration file changed in the seconds before it was planned (`file_stats.RACY_S`), when it
asked the hub what a branch points at (that is asked on every build), or when the recipe's
text is not the one of the bytes the key was taken from. An unreadable, corrupt or older
(`SCHEMA`) file reads as a miss. Only a build writes here; `plan` and a dry run never do.
Imports nothing of the recipe's model classes (pydantic).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.host.state import write_atomically
from pipeline.planning.channels import Channel
from pipeline.planning.file_stats import RACY_S, file_signature, tree_signature
from pipeline.planning.stage_run import StageRun, keys_of

if TYPE_CHECKING:
    from pipeline.planning.plan import Plan
    from pipeline.planning.toolchain import Toolchain
    from pipeline.settings import Settings

SCHEMA: Final = 1  # what a file holds; a file of another schema is a miss
_MAX_RECIPE_BYTES: Final = 4 << 20  # a bigger file is never a remembered recipe
_ENV: Final = ("HOME", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class PlanFacts:
    """What a no-op build reads of its plan (`pipeline.executors.noop`)."""

    digest: str  # the recipe's (`LoadedRecipe.digest`)
    name: str  # its display name
    path: str  # where the recipe file resolves
    stages: dict[str, StageRun]  # by key, inputs first (`Plan.stages`)
    chains: tuple[tuple[str, tuple[str, ...]], ...]  # each target's id and its stage keys
    channels: tuple[Channel, ...]  # the recipe's `promote`, rendered

    def keys(self, only: str | None) -> set[str]:
        """The keys the targets matching *only* need (`selected_keys`)."""
        return keys_of(self.chains, only)


def facts_of(plan: Plan) -> PlanFacts:
    """*plan*'s facts."""
    loaded = plan.loaded
    return PlanFacts(loaded.digest, loaded.recipe.display_name, str(Path(loaded.path).resolve()),
                     plan.stages, tuple((t.target.id, tuple(t.chain)) for t in plan.targets),
                     tuple(plan.channels))


def cache_dir(settings: Settings) -> Path:
    """Where a build keeps what it remembers between runs (plans, vLLM probes)."""
    return settings.work_dir / ".cache"


def _entry_path(settings: Settings, recipe: Path) -> Path:
    name = hashlib.sha256(str(recipe.resolve()).encode("utf-8", "surrogateescape"))
    return cache_dir(settings) / "plans" / f"{name.hexdigest()[:32]}.json"


def _read_recipe_bytes(recipe: Path) -> bytes | None:
    with recipe.open("rb") as handle:
        raw = handle.read(_MAX_RECIPE_BYTES + 1)
    return raw if len(raw) <= _MAX_RECIPE_BYTES else None


def remembered_plan(recipe: Path, settings: Settings, toolchain: Toolchain) -> PlanFacts | None:
    """The facts a build remembered for *recipe*, when nothing they depend on changed since
    (the module doc), with this machine's *toolchain*; None when anything did, or when
    there is nothing (readable) to take."""
    try:
        raw = _read_recipe_bytes(recipe)
        if raw is None:
            return None
        entry = json.loads(_entry_path(settings, recipe).read_bytes())
        if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
            return None
        trees, files = [Path(p) for p in entry["trees"]], [Path(p) for p in entry["files"]]
        key, _newest = _key(recipe, raw, settings, toolchain, trees=trees, files=files)
        if key != entry["key"]:
            return None
        return _facts_from(entry["facts"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None  # anything in doubt: plan from the recipe


def remember_plan(recipe: Path, raw: bytes, plan: Plan, settings: Settings,
                  toolchain: Toolchain, *, started: float) -> bool:
    """Keep *plan*'s facts for *recipe* (read as *raw*, planned from *started* on with
    *toolchain*), unless the module doc says not to; whether it was kept. Never raises
    for a file it cannot write: the next build plans again."""
    loaded, source = plan.loaded, plan.source
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    if text != loaded.text or source.revision != loaded.recipe.model.revision:
        return False  # bytes that are not what was planned, or a branch asked of the hub
    trees: list[Path] = []
    if loaded.recipe.model.is_local:
        from pipeline.recipe.reader import local_source_dir

        trees.append(local_source_dir(loaded.recipe, loaded.path.parent))
    files = [source.calibration_file] if source.calibration_file is not None else []
    try:
        key, newest = _key(recipe, raw, settings, toolchain, trees=trees, files=files)
        if newest >= started - RACY_S:
            return False
        entry = {"schema": SCHEMA, "key": key, "trees": [str(p) for p in trees],
                 "files": [str(p) for p in files], "facts": _facts_as_dict(facts_of(plan))}
        write_atomically(_entry_path(settings, recipe), json.dumps(entry).encode())
    except (OSError, ValueError):
        return False
    return True


def _key(recipe: Path, raw: bytes, settings: Settings, toolchain: Toolchain, *,
         trees: Sequence[Path], files: Sequence[Path]) -> tuple[str, float]:
    """The digest of everything a plan of *recipe* depends on (the module doc), and the
    newest change time among its model's files."""
    newest = 0.0
    signatures: list[Any] = []
    for tree in trees:
        seen, changed = tree_signature(tree)
        signatures.append([str(tree), str(tree.resolve()), seen])
        newest = max(newest, changed)
    for file in files:
        seen, changed = file_signature(file)
        signatures.append([str(file), str(file.resolve()), seen])
        newest = max(newest, changed)
    parts = {
        "schema": SCHEMA,
        "code": _code_signature(),
        "recipe": [str(recipe), str(recipe.resolve()), str(Path.cwd()),
                   hashlib.sha256(raw).hexdigest()],
        "settings": [str(value) for value in astuple(settings)],
        "env": sorted((k, v) for k, v in os.environ.items()
                      if k.startswith("ENGINECTL_") or k in _ENV),
        "toolchain": toolchain.as_dict(),
        "sources": signatures,
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest(), newest


def _code_signature() -> list[Any]:
    """enginectl's modules (each one's stat) and this Python's package directories on its
    path (their stat: installing a package changes its directory): the code that plans."""
    import pipeline
    import registry

    found: list[Any] = [sys.version]
    for package in (pipeline, registry):
        root = Path(package.__file__ or "").parent
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    st = os.stat(f"{dirpath}/{name}")  # noqa: PTH116 - ~200: no Path each
                    found.append([dirpath, name, st.st_size, st.st_mtime_ns, st.st_ino])
    for entry in sys.path:
        if not entry.endswith(("site-packages", "dist-packages")):
            continue  # the script's or the working directory: they change all the time
        try:
            st = os.stat(entry or ".")  # noqa: PTH116
        except OSError:
            found.append([entry, None])
            continue
        found.append([entry, st.st_mtime_ns, st.st_ino])
    return found


def _facts_as_dict(facts: PlanFacts) -> dict[str, Any]:
    return {
        "digest": facts.digest, "name": facts.name, "path": facts.path,
        "stages": [{**run.as_dict(), "workdir": str(run.workdir)} for run in facts.stages.values()],
        "chains": [[target_id, list(chain)] for target_id, chain in facts.chains],
        "channels": [[c.alias, c.target, c.entry, c.smoke, c.max_regression, c.index]
                     for c in facts.channels],
    }


def _facts_from(data: dict[str, Any]) -> PlanFacts:
    stages = {}
    for run in data["stages"]:
        stages[run["key"]] = StageRun(
            run["stage"], run["key"], run["kind"], run["params"], run["inputs"],
            run["toolchain"], Path(run["workdir"]), argv=run["argv"], gpu=run["gpu"],
            gpus=run["gpus"], targets=run["targets"], before=run.get("before", []))
    return PlanFacts(
        str(data["digest"]), str(data["name"]), str(data["path"]), stages,
        tuple((str(target_id), tuple(chain)) for target_id, chain in data["chains"]),
        tuple(Channel(str(a), str(t), str(e), str(s), float(r), int(i))
              for a, t, e, s, r, i in data["channels"]))
