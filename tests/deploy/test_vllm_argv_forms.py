"""vLLM's two serve commands: a GPU target's entry records `vllm serve MODEL …` (run as
`python -m vllm.entrypoints.cli.main serve`, what vLLM 0.32 documents); a CPU target's, and
every entry published before, `python -m vllm.entrypoints.openai.api_server --model MODEL …`
(deprecated in 0.32, still served; the CPU build cannot run `vllm serve`). pull moves both to
this node; what is neither is refused."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.deploy.command import Template, node_argv, served_name, template
from pipeline.deploy.pull import pull
from pipeline.recipe.schema import VllmServe
from pipeline.stages.serve import (
    VLLM_API_SERVER,
    VLLM_SERVE,
    VllmServing,
    vllm_argv,
    vllm_form,
    vllm_model,
)
from registry.context import Context
from registry.errors import ManifestError
from registry.ops.marker import SERVE_FILE
from registry.ops.publish import publish
from tests.deploy import artifacts

PYTHON = sys.executable  # stands in for vLLM's Python: pull never runs it
# What `vllm_argv` recorded before issue 22 (the entry of an artifact already published).
OLD_ARGV = [artifacts.BUILDER_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
            "--model", "{model_dir}", "--served-model-name", "m", "--host", "127.0.0.1",
            "--port", "{port}", "--dtype", "bfloat16", "--tensor-parallel-size", "1",
            "--pipeline-parallel-size", "1", "--max-model-len", "256", "--max-num-seqs", "4",
            "--gpu-memory-utilization", "0.9", "--enforce-eager"]


def entry_with(ctx: Context, root: Path, source: str, argv: list[str]) -> str:
    serve = {"argv": argv, "model_dir": "input"}
    root.mkdir(parents=True)
    (root / "enginectl-entry.json").write_text(json.dumps({"runtime": "vllm", "serve": serve}))
    labels: dict[str, Any] = {"model": "m", "runtime": "vllm", "quant": "bf16", "tp": 1,
                              "pp": 1, **artifacts.SHAPE.model_dump(exclude={"name"})}
    return publish(ctx, root, kind="vllm", labels=labels, status="ready", inputs=(source,),
                   serve=serve).digest


def test_a_gpu_targets_entry_is_served_with_vllm_serve(ctx: Context, tmp_path: Path) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    argv = vllm_argv(artifacts.BUILDER_PYTHON, VllmServing(artifacts.SHAPE, VllmServe(), cpu=False),
                     model_dir=Path("{model_dir}"), served_name="m")
    entry = entry_with(ctx, tmp_path / "entry", source, argv)
    dest = tmp_path / "models"
    pulled = pull(ctx, entry, str(dest), executable=PYTHON, host="127.0.0.1", port=9002)
    argv = pulled.argv
    assert argv[:5] == [PYTHON, *VLLM_SERVE, str(dest)]
    assert "--model" not in argv  # `vllm serve` warns that --model will be removed
    assert json.loads((dest / SERVE_FILE).read_text())["served_model_name"] == "m"
    assert shlex.split(pulled.command) == argv


def test_an_entry_published_before_keeps_its_api_server_command(ctx: Context,
                                                                tmp_path: Path) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = entry_with(ctx, tmp_path / "entry", source, OLD_ARGV)
    dest = tmp_path / "models"
    pulled = pull(ctx, entry, str(dest), executable=PYTHON, host="0.0.0.0", port=9003)  # noqa: S104
    argv = pulled.argv
    assert argv[:3] == [PYTHON, *VLLM_API_SERVER]
    assert argv[argv.index("--model") + 1] == str(dest)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"  # noqa: S104
    assert argv[argv.index("--port") + 1] == "9003"
    assert artifacts.BUILDER_PYTHON not in argv
    assert json.loads((dest / SERVE_FILE).read_text())["served_model_name"] == "m"


def test_the_model_served_is_found_in_either_form() -> None:
    new = [PYTHON, *VLLM_SERVE, "/models/x", "--port", "1"]
    old = [PYTHON, *VLLM_API_SERVER, "--port", "1", "--model", "/models/y"]
    assert (vllm_form(new), vllm_model(new)) == ("serve", "/models/x")
    assert (vllm_form(old), vllm_model(old)) == ("api_server", "/models/y")
    assert served_name(new, "vllm", "/d") == "/models/x"  # no --served-model-name: the model
    assert served_name(old, "vllm", "/d") == "/models/y"
    assert vllm_form(["python", "-m", "vllm.entrypoints.cli.main", "bench"]) is None
    assert vllm_form(["vllm", "serve", "/m"]) is None  # not through vLLM's Python


def test_an_imported_entry_gets_the_command_its_gpu_runs() -> None:
    labels = {"model": "m", "tp": 2, "max_seq_len": 256}
    digest = "sha256:" + "0" * 64
    for gpu, head in ((None, [PYTHON, *VLLM_API_SERVER, "--model", "/models/m"]),
                      ("H100-SXM5-80GB", [PYTHON, *VLLM_SERVE, "/models/m"])):
        found = template(digest, "vllm", {**labels, "gpu": gpu}, None)
        argv = node_argv(found, executable=PYTHON, model_dir="/models/m", host="127.0.0.1",
                         port=8)
        assert argv[:len(head)] == head
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert served_name(argv, "vllm", "/models/m") == "m"


def test_a_command_that_is_not_vllms_is_refused() -> None:
    found = Template(("python", "-m", "some.other.server", "--model", "{model_dir}"), "input",
                     "vllm", recorded=True)
    with pytest.raises(ManifestError, match="pull cannot move it"):
        node_argv(found, executable=PYTHON, model_dir="/m", host="127.0.0.1", port=8)
