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
    kept,
    manifest_key,
    model_as_cwd,
    serve_args,
    warm_key,
)
from pipeline.planning.toolchain import Toolchain
from pipeline.serving.warm import CHUNK, copy_neutral, neutral, observed
from registry.identity.manifest import Manifest

ARTIFACT = "sha256:" + "a" * 64
VLLM = ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "{model_dir}", "--served-model-name",
        "tiny", "--host", "127.0.0.1", "--port", "{port}", "--dtype", "bfloat16",
        "--max-model-len", "256"]
TRTLLM = ["trtllm-serve", "{model_dir}", "--backend", "pytorch", "--host", "127.0.0.1",
          "--port", "{port}", "--tp_size", "1", "--max_seq_len", "512"]
NODE = Toolchain(gpu="H100-SXM5-80GB", sm=90, driver="570.124.06", cuda="12.9",
                 tensorrt="10.14.1.48", trtllm="1.2.1", vllm="0.32.0+cu128", torch="2.9.0",
                 vllm_torch="2.9.0", vllm_cuda="12.8", vllm_triton="3.5.0")


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
    (VLLM, "vllm", "0.33.0"), (VLLM, "vllm", "0.32.0+cu130"), (VLLM, "vllm_cuda", "13.0"),
    (VLLM, "vllm_torch", "2.9.1"), (VLLM, "vllm_triton", "3.5.1"),
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
    for field, value in (("tensorrt", "10.15.0.1"), ("image", "sha256:" + "b" * 64),
                         ("cuda", "13.1"), ("torch", "2.10.0")):  # the builder's, not vLLM's
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
    # a path across the boundary of two reads of a streamed copy
    straddling = b"x" * (CHUNK - 5) + str(serving).encode() + b"y" * 10
    (source / "vllm" / "big.bin").write_bytes(straddling)
    dest = tmp_path / "copy"
    assert copy_neutral(source, dest, [str(serving)]).files == 3
    for path in dest.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert str(tmp_path).encode() not in data
    original = (source / "vllm" / "k.so").read_bytes()
    assert len((dest / "vllm" / "k.so").read_bytes()) == len(original)  # offsets unchanged
    assert len((dest / "vllm" / "big.bin").read_bytes()) == len(straddling)
    assert neutral(5) == b"/engi"


def test_a_capture_skips_what_passes_its_cap_and_reads_no_file_whole(tmp_path: Path) -> None:
    source = tmp_path / ".warm"
    (source / "triton" / "ab").mkdir(parents=True)
    (source / "triton" / "ab" / "kernel.cubin").write_bytes(b"k" * 1000)
    huge = source / "triton" / "ab" / "huge.bin"
    with huge.open("wb") as sparse:  # 64 GiB that take no disk: never read into memory
        sparse.truncate(64 << 30)
    copied = copy_neutral(source, tmp_path / "copy", [str(tmp_path)], max_bytes=1 << 20)
    assert (copied.files, copied.bytes) == (1, 1000)
    assert copied.skipped == (f"triton/ab/huge.bin ({64 << 30} bytes)",)
    assert not (tmp_path / "copy" / "triton" / "ab" / "huge.bin").exists()


@pytest.mark.parametrize(("relative", "wanted"), [
    ("vllm/torch_compile_cache/torch_aot_compile/581b/rank_0_0/model", True),
    ("inductor/fxgraph/ab/cd", True),
    ("inductor/locks/c244.lock", False),
    ("triton/ab/kernel.json.tmp.pid_12_34", False),
    # TRT-LLM's DeepGEMM JIT: the kernels it keeps, not a compile in flight
    ("trtllm/deep_gemm/cache/gemm_4096_7168_128_128_128_1_8_1_Normal/kernel.so", True),
    ("trtllm/deep_gemm/tmp/gemm_4096_7168_128_128_128_1_8_1_Normal_1764000000000_4242/kernel.cu",
     False),
])
def test_a_capture_keeps_caches_and_leaves_out_locks_and_temp_files(
        relative: str, wanted: bool) -> None:
    assert kept(relative) is wanted


@pytest.mark.parametrize("runtime", ["vllm", "trtllm-pytorch"])
def test_every_cache_path_is_relative_and_nothing_the_runtime_overrides_is_set(
        tmp_path: Path, runtime: str) -> None:
    env = cache_env(runtime, tmp_path)
    assert all(value.startswith(".warm/") for value in env.values())
    assert "TMPDIR" not in env  # Python makes it absolute (tempfile.gettempdir)
    assert env["FLASHINFER_WORKSPACE_BASE"] == ".warm/flashinfer"
    if runtime == "vllm":  # vLLM sets TORCHINDUCTOR_CACHE_DIR itself when it compiles
        assert "TORCHINDUCTOR_CACHE_DIR" not in env
        assert env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == ".warm/flashinfer-autotune"


def test_trtllm_pytorch_keeps_its_autotuner_and_deepgemm_jit_caches_in_warm(
        tmp_path: Path) -> None:
    env = cache_env("trtllm-pytorch", tmp_path)
    assert env["TLLM_AUTOTUNER_CACHE_PATH"] == ".warm/trtllm/autotuner.json"  # a file
    assert env["TRTLLM_DG_CACHE_DIR"] == ".warm/trtllm/deep_gemm"
    assert env["DG_JIT_CACHE_DIR"] == ".warm/deep_gemm"  # upstream DeepGEMM's
    assert (tmp_path / ".warm" / "trtllm" / "deep_gemm").is_dir()


@pytest.mark.parametrize(("runtime", "log", "said"), [
    ("vllm", ("INFO 12-06 14:01:02 [decorators.py:319] Directly load AOT compilation from path "
     ".warm/vllm/torch_compile_cache/torch_aot_compile/581b/rank_0_0/model"), "used"),
    ("vllm", ("INFO [backends.py:295] Directly load the compiled graph(s) for compile range "
     "(1, 256) from the cache, took 0.412 s"), "used"),
    ("vllm", ("WARNING [decorators.py:333] Compiling model again due to a load failure from "
     ".warm/vllm/x/model, reason: Compile cache file corrupted.\n"),
     "placed, not used (vLLM could not load it: Compile cache file corrupted.)"),
    ("vllm", "INFO [backends.py:398] Compiling a graph for compile range (1, 256) takes 9.1 s",
     "placed, not used (vLLM compiled anew: no entry of it matched)"),
    ("trtllm-pytorch", "[TRT-LLM] [I] [Autotuner] Loading cache from .warm/trtllm/autotuner.json",
     "used"),
    ("trtllm-pytorch", "[TRT-LLM] [I] [Autotuner] profiled 14 shapes, 0 from cache",
     "placed, not used (the autotuner did not load it)"),
])
def test_a_warm_start_is_what_the_runtime_says_it_did(runtime: str, log: str, said: str) -> None:
    assert observed(runtime, log) == said


def test_a_cache_is_keyed_by_what_its_own_manifest_records() -> None:
    here = warm_key(ARTIFACT, TRTLLM, NODE)
    assert here is not None

    def captured(toolchain: Toolchain) -> Manifest:
        return Manifest(kind="warm-cache", files=(), key=here.key, inputs=(ARTIFACT,),
                        toolchain=toolchain.as_dict(), serve={"args": list(here.args)},
                        labels={"runtime": "trtllm-pytorch", "artifact": ARTIFACT,
                                "gpu": here.gpu})

    same = manifest_key(captured(NODE))
    assert same is not None
    assert same.key == here.key
    elsewhere = replace(NODE, gpu="A100-SXM4-80GB", sm=80, driver="999.99.99")
    other = manifest_key(captured(elsewhere))  # the key column says this node; it is not
    assert other is not None
    assert other.key != here.key
    assert "driver 999.99.99 → 570.124.06" in here.differences(other.gpu, other.toolchain)
