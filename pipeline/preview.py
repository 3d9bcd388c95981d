"""preview: what `enginectl plan` shows — the plan keyed as a build would key it, and which of
its stages the registry already has.

A build keys every stage with the toolchain it probes on the pool that runs it; `plan` runs
nothing, so it uses the toolchain last recorded for that pool (`build` records each probe)
and falls back to the builder image's versions, saying so. The registry is read with its
database driver alone (`registry.lookup`), never created or migrated, and a registry that
cannot be read only costs the "built" column, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.plan import Plan, plan_recipe
from pipeline.recipe import LoadedRecipe
from pipeline.settings import Settings
from pipeline.toolchain import BUILDER_IMAGE, for_plan, from_dict, local_pool
from registry.errors import RegistryError
from registry.lookup import built_keys, last_toolchain, shown


@dataclass
class Preview:
    plan: Plan
    built: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    toolchain_source: str = "builder image"
    """Where the plan's toolchain came from: "<pool> probed <time>" or "builder image"."""


def preview(loaded: LoadedRecipe, settings: Settings, *, registry_url: str) -> Preview:
    """The plan of *loaded* for a build on this machine (the local executor's pool)."""
    notes: list[str] = []
    pool = local_pool()
    try:
        probed = last_toolchain(registry_url, pool)
    except RegistryError as exc:
        probed = None
        notes.append(f"cannot read the registry ({exc}); keys use the builder image's versions "
                     "and nothing is shown as built")
    if probed is None:
        toolchain, source = BUILDER_IMAGE, "builder image"
        if not notes:
            notes.append(f"no toolchain is recorded for {pool} in {shown(registry_url)}; keys "
                         "use the builder image's versions (`enginectl build` records this "
                         "machine's)")
    else:
        toolchain, note = for_plan(from_dict(probed.fingerprint), loaded.recipe.toolchain)
        source = f"{pool} probed {probed.probed_at}"
        if note:
            notes.append(note)
    plan = plan_recipe(loaded, settings, toolchain)
    result = Preview(plan, notes=notes, toolchain_source=source)
    if not notes or probed is not None:
        try:
            result.built = built_keys(registry_url, set(plan.stages))
        except RegistryError as exc:
            notes.append(f"cannot read the registry ({exc}); nothing is shown as built")
    return result
