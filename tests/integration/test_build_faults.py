"""`enginectl build` catches a TensorRT-LLM tool that misbehaves as the real one can.

The stand-ins (tests/fakes) are told through their environment knobs to leave a rank out,
crash half way through, clamp max_num_tokens or build other plugin settings than asked. Each
time the stage fails with exit 3 and one line that names what is wrong, and nothing is
published for it, while the stages before it are kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from registry.sql.db import open_registry
from registry.sql.records import list_artifacts
from tests.integration.builds import build, make_model


def engine_recipe(directory: Path) -> Path:
    """One tp 2 engine target with a max_num_tokens, nothing else."""
    make_model(directory / "model")
    recipe = {
        "model": {"name": "toy", "source": "./model"},
        "matrix": {"gpu": ["h100"], "tp": [2], "quant": ["bf16"], "shape": [
            {"name": "small", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512,
             "max_num_tokens": 1024}]},
        "serve": {"trtllm": {}},
    }
    path = directory / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


FAULTS = {
    "missing-rank": ({"FAKE_TRTLLM_SKIP_RANK": "1"},
                     "build", "has ['rank0.engine'], expected ['rank0.engine', 'rank1.engine']"),
    "crash-half-way": ({"FAKE_TRTLLM_CRASH_AFTER": "1"},
                       "build", "trtllm-build exited -9"),
    "clamped-max-num-tokens": ({"FAKE_TRTLLM_MAX_NUM_TOKENS": "512"},
                               "build", ("engine build_config max_num_tokens is 512, the target "
                                         "asked for 1024")),
    "other-plugin-config": ({"FAKE_TRTLLM_PLUGIN_CONFIG": '{"use_paged_context_fmha": false}'},
                            "build", ("plugin_config.use_paged_context_fmha is False, the plan "
                                      "asked for True")),
    "convert-missing-rank": ({"FAKE_CONVERT_SKIP_RANK": "0"},
                             "convert", ("has ['rank1.safetensors'], expected "
                                         "['rank0.safetensors', 'rank1.safetensors']")),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_misbehaving_tool_fails_its_stage_and_publishes_nothing(
    fault: str, env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    knobs, stage, message = FAULTS[fault]
    recipe = engine_recipe(tmp_path)

    done = build({**env, **knobs}, recipe, code=3)

    # the note naming the store and registry, then one error line that says it once
    lines = [line for line in done.stderr.strip().splitlines()
             if not line.startswith("enginectl: note: using store")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"enginectl: error: {stage} ")
    assert message in lines[0]
    assert len(re.findall(rf"\b{stage} [0-9a-f]{{12}} \(", lines[0])) == 1, lines[0]
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        kinds = {artifact.kind for artifact in list_artifacts(session)}
    assert "trtllm-engine" not in kinds
    assert ("converted-checkpoint" in kinds) is (stage == "build")  # upstream work is kept
    assert "hf-checkpoint" in kinds


def test_the_same_build_without_the_fault_publishes_what_trtllm_built(
    env: dict[str, str], tmp_path: Path, registry_url: str
) -> None:
    """The stand-in's honest build passes every check, and the engine says what TRT-LLM
    builds: the shape and the plugin settings its flags say."""
    recipe = engine_recipe(tmp_path)
    build({**env, "FAKE_TRTLLM_SKIP_RANK": "1"}, recipe, code=3)

    summary = json.loads(build(env, recipe, "--json", "--keep-work").stdout)

    assert summary["failed"] == 0
    with open_registry(registry_url) as registry, registry.session(readonly=True) as session:
        (engine,) = list_artifacts(session, kind="trtllm-engine")
    assert {f.path for f in engine.files} >= {"config.json", "rank0.engine", "rank1.engine"}
    work = tmp_path / "home" / "work"
    (config_path,) = work.glob("build-*/out/config.json")
    config = json.loads(config_path.read_text())["build_config"]
    assert (config["max_seq_len"], config["max_num_tokens"]) == (512, 1024)
    assert config["plugin_config"]["use_paged_context_fmha"] is True
