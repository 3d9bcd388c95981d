"""pipeline.stages.quantizer end to end: real modelopt calibration and export of the tiny
Llama on CPU.

Each run goes through the argv that pipeline.stages.quantize.quantize_argv emits, in a
subprocess, as the plan runs it; the checks read the files a TRT-LLM or vLLM loader would read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.stages.quantizer.checks import (
    source_rope_theta,
    validate_hf_checkpoint,
    validate_trtllm_checkpoint,
)
from pipeline.stages.quantizer.options import PROVENANCE, QuantizerError, build_parser
from tests.helpers import ROOT
from tests.models import offline_env
from tests.quantize.runs import (
    CALIB_FILE,
    CLI_DATA,
    QuantizerRun,
    RunQuantizer,
    quantizer_argv,
    run_argv,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def tensor_names(path: Path) -> set[str]:
    """The tensor names in a safetensors file's header (no torch needed)."""
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    return {name for name in header if name != "__metadata__"}


def assert_one_error_line(run: QuantizerRun, *fragments: str) -> None:
    assert run.returncode == 1, run.stderr
    lines = run.error_lines()
    assert len(lines) == 1, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in run.stderr


def assert_tokenizer_copied(model_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        assert (out / name).read_bytes() == (model_dir / name).read_bytes(), name


# --- TensorRT-LLM checkpoints ---------------------------------------------------------------


def test_fp8_trtllm_checkpoint(tiny_model: Path, fp8_checkpoint: QuantizerRun) -> None:
    out = fp8_checkpoint.output_dir
    config = read_json(out / "config.json")
    assert config["quantization"]["quant_algo"] == "FP8"
    assert config["quantization"]["kv_cache_quant_algo"] is None
    assert config["mapping"]["tp_size"] == 1
    assert config["mapping"]["pp_size"] == 1
    assert sorted(p.name for p in out.glob("rank*")) == ["rank0.safetensors"]
    assert config["rotary_base"] == read_json(tiny_model / "config.json")["rope_theta"]
    names = tensor_names(out / "rank0.safetensors")
    assert "transformer.layers.0.attention.qkv.weights_scaling_factor" in names
    assert "lm_head.weight" in names
    assert_tokenizer_copied(tiny_model, out)
    assert "calibrating fp8 on 16 samples" in fp8_checkpoint.stderr
    assert "exporting a TensorRT-LLM checkpoint" in fp8_checkpoint.stderr

    record = read_json(out / PROVENANCE)
    assert record["qformat"] == "fp8"
    assert record["quant_algo"] == "FP8"
    assert record["kv_cache_dtype"] is None
    assert record["calibration"]["sha256"] == hashlib.sha256(CALIB_FILE.read_bytes()).hexdigest()
    assert record["calibration"]["samples"] == 16
    assert record["calibration"]["dataset"] == "tiny.jsonl"
    assert set(record["versions"]) == {"torch", "transformers", "modelopt"}
    assert record["versions"]["modelopt"].startswith("0.37.")
    assert set(record["files"]) >= {"config.json", "rank0.safetensors", *TOKENIZER_FILES}
    assert not list(out.parent.glob(".out.partial-*")), "the staging directory was left behind"


def test_fp8_kv_cache_is_quantized_and_recorded(
    tiny_model: Path, run_quantizer: RunQuantizer
) -> None:
    run = run_quantizer(tiny_model, quant="fp8", kv_cache_dtype="fp8")
    assert run.returncode == 0, run.stderr
    assert "--kv_cache_dtype" in run.argv
    config = read_json(run.output_dir / "config.json")
    assert config["quantization"]["quant_algo"] == "FP8"
    assert config["quantization"]["kv_cache_quant_algo"] == "FP8"
    names = tensor_names(run.output_dir / "rank0.safetensors")
    assert "transformer.layers.1.attention.kv_cache_scaling_factor" in names
    record = read_json(run.output_dir / PROVENANCE)
    assert record["kv_cache_dtype"] == "fp8"
    assert record["kv_cache_quant_algo"] == "FP8"


def test_int4_awq_trtllm_checkpoint_tp2(tiny_model: Path, run_quantizer: RunQuantizer) -> None:
    # Hidden 128 split over tp 2 leaves 64 input features per rank in o_proj: block 64.
    # 40 samples: more than TRT-LLM's quantize.py would use for AWQ (32); all are used.
    run = run_quantizer(tiny_model, quant="int4_awq", awq_block_size=64, tp=2, samples=40)
    assert run.returncode == 0, run.stderr
    out = run.output_dir
    config = read_json(out / "config.json")
    assert config["quantization"]["quant_algo"] == "W4A16_AWQ"
    assert config["quantization"]["group_size"] == 64
    assert config["mapping"]["tp_size"] == 2
    assert config["mapping"]["world_size"] == 2
    assert sorted(p.name for p in out.glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    for rank in (0, 1):
        names = tensor_names(out / f"rank{rank}.safetensors")
        assert "transformer.layers.0.mlp.fc.weights_scaling_factor" in names
    record = read_json(out / PROVENANCE)
    assert record["awq_block_size"] == 64
    assert record["calibration"]["samples"] == 40
    assert "AWQ on all 40 samples, as asked" in run.stderr


def test_awq_block_that_cannot_split_fails_before_calibrating(
    tiny_model: Path, run_quantizer: RunQuantizer
) -> None:
    run = run_quantizer(tiny_model, quant="int4_awq", awq_block_size=128, tp=2)
    assert_one_error_line(run, "--awq_block_size 128", "o_proj", "tp 2")
    assert "calibrating" not in run.stderr
    assert not run.output_dir.exists()


# --- unified Hugging Face checkpoint --------------------------------------------------------


def test_fp8_hf_checkpoint(tiny_model: Path, run_quantizer: RunQuantizer) -> None:
    run = run_quantizer(tiny_model, quant="fp8", export="hf")
    assert run.returncode == 0, run.stderr
    assert "--export_format" in run.argv
    assert "--tp_size" not in run.argv
    out = run.output_dir
    assert list(out.glob("*.safetensors"))
    assert not list(out.glob("rank*.safetensors"))
    quant = read_json(out / "hf_quant_config.json")["quantization"]
    assert quant["quant_algo"] == "FP8"
    config = read_json(out / "config.json")
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["quant_algo"] == "FP8"
    assert_tokenizer_copied(tiny_model, out)
    # What a runtime does first: transformers reads the config and the tokenizer.
    probe = (
        "import json, sys; from transformers import AutoConfig, AutoTokenizer; "
        "c = AutoConfig.from_pretrained(sys.argv[1]); "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps([c.model_type, c.quantization_config['quant_algo'], "
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(out)], env=offline_env(), capture_output=True,
        text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    model_type, algo, chat = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (model_type, algo) == ("llama", "FP8")
    assert "<|start_header_id|>user<|end_header_id|>" in chat
    assert read_json(out / PROVENANCE)["export_format"] == "hf"

    expect: dict[str, Any] = {"qformat": "fp8", "kv_cache_dtype": None, "rope_theta": 10000.0}
    validate_hf_checkpoint(out, **expect)
    with pytest.raises(QuantizerError, match="kv_cache_quant_algo is None, expected 'FP8'"):
        validate_hf_checkpoint(out, **{**expect, "kv_cache_dtype": "fp8"})
    config["rope_theta"] = 500000.0
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(QuantizerError, match=r"rope_theta is 500000\.0 .* source model's is 10000"):
        validate_hf_checkpoint(out, **expect)


# --- the checks on what was exported, on real exported files --------------------------------


def test_rotary_base_check_fires(tiny_model: Path, fp8_checkpoint: QuantizerRun,
                                 tmp_path: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(fp8_checkpoint.output_dir, copy)
    rope_theta = source_rope_theta(tiny_model)
    assert rope_theta == 10000.0
    expect: dict[str, Any] = {"qformat": "fp8", "kv_cache_dtype": None, "tp_size": 1,
                              "pp_size": 1, "awq_block_size": 128}
    validate_trtllm_checkpoint(copy, rope_theta=rope_theta, **expect)

    config = read_json(copy / "config.json")
    config["rotary_base"] = 500000.0
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(QuantizerError, match=r"rotary_base is 500000\.0 .* rope_theta is 10000\.0"):
        validate_trtllm_checkpoint(copy, rope_theta=rope_theta, **expect)

    del config["rotary_base"]  # what modelopt with transformers 5.x writes
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(QuantizerError, match="rotary_base is None"):
        validate_trtllm_checkpoint(copy, rope_theta=rope_theta, **expect)


def test_checkpoint_checks_catch_wrong_ranks_and_algorithms(
    fp8_checkpoint: QuantizerRun, tmp_path: Path
) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(fp8_checkpoint.output_dir, copy)
    expect: dict[str, Any] = {"qformat": "fp8", "kv_cache_dtype": None, "tp_size": 1,
                              "pp_size": 1, "awq_block_size": 128, "rope_theta": 10000.0}
    with pytest.raises(QuantizerError, match="quant_algo is 'FP8', expected 'W4A16_AWQ'"):
        validate_trtllm_checkpoint(copy, **{**expect, "qformat": "int4_awq"})
    with pytest.raises(QuantizerError, match="kv_cache_quant_algo is None, expected 'FP8'"):
        validate_trtllm_checkpoint(copy, **{**expect, "kv_cache_dtype": "fp8"})
    with pytest.raises(QuantizerError, match=r"expected rank0\.safetensors, rank1\.safetensors"):
        validate_trtllm_checkpoint(copy, **{**expect, "tp_size": 2})
    shutil.copyfile(copy / "rank0.safetensors", copy / "rank1.safetensors")
    with pytest.raises(QuantizerError, match=r"found rank0\.safetensors, rank1\.safetensors"):
        validate_trtllm_checkpoint(copy, **expect)


def test_refuses_a_folder_it_did_not_write(
    tiny_model: Path, fp8_checkpoint: QuantizerRun
) -> None:
    """The output is replaced only when the quantizer wrote it; a user's folder is left alone."""
    stranger = fp8_checkpoint.output_dir.parent / "stranger"
    stranger.mkdir(exist_ok=True)
    (stranger / "notes.txt").write_text("mine", encoding="utf-8")
    run = run_argv(quantizer_argv(tiny_model, stranger), stranger)
    assert_one_error_line(run, "is not empty and was not written by quantizer")
    assert (stranger / "notes.txt").read_text(encoding="utf-8") == "mine"


# --- usage and input errors (no model work) -------------------------------------------------


def test_unknown_flags_are_rejected(tmp_path: Path) -> None:
    base = quantizer_argv(tmp_path / "model", tmp_path / "out")
    for extra in (["--no_such_flag", "1"], ["--device", "cpu"], ["--export_fmt", "hf"]):
        run = run_argv([*base, *extra], tmp_path / "out")
        assert run.returncode == 2, run.stderr
        assert "unrecognized arguments" in run.stderr
    run = run_argv([*base, "--qformat", "fp8_pc_pt"], tmp_path / "out")
    assert run.returncode == 2
    assert "invalid choice" in run.stderr
    run = run_argv(
        [*quantizer_argv(tmp_path / "model", tmp_path / "out", export="hf"), "--tp_size", "2"],
        tmp_path / "out",
    )
    assert run.returncode == 2
    assert "drop --tp_size/--pp_size" in run.stderr


def test_missing_calibration_file_is_one_line(tiny_model: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    out = tmp_path / "out"
    run = run_argv(quantizer_argv(tiny_model, out, calib_path=missing), out)
    assert_one_error_line(run, f"calibration file {str(missing)!r} does not exist")
    assert not out.exists()


def test_named_dataset_offline_says_to_use_a_local_file(
    tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = run_argv(quantizer_argv(tiny_model, out, dataset="cnn_dailymail"), out)
    assert "--calib_dataset" in run.argv
    assert run.argv[run.argv.index("--calib_dataset") + 1] == "cnn_dailymail"
    assert_one_error_line(run, "'cnn_dailymail'", "pass a local .jsonl or text file")


def test_flags_are_a_subset_of_trtllm_quantize_py() -> None:
    """Every flag we accept is quantize.py's, spelled the same, with choices it accepts."""
    table = read_json(CLI_DATA / "trtllm-quantize.json")
    theirs = {**table["flags"], **table["variant_flags"]}
    for action in build_parser()._actions:  # argparse has no public list of its actions
        flag = next((s for s in action.option_strings if s.startswith("--")), None)
        if flag in (None, "--help", "--traceback"):  # --traceback is ours: diagnostics only
            continue
        assert flag in theirs, flag
        if action.choices is not None:
            assert set(action.choices) <= set(theirs[flag]["choices"]), flag


def test_make_tiny_model_is_idempotent(tiny_model: Path) -> None:
    stamp = read_json(tiny_model / ".enginectl-tiny-model.json")
    assert stamp["args"]["head_dim"] == 64
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model.iterdir()}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), str(tiny_model)],
        env=offline_env(), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model.iterdir()} == before
    config = read_json(tiny_model / "config.json")
    shape = (config["hidden_size"], config["num_attention_heads"], config["head_dim"])
    assert shape == (128, 2, 64)
    assert config["rope_theta"] == 10000.0
    tokenizer_config = read_json(tiny_model / "tokenizer_config.json")
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "token_type_ids" not in tokenizer_config["model_input_names"]
    assert "chat_template" in tokenizer_config
