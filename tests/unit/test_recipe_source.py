"""Reading a recipe touches nothing but the recipe; what its model source says is read by
planning (`pipeline.planning.source`), with the same messages, and cached while the source
is unchanged."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import RecipeError
from pipeline.planning.source import model_source
from pipeline.recipe.reader import parse_recipe

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 256, "max_position_embeddings": 512,
}


def recipe_text(source: str, **model: Any) -> str:
    return yaml.safe_dump({
        "model": {"name": "tiny", "source": source, **model},
        "matrix": {"gpu": "cpu", "shape": [
            {"name": "s", "max_batch_size": 1, "max_input_len": 16, "max_seq_len": 32}]},
        "serve": {"vllm": {}},
    }, sort_keys=False)


def model_dir(root: Path) -> Path:
    directory = root / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    (directory / "model.safetensors").write_bytes(b"A" * 64)
    return directory


def test_reading_validates_without_the_source(tmp_path: Path) -> None:
    """A local source that is not there, a branch to resolve with the Hub switched off and a
    calibration file that is missing: the recipe still reads; planning says what is wrong."""
    path = tmp_path / "recipe.yaml"
    loaded = parse_recipe(path, recipe_text("missing-model"))
    assert loaded.recipe.model.source == "missing-model"
    with pytest.raises(RecipeError, match=r"missing-model' has no config\.json") as caught:
        model_source(loaded)
    assert (caught.value.field, caught.value.line) == ("model.source", 3)

    remote = parse_recipe(path, recipe_text(
        "hf://org/repo", revision="main", resolve_revision=True,
        architecture={"num_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}))
    assert remote.recipe.model.revision == "main"


def test_a_remote_source_without_architecture_is_refused_when_read(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="is not local, so declare the architecture"):
        parse_recipe(tmp_path / "recipe.yaml",
                     recipe_text("hf://org/repo", revision="0" * 40))


def test_the_source_digest_follows_the_files(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    weights = directory / "model.safetensors"
    old = time.time() - 60  # not racy: cached
    os.utime(weights, (old, old))
    loaded = parse_recipe(tmp_path / "recipe.yaml", recipe_text("model"))
    first = model_source(loaded)
    assert first.architecture.num_layers == 2
    assert model_source(loaded).digest == first.digest
    weights.write_bytes(b"B" * 64)  # same size, and the old mtime again
    os.utime(weights, (old, old))
    assert model_source(loaded).digest != first.digest
