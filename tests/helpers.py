"""Small helpers shared by tests: write a recipe variant and load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.plan import Plan, plan_recipe
from pipeline.recipe import load_recipe
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"


def recipe_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((RECIPES / name).read_text(encoding="utf-8"))
    return data


def plan_of(data: dict[str, Any], directory: Path, filename: str = "recipe.yaml") -> Plan:
    path = directory / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return plan_recipe(load_recipe(path), Settings.from_env({"ENGINECTL_HOME": str(directory)}))


def keys_by_stage(plan: Plan) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for run in plan.stages.values():
        found.setdefault(run.stage, set()).add(run.key)
    return found
