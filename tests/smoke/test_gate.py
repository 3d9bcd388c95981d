"""The gate on a real failure: a model vLLM's CPU backend reports healthy for and then cannot
serve (head_dim 16) must end quarantined, never ready; build exits 5; its stored smoke report
says the server listened and its first generation failed, with vLLM's own cause; nothing the
build started outlives it; resolve skips it; tag refuses it."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import yaml

from tests.cli_forkserver import ENGINECTL, run_cli
from tests.helpers import enginectl
from tests.models import TinyModels
from tests.processes import TAG, tagged_processes


def test_a_model_that_cannot_generate_is_quarantined(
    vllm_python: Path, tiny_models: TinyModels, tmp_path: Path
) -> None:
    recipe = {
        "model": {"name": "broken-llama", "source": str(tiny_models.head_dim_16)},
        "matrix": {"gpu": ["cpu"], "shape": [
            {"name": "tiny", "max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256}]},
        "serve": {"vllm": {"enforce_eager": True}},
        "smoke": {"max_tokens": 4, "concurrency": [1], "requests": 2, "ready_timeout_s": 600},
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(recipe))
    tag = uuid.uuid4().hex  # inherited by the build's server and all it starts
    env = {**os.environ, "ENGINECTL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "ENGINECTL_VLLM_PYTHON": str(vllm_python), TAG: tag}
    done = run_cli([ENGINECTL, "build", str(path)], env=env, timeout=1200)
    assert done.returncode == 5, (done.stdout, done.stderr)
    assert tagged_processes(tag) == [], "the failed server left processes behind"
    note, line = done.stderr.strip().splitlines()
    assert note.startswith("enginectl: note: using store ")
    assert "quarantined" in line
    assert "ready:" in line
    listed = json.loads(enginectl(env, "ls", "--json", "--kind", "vllm").stdout)
    (entry,) = listed
    assert entry["status"] == "quarantined"
    shown = json.loads(enginectl(env, "show", entry["digest"], "--json").stdout)
    (report,) = shown["smoke_reports"]
    assert report["passed"] is False
    smoked = report["report"]
    assert smoked["ready_s"] is None
    assert smoked["load"] == []
    assert smoked["failure"].startswith("ready: ")
    assert "HTTP 500" in smoked["failure"]  # it listened, and its first generation failed
    (ready,) = [c for c in smoked["checks"] if c["name"] == "ready"]
    assert "head_dim" in (ready["evidence"]["cause"] or ""), ready["evidence"]["log_tail"]
    refused = run_cli([ENGINECTL, "resolve", "--model", "broken-llama", "--gpu", "cpu"], env=env)
    assert refused.returncode == 6  # nothing that serves: not found, not an outage
    tag = run_cli([ENGINECTL, "tag", entry["digest"], "broken/cpu/prod",
                   "--allow-unready"], env=env)
    assert tag.returncode == 2
    assert "quarantined" in tag.stderr
