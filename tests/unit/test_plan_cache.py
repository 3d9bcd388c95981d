"""The plan a build remembers (`pipeline.planning.plan_cache`) is taken only while nothing it
depends on changed: each dependency changed alone makes it a miss, and a file that cannot be
trusted is one too."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pipeline.planning.file_stats import RACY_S
from pipeline.planning.plan import plan_recipe
from pipeline.planning.plan_cache import (
    cache_dir,
    facts_of,
    remember_plan,
    remembered_plan,
)
from pipeline.planning.source import read_recipe
from pipeline.planning.toolchain import BUILDER_IMAGE, Toolchain, for_build
from pipeline.settings import Settings

PROBED = replace(BUILDER_IMAGE, driver="570.133.20", vllm="0.32.0")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model whose files changed longer ago than RACY_S (a plan of a model changed
    just now is never remembered)."""
    root = tmp_path_factory.mktemp("model")
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 128,
        "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 4096}))
    (root / "weights.bin").write_bytes(b"\0" * 64)
    time.sleep(RACY_S + 0.1)  # not a timing assertion: the racy rule's own window
    return root


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"ENGINECTL_HOME": str(tmp_path / "home"),
                              "ENGINECTL_PYTHON": "/usr/bin/python3",
                              "ENGINECTL_VLLM_PYTHON": "/usr/bin/python3"})


def write(tmp_path: Path, model: Path, **extra: object) -> Path:
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "toy", "source": str(model)},
        "matrix": {"gpu": ["h100"], "quant": ["bf16"], "shape": [
            {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}]},
        "serve": {"trtllm": {}}, **extra}))
    return recipe


def remember(recipe: Path, settings: Settings, toolchain: Toolchain = PROBED) -> object:
    """Plan *recipe* as a build does and remember it; the plan's facts."""
    started = time.time()
    raw = recipe.read_bytes()
    loaded = read_recipe(recipe)
    plan = plan_recipe(loaded, settings, for_build(toolchain, loaded.recipe.toolchain))
    assert remember_plan(recipe, raw, plan, settings, toolchain, started=started)
    return facts_of(plan)


def test_an_unchanged_plan_is_taken_as_planned(tmp_path: Path, model: Path,
                                               settings: Settings) -> None:
    recipe = write(tmp_path, model)
    facts = remember(recipe, settings)
    found = remembered_plan(recipe, settings, PROBED)
    assert found is not None
    assert (found.digest, found.path) == (facts.digest, str(recipe.resolve()))
    assert (found.chains, found.channels) == (facts.chains, facts.channels)
    assert {k: r.as_dict() for k, r in found.stages.items()} == \
        {k: r.as_dict() for k, r in facts.stages.items()}


def test_a_changed_recipe_is_planned_again(tmp_path: Path, model: Path,
                                          settings: Settings) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    recipe.write_text(recipe.read_text() + "# a comment changes the bytes alone\n")
    assert remembered_plan(recipe, settings, PROBED) is None
    write(tmp_path, model, build={"workers": 2})
    assert remembered_plan(recipe, settings, PROBED) is None


@pytest.mark.parametrize("changed", [
    {"trtllm_examples": Path("/elsewhere/examples")},
    {"python": "/opt/builder/bin/python"},
    {"vllm_python": "/opt/vllm/bin/python"},
])
def test_changed_settings_are_planned_again(tmp_path: Path, model: Path, settings: Settings,
                                            changed: dict[str, object]) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    assert remembered_plan(recipe, replace(settings, **changed), PROBED) is None  # type: ignore[arg-type]


def test_a_changed_enginectl_variable_is_planned_again(
        tmp_path: Path, model: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    monkeypatch.setenv("ENGINECTL_SOMETHING_NEW", "1")
    assert remembered_plan(recipe, settings, PROBED) is None


@pytest.mark.parametrize("field", ["driver", "vllm", "trtllm", "image", "gpu"])
def test_a_changed_probe_is_planned_again(tmp_path: Path, model: Path, settings: Settings,
                                          field: str) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    assert remembered_plan(recipe, settings, replace(PROBED, **{field: "other"})) is None


def test_a_changed_model_file_is_planned_again(tmp_path: Path,
                                               tmp_path_factory: pytest.TempPathFactory,
                                               settings: Settings) -> None:
    root = tmp_path_factory.mktemp("own-model")
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 128,
        "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 1000}))
    weights = root / "weights.bin"
    weights.write_bytes(b"\0" * 64)
    recipe = write(tmp_path, root)
    started = time.time()
    loaded = read_recipe(recipe)
    plan = plan_recipe(loaded, settings, for_build(PROBED, loaded.recipe.toolchain))
    # the model changed a moment ago: a plan of it is not remembered (it may change again
    # within its mtime's tick)
    assert not remember_plan(recipe, recipe.read_bytes(), plan, settings, PROBED,
                             started=started)
    time.sleep(RACY_S + 0.1)
    remember(recipe, settings)
    assert remembered_plan(recipe, settings, PROBED) is not None
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert remembered_plan(recipe, settings, PROBED) is None  # same size, another mtime
    time.sleep(RACY_S + 0.1)
    remember(recipe, settings)
    (root / "extra.bin").write_bytes(b"1")
    assert remembered_plan(recipe, settings, PROBED) is None  # a file more


@pytest.mark.parametrize("content", [b"", b"{not json", b"[]", b'{"schema": 0}',
                                     b'{"schema": 1, "key": "x"}'])
def test_a_corrupt_or_other_file_is_a_miss(tmp_path: Path, model: Path, settings: Settings,
                                          content: bytes) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    (entry,) = (cache_dir(settings) / "plans").iterdir()
    entry.write_bytes(content)
    assert remembered_plan(recipe, settings, PROBED) is None


def test_another_schema_is_a_miss(tmp_path: Path, model: Path, settings: Settings) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    (entry,) = (cache_dir(settings) / "plans").iterdir()
    data = json.loads(entry.read_bytes())
    entry.write_text(json.dumps({**data, "schema": data["schema"] + 1}))
    assert remembered_plan(recipe, settings, PROBED) is None
    entry.write_text(json.dumps({**data, "facts": {**data["facts"], "stages": "?"}}))
    assert remembered_plan(recipe, settings, PROBED) is None


def test_a_recipe_named_from_elsewhere_is_its_own_entry(
        tmp_path: Path, model: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = write(tmp_path, model)
    remember(recipe, settings)
    monkeypatch.chdir(tmp_path)
    assert remembered_plan(Path("toy.yaml"), settings, PROBED) is None  # named another way
