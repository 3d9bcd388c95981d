"""The Python API deploy tools import: Context as a context manager, str paths, pull."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.deploy.pull import Pulled, pull
from pipeline.serving.compare import compare
from pipeline.serving.compare_html import write_html
from registry.config import RegistryConfig
from registry.context import Context
from registry.ops.adopt import ImportSpec, import_artifact
from registry.ops.fetch import fetch
from registry.ops.publish import publish
from tests.deploy import artifacts


def test_a_deploy_tool_pulls_with_a_context_manager_and_str_paths(
    ctx: Context, tmp_path: Path
) -> None:
    config: RegistryConfig = ctx.config
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (source / "model.safetensors").write_bytes(b"\1" * 1000)
    with Context(config) as mine:
        assert isinstance(mine, Context)
        checkpoint = publish(mine, str(source), kind="hf-checkpoint", labels={"model": "m"})
        entry = artifacts.vllm_entry(mine, tmp_path / "entry", checkpoint.digest)
        engine = import_artifact(mine, str(artifacts_dir(tmp_path)), ImportSpec(
            kind="trtllm-checkpoint", model="m", quant="bf16", status="ready"))
        fetched = fetch(mine, engine.digest, str(tmp_path / "fetched"))
        pulled = pull(mine, entry, str(tmp_path / "pulled"), executable=sys.executable)
        artifacts.smoked(mine, entry, "CPU", 10.0)
        page = write_html(compare(mine, "m"), str(tmp_path / "compare.html"))
        pool = mine.registry._engine.pool  # is the registry really closed?
        assert pool.checkedin() >= 1
    assert mine.registry._engine.pool.checkedin() == 0  # closed on exit
    assert fetched.path == tmp_path / "fetched"
    assert isinstance(pulled, Pulled)
    assert (pulled.directory, pulled.digest, pulled.runtime) == (
        tmp_path / "pulled", entry, "vllm")
    assert pulled.argv[0] == sys.executable
    assert page == tmp_path / "compare.html"


def artifacts_dir(tmp_path: Path) -> Path:
    root = tmp_path / "pytorch-ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "model.safetensors").write_bytes(b"\2" * 1000)
    return root
