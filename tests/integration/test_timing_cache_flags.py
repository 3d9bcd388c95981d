"""The trtllm-build stand-in alone, as TensorRT-LLM 1.2's trtllm-build treats its timing-cache
flags (--input_timing_cache, --output_timing_cache): defaults, relative paths, a missing,
foreign or damaged cache (tests/fakes/trtllm_builder.py cites the source). Through enginectl's
builds: test_timing_cache.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import FAKES
from tests.integration.builds import GUARD_S


def checkpoint(directory: Path) -> Path:
    """A TRT-LLM checkpoint as the convert stand-in writes one (tp 1)."""
    directory.mkdir(parents=True)
    config = {"architecture": "LlamaForCausalLM", "dtype": "bfloat16", "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 128,
              "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 4096,
              "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
              "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "rank0.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return directory


def stand_in(tmp_path: Path, cwd: Path, *flags: str, **knobs: str
             ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    record = tmp_path / "stand-in.jsonl"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env |= {"FAKE_TRTLLM_TIMING_LOG": str(record), **knobs}
    done = subprocess.run(
        [sys.executable, str(FAKES / "bin" / "trtllm-build"), "--checkpoint_dir",
         str(tmp_path / "ckpt"), "--output_dir", "engine", "--max_batch_size", "4", *flags],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    return done, json.loads(record.read_text())


def test_the_stand_in_honours_the_timing_cache_flags_as_trtllm_build_1_2(tmp_path: Path) -> None:
    checkpoint(tmp_path / "ckpt")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done, run = stand_in(tmp_path, cwd)  # no flag: BuildConfig's 'model.cache', in the cwd
    assert run["output_timing_cache"] == str((cwd / "model.cache").resolve())
    assert "Timing cache serialized to model.cache" in done.stdout
    assert not (cwd / "engine" / "model.cache").exists()
    fresh = json.loads((cwd / "model.cache").read_bytes())
    assert (run["loaded"], run["hits"], run["entries"]) == (None, 0, len(fresh["entries"]))

    _, run = stand_in(tmp_path, cwd, "--output_timing_cache", "rel.cache")
    assert run["output_timing_cache"] == str((cwd / "rel.cache").resolve())  # not output_dir's

    done, run = stand_in(tmp_path, cwd, "--input_timing_cache", "missing.cache")
    assert "Invalid timing cache, using freshly created one" in done.stdout
    assert run["loaded"] is None

    _, run = stand_in(tmp_path, cwd, "--input_timing_cache", "model.cache",
                      "--output_timing_cache", "again.cache")
    assert (run["loaded"], run["hits"], run["misses"]) == (len(fresh["entries"]),) * 2 + (0,)

    done, run = stand_in(tmp_path, cwd, "--input_timing_cache", "model.cache",
                         "--output_timing_cache", "newer.cache", FAKE_TENSORRT_VERSION="10.15.0.1")
    assert "[TRT] [E] 4: The timing cache will not be used!" in done.stderr
    assert run["loaded"] is None  # built cold, and wrote a cache of its own version
    assert json.loads((cwd / "newer.cache").read_bytes())["tensorrt"] == "10.15.0.1"

    done, run = stand_in(tmp_path, cwd, "--input_timing_cache", "model.cache",
                         "--output_timing_cache", "a100.cache", FAKE_TRTLLM_SM="80")
    assert "Detected invalid timing cache, setup a local cache instead" in done.stderr
    assert run["loaded"] is None
    a100 = json.loads((cwd / "a100.cache").read_bytes())
    assert a100["device"]["sm"] == 80
    assert all(a100["entries"][key] != tactic for key, tactic in fresh["entries"].items())

    (cwd / "junk.cache").write_bytes(b"junk")
    done, run = stand_in(tmp_path, cwd, "--input_timing_cache", "junk.cache",
                         "--output_timing_cache", "after-junk.cache")
    assert "Magic tag does not match" in done.stderr
    assert run["loaded"] is None
