"""Promotion channels: which alias follows which target (the recipe's `promote:`). Pure.

Each `promote` entry names an alias with placeholders ({model} {gpu} {quant} {runtime}
{shape} {tp}) and the targets it follows (`match`, any matrix axes). Rendered over the
plan's targets, every alias must name exactly one target: an entry that matches nothing, a
rendered name that is not a valid alias, or two targets rendering the same name is a recipe
error (exit 2) before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.errors import RecipeError
from registry.identity.refs import valid_alias_name

if TYPE_CHECKING:  # a remembered plan's channels are read without the recipe's model
    from pipeline.planning.target import Target
    from pipeline.recipe.reader import LoadedRecipe


@dataclass(frozen=True, slots=True)
class Channel:
    """One alias and the one target it follows."""

    alias: str
    target: str  # the target id
    entry: str  # the key of the target's servable artifact (engine or entry)
    smoke: str  # the key of the target's smoke run
    max_regression: float
    index: int  # which `promote` entry made it

    def as_dict(self) -> dict[str, Any]:
        return {"alias": self.alias, "target": self.target, "entry": self.entry,
                "smoke": self.smoke, "max_regression": self.max_regression}


def render(template: str, target: Target, model: str) -> str:
    values = {"model": model, "gpu": target.gpu.sku.lower(), "quant": target.quant,
              "runtime": target.runtime, "shape": target.shape.label, "tp": f"tp{target.tp}"}
    return template.format(**values)


def channels(loaded: LoadedRecipe, chains: Sequence[tuple[Target, list[str]]]) -> list[Channel]:
    """The channels of *loaded* over its planned targets (each with its chain of keys,
    source first, the entry and its smoke run last); RecipeError as the module says."""
    from pipeline.planning.target import selects

    found: dict[str, Channel] = {}
    model = loaded.recipe.model.name
    for index, entry in enumerate(loaded.recipe.promote):
        field = f"promote[{index}].alias"
        line = loaded.line_of("promote", index, "alias")
        chosen = [(t, chain) for t, chain in chains if selects(t, entry.match)]
        if not chosen:
            raise RecipeError(loaded.path, f"{entry.alias!r}: its match selects no target of "
                              "the matrix; widen `match` or remove the entry",
                              field=f"promote[{index}].match", line=line)
        for target, chain in chosen:
            name = render(entry.alias, target, model)
            if not valid_alias_name(name):
                raise RecipeError(
                    loaded.path, f"{entry.alias!r} renders {name!r} for {target.id}, not a "
                    "valid alias (lowercase parts of letters, digits, '.', '_', '-' joined "
                    "by '/')", field=field, line=line)
            other = found.get(name)
            if other is not None:
                raise RecipeError(
                    loaded.path, f"{name!r} would name two targets, {other.target} and "
                    f"{target.id}; every alias follows one target: add a placeholder "
                    "({gpu} {quant} {runtime} {shape} {tp}) or narrow `match`",
                    field=field, line=line)
            found[name] = Channel(name, target.id, chain[-2], chain[-1], entry.max_regression,
                                  index)
    return list(found.values())
