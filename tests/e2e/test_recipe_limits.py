"""What `plan` refuses so that it stays quick: a recipe past the size cap, a list past its
cap, a matrix of too many targets — each one line, exit 2, naming the limit. (How quick it is
at the caps is measured in bench/plan_speed.py, not asserted here.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.recipe.fields import MAX_FILTERS, MAX_RECIPE_BYTES, MAX_SHAPES, MAX_TARGETS
from tests.e2e.cli import GOOD_RECIPE, PREFIX, assert_one_line_error, enginectl
from tests.helpers import ROOT


def good() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / GOOD_RECIPE).read_text(encoding="utf-8"))
    return data


def write(path: Path, data: dict[str, Any], padding: int = 0) -> Path:
    text = yaml.safe_dump(data, sort_keys=False)
    path.write_text(text + ("# " + "padding " * 12 + "\n") * (padding // 99), encoding="utf-8")
    return path


def shapes(count: int) -> list[dict[str, Any]]:
    return [{"name": f"s{i}", "max_batch_size": 1 + i, "max_input_len": 1024,
             "max_seq_len": 2048} for i in range(count)]


def test_a_recipe_past_the_size_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = write(tmp_path / "huge.yaml", good(), padding=MAX_RECIPE_BYTES + 10_000)
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(path)))
    assert message.startswith(f"{PREFIX}{path}: the recipe is ")
    assert f"the limit is {MAX_RECIPE_BYTES // 1024} KiB" in message


def test_a_recipe_just_under_the_cap_plans(tmp_path: Path) -> None:
    path = write(tmp_path / "padded.yaml", good(), padding=MAX_RECIPE_BYTES - 5_000)
    assert MAX_RECIPE_BYTES - 6_000 < path.stat().st_size <= MAX_RECIPE_BYTES
    result = enginectl(tmp_path, "plan", str(path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("section", "value", "field", "limit"),
    [
        ("shape", shapes(MAX_SHAPES + 1), "matrix.shape", MAX_SHAPES),
        ("exclude", [{"tp": 1, "quant": "fp8"}] * (MAX_FILTERS + 1), "matrix.exclude",
         MAX_FILTERS),
    ],
)
def test_a_list_past_its_cap_names_the_cap(tmp_path: Path, section: str, value: Any,
                                           field: str, limit: int) -> None:
    data = good()
    data["matrix"][section] = value
    path = write(tmp_path / "long.yaml", data)
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(path)))
    assert message.startswith(f"{PREFIX}{path}:"), message
    assert f": {field}: " in message
    assert f"at most {limit} items" in message


def test_a_matrix_of_too_many_targets_is_refused(tmp_path: Path) -> None:
    data = good()
    data["matrix"].update(gpu=["h100", "h200", "h100-nvl", "gh200", "b200"], tp=[8, 4],
                          quant=["fp8", "int4_awq"], exclude=[], shape=shapes(40))
    path = write(tmp_path / "wide.yaml", data)
    message = assert_one_line_error(enginectl(tmp_path, "plan", str(path)))
    assert message.startswith(f"{PREFIX}{path}:"), message
    assert ": matrix: the matrix makes 2400 targets" in message
    assert f"the limit is {MAX_TARGETS}" in message
