"""The warm-cache key (pipeline.deploy.warm): every part it names changes it, a miss names the
part that moved, and what is captured holds no host path (pipeline.serving.warm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipeline.deploy.warm import (
    cache_env,
    cache_runtime,
    inductor_user,
    kept,
    model_as_cwd,
    placed_path,
    serve_args,
    warm_key,
)
from pipeline.planning.toolchain import Toolchain
from pipeline.serving.warm import copy_neutral, neutral

ARTIFACT = "sha256:" + "a" * 64
VLLM = ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "{model_dir}", "--served-model-name",
        "tiny", "--host", "127.0.0.1", "--port", "{port}", "--dtype", "bfloat16",
        "--max-model-len", "256"]
TRTLLM = ["trtllm-serve", "{model_dir}", "--backend", "pytorch", "--host", "127.0.0.1",
          "--port", "{port}", "--tp_size", "1", "--max_seq_len", "512"]
NODE = Toolchain(gpu="H100-SXM5-80GB", sm=90, driver="570.124.06", cuda="12.9",
                 tensorrt="10.14.1.48", trtllm="1.2.1", vllm="0.32.0", torch="2.9.0")


def test_which_runtimes_keep_a_cache() -> None:
    assert cache_runtime(VLLM) == "vllm"
    assert cache_runtime([*VLLM, "--enforce-eager"]) is None  # compiles nothing at start
    assert cache_runtime(TRTLLM) == "trtllm-pytorch"
    assert cache_runtime(["trtllm-serve", "/e", "--backend", "tensorrt"]) is None
    assert warm_key(ARTIFACT, [*VLLM, "--enforce-eager"], NODE) is None


def test_serving_arguments_leave_out_where_it_runs() -> None:
    assert serve_args(VLLM) == ["--dtype", "bfloat16", "--max-model-len", "256"]
    assert serve_args(TRTLLM) == ["--backend", "pytorch", "--tp_size", "1", "--max_seq_len",
                                  "512"]


@pytest.mark.parametrize(("template", "field", "value"), [
    (TRTLLM, "gpu", "A100-SXM4-80GB"), (TRTLLM, "sm", 80), (TRTLLM, "driver", "575.57.08"),
    (TRTLLM, "cuda", "13.0"), (TRTLLM, "tensorrt", "10.15.0.1"), (TRTLLM, "trtllm", "1.2.2"),
    (VLLM, "gpu", "A100-SXM4-80GB"), (VLLM, "sm", 80), (VLLM, "driver", "575.57.08"),
    (VLLM, "vllm", "0.33.0"),
])
def test_every_key_part_moves_the_key_and_a_miss_names_it(
        template: list[str], field: str, value: Any) -> None:
    here = warm_key(ARTIFACT, template, NODE)
    changed: dict[str, Any] = {field: value}
    there = warm_key(ARTIFACT, template, replace(NODE, **changed))
    assert here is not None
    assert there is not None
    assert here.key != there.key
    captured = {"sm": there.toolchain.get("sm"), **there.toolchain}
    (moved,) = here.differences(there.gpu, captured)
    assert moved.startswith(f"{field} {value} → ")


def test_what_does_not_change_compiled_code_keeps_the_key() -> None:
    here = warm_key(ARTIFACT, VLLM, NODE)
    assert here is not None
    for field, value in (("tensorrt", "10.15.0.1"), ("image", "sha256:" + "b" * 64)):
        changed: dict[str, Any] = {field: value}
        other = warm_key(ARTIFACT, VLLM, replace(NODE, **changed))
        assert other is not None
        assert other.key == here.key
    served_elsewhere = [*VLLM[:8], "10.0.0.7", *VLLM[9:]]
    moved = warm_key(ARTIFACT, served_elsewhere, NODE)
    assert moved is not None
    assert moved.key == here.key
    other_args = warm_key(ARTIFACT, [*VLLM, "--max-num-seqs", "8"], NODE)
    assert other_args is not None
    assert other_args.key != here.key
    other_artifact = warm_key("sha256:" + "c" * 64, VLLM, NODE)
    assert other_artifact is not None
    assert other_artifact.key != here.key


def test_vllm_is_given_its_model_as_the_working_directory() -> None:
    assert model_as_cwd(["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--x"])[4] == "."
    api = ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--x"]
    assert model_as_cwd(api) == [*api[:4], ".", "--x"]
    assert model_as_cwd(TRTLLM) == TRTLLM


def test_a_capture_holds_no_host_path(tmp_path: Path) -> None:
    serving = tmp_path / "smoke" / "serve"
    source = serving / ".warm"
    (source / "vllm" / "locks").mkdir(parents=True)
    (source / "vllm" / "k.so").write_bytes(b"\x7fELF..." + str(source).encode() + b"/k.cpp\x00")
    (source / "vllm" / "locks" / "k.lock").write_bytes(b"")
    (source / "vllm" / "model").write_bytes(b"os.environ['X'] = '" + str(serving).encode() + b"'")
    dest = tmp_path / "copy"
    assert copy_neutral(source, dest, [str(serving)]) == 2
    for path in dest.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert str(tmp_path).encode() not in data
    original = (source / "vllm" / "k.so").read_bytes()
    assert len((dest / "vllm" / "k.so").read_bytes()) == len(original)  # offsets unchanged
    assert neutral(5) == b"/engi"


HEADER = "tmp/torchinductor_root/precompiled_headers/cg2scll.h"


@pytest.mark.parametrize(("relative", "wanted"), [
    ("vllm/torch_compile_cache/torch_aot_compile/581b/rank_0_0/model", True),
    ("inductor/fxgraph/ab/cd", True),
    (HEADER, True),
    (HEADER + ".gch", True),
    ("tmp/torchinductor_root/precompiled_headers/locks/cg2scll.lock", False),
    ("tmp/vllm_dist_c5c1f18b", False),  # the server's other temp files
    ("tmp/8c6f6e40-49dd/header.hpp", False),
    ("inductor/locks/c244.lock", False),
    ("triton/ab/kernel.json.tmp.pid_12_34", False),
    # TRT-LLM's DeepGEMM JIT: the kernels it keeps, not a compile in flight
    ("trtllm/deep_gemm/cache/gemm_4096_7168_128_128_128_1_8_1_Normal/kernel.so", True),
    ("trtllm/deep_gemm/tmp/gemm_4096_7168_128_128_128_1_8_1_Normal_1764000000000_4242/kernel.cu",
     False),
])
def test_a_capture_keeps_caches_and_of_the_temp_folder_only_inductors_headers(
        relative: str, wanted: bool) -> None:
    assert kept(relative) is wanted


def test_the_precompiled_headers_go_where_inductor_looks_for_this_user() -> None:
    torch_dirs = pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    assert Path(torch_dirs.default_cache_dir()).name == f"torchinductor_{inductor_user()}"
    assert (placed_path(HEADER + ".gch", "svc")
            == "tmp/torchinductor_svc/precompiled_headers/cg2scll.h.gch")
    assert placed_path("vllm/model", "svc") == "vllm/model"


def test_vllm_starts_with_its_temp_folder_in_warm_and_its_sockets_outside(tmp_path: Path) -> None:
    env = cache_env("vllm", tmp_path)
    assert env["TMPDIR"] == ".warm/tmp"
    assert (tmp_path / ".warm" / "tmp").is_dir()
    base = env["VLLM_RPC_BASE_PATH"]  # a socket path holds at most 107 bytes
    assert Path(base).is_absolute()
    assert len(f"{base}/{'0' * 36}") < 107
    assert "TMPDIR" not in cache_env("trtllm-pytorch", tmp_path)


def test_trtllm_pytorch_keeps_its_autotuner_and_deepgemm_jit_caches_in_warm(
        tmp_path: Path) -> None:
    env = cache_env("trtllm-pytorch", tmp_path)
    assert env["TLLM_AUTOTUNER_CACHE_PATH"] == ".warm/trtllm/autotuner.json"  # a file
    assert env["TRTLLM_DG_CACHE_DIR"] == ".warm/trtllm/deep_gemm"
    assert (tmp_path / ".warm" / "trtllm" / "deep_gemm").is_dir()
