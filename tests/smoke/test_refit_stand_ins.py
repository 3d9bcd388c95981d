"""The stand-ins of trtllm-build --strip_plan, trtllm-refit and trtllm-serve do what the real
tools do with weights (tests/fakes/weights.py says what each follows): a whole engine carries
its checkpoint rank's weight bytes, a stripped plan only their names and is not served as it
is, and trtllm-refit matches the checkpoint's weights by name into a whole engine, refusing a
missing weight or another architecture."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.weights import read_engine, read_safetensors
from tests.helpers import FAKES
from tests.integration.builds import make_model

BIN = FAKES / "bin"


def tool(*argv: str | Path, code: int = 0) -> str:
    done = subprocess.run([sys.executable, str(BIN / str(argv[0])), *map(str, argv[1:])],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == code, (done.stdout, done.stderr)
    return done.stdout + done.stderr


def checkpoint(tmp_path: Path, tp: int = 2) -> Path:
    model = make_model(tmp_path / "model")
    out = tmp_path / "checkpoint"
    subprocess.run([sys.executable, str(FAKES / "examples/models/core/llama/convert_checkpoint.py"),
                    "--model_dir", str(model), "--output_dir", str(out), "--tp_size", str(tp)],
                   check=True, capture_output=True, timeout=120)
    return out


def build(ckpt: Path, out: Path, *extra: str) -> Path:
    tool("trtllm-build", "--checkpoint_dir", ckpt, "--output_dir", out,
         "--output_timing_cache", out.parent / f"{out.name}.cache", *extra)
    return out


def test_whole_engine_carries_its_rank_weights_and_a_stripped_plan_none(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path)
    whole = build(ckpt, tmp_path / "whole")
    stripped = build(ckpt, tmp_path / "stripped", "--strip_plan")
    for rank in (0, 1):
        weights = read_safetensors(ckpt / f"rank{rank}.safetensors")
        assert sum(len(data) for _, data in weights.values()) == 2048  # half of 4096 bytes
        header, body = read_engine(whole / f"rank{rank}.engine")
        assert body == b"".join(weights[name][1] for name in sorted(weights))
        header, body = read_engine(stripped / f"rank{rank}.engine")
        assert header["stripped"] is True
        assert body == b""
        assert sorted(header["weights"]) == sorted(weights)
    config = json.loads((stripped / "config.json").read_text())
    assert config["build_config"]["use_strip_plan"] is True


def test_refit_writes_the_whole_engine_from_the_checkpoint(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path)
    whole = build(ckpt, tmp_path / "whole")
    stripped = build(ckpt, tmp_path / "stripped", "--strip_plan")
    out = tmp_path / "refitted"
    tool("trtllm-refit", "--engine_dir", stripped, "--checkpoint_dir", ckpt, "--output_dir", out)
    for rank in (0, 1):
        assert read_engine(out / f"rank{rank}.engine")[1] == \
            read_engine(whole / f"rank{rank}.engine")[1]
    assert (out / "config.json").read_bytes() == (stripped / "config.json").read_bytes()


def test_refit_refuses_a_missing_weight_and_another_architecture(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path)
    stripped = build(ckpt, tmp_path / "stripped", "--strip_plan")
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((ckpt / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architecture": "GemmaForCausalLM"}))
    said = tool("trtllm-refit", "--engine_dir", stripped, "--checkpoint_dir", other,
                "--output_dir", tmp_path / "a", code=1)
    assert "Engine Architecture and Checkpoint Architecture do not match" in said
    from tests.fakes.weights import write_safetensors

    (other / "config.json").write_text(json.dumps(config))
    for rank in (0, 1):  # one weight short
        kept = dict(list(read_safetensors(ckpt / f"rank{rank}.safetensors").items())[1:])
        write_safetensors(other / f"rank{rank}.safetensors",
                          {n: (e["dtype"], e["shape"], d) for n, (e, d) in kept.items()})
    said = tool("trtllm-refit", "--engine_dir", stripped, "--checkpoint_dir", other,
                "--output_dir", tmp_path / "b", code=1)
    assert "Missing refittable weights" in said
    for rank in (0, 1):  # every weight there, the first one cut short
        found = list(read_safetensors(ckpt / f"rank{rank}.safetensors").items())
        write_safetensors(other / f"rank{rank}.safetensors", {
            n: (e["dtype"], e["shape"], d[:-2] if i == 0 else d)
            for i, (n, (e, d)) in enumerate(found)})
    said = tool("trtllm-refit", "--engine_dir", stripped, "--checkpoint_dir", other,
                "--output_dir", tmp_path / "d", code=1)
    assert "Failed to refit weight: `" in said
    tool("trtllm-refit", "--engine_dir", stripped, "--output_dir", tmp_path / "c", code=1)


def test_serve_refuses_a_stripped_plan(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path, tp=1)
    stripped = build(ckpt, tmp_path / "stripped", "--strip_plan")
    said = tool("trtllm-serve", stripped, "--backend", "tensorrt", "--port", "1", code=1)
    assert "weight-stripped engine" in said
