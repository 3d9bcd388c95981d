"""What fetch says about an artifact's status: a quarantined one is refused (exit 4) unless
--allow-unready, a servable one not yet proven is fetched with a note, and intermediates and
superseded artifacts (what a rollback fetches) come without a word. Every case on the file
store and S3, each with SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from registry.context import Context
from registry.errors import UnreadyError
from registry.ops.fetch import fetch
from registry.ops.publish import publish
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.deploy import artifacts
from tests.helpers import stderr_of


def cli(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = run_cli([ENGINECTL, *args], env=env, timeout=300)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


def test_fetch_refuses_a_quarantined_artifact_unless_allowed(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry",
                                 artifacts.checkpoint(ctx, tmp_path / "ckpt"))
    artifacts.alias(ctx, "m/cpu/prod", entry)
    artifacts.set_status(ctx, entry, "quarantined", "smoke failed: greedy: wrong output")
    with pytest.raises(UnreadyError) as raised:
        fetch(ctx, "m/cpu/prod", tmp_path / "lib")
    assert (raised.value.status, raised.value.reason) == ("quarantined",
                                                          "smoke failed: greedy: wrong output")
    assert not (tmp_path / "lib").exists()

    refused = cli(deploy_env, "fetch", "m/cpu/prod", "-o", str(tmp_path / "out"), code=4)
    assert stderr_of(refused).strip() == (
        f"enginectl: error: artifact {entry} is quarantined (smoke failed: greedy: wrong "
        f"output): fetch takes it only with --allow-unready; `enginectl show {entry[:19]}` "
        "has its reports")
    assert not (tmp_path / "out").exists()
    allowed = cli(deploy_env, "fetch", "m/cpu/prod", "-o", str(tmp_path / "out"),
                  "--allow-unready")
    assert stderr_of(allowed).strip() == (
        f"enginectl: note: {entry} is quarantined (smoke failed: greedy: wrong output); "
        "fetched because of --allow-unready")
    assert (tmp_path / "out" / "enginectl-entry.json").is_file()


def test_fetch_of_an_unproven_entry_says_so_and_intermediates_say_nothing(
    ctx: Context, deploy_env: dict[str, str], tmp_path: Path
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    entry = artifacts.vllm_entry(ctx, tmp_path / "entry", source, status="built")
    quantized_dir = tmp_path / "fp8"
    quantized_dir.mkdir()
    (quantized_dir / "config.json").write_text('{"quantization_config": {"quant_method": 1}}')
    (quantized_dir / "model.safetensors").write_bytes(b"\0" * 4096)
    quantized = publish(ctx, quantized_dir, kind="quantized-checkpoint",
                        labels={"model": "m", "quant": "fp8"}, status="built").digest

    unproven = cli(deploy_env, "fetch", entry, "-o", str(tmp_path / "a"))
    assert stderr_of(unproven).strip() == (
        f"enginectl: note: {entry} is built, not yet proven to serve (no passing smoke run); "
        f"`enginectl smoke {entry[:19]}` on a node that can serve it proves it")
    for digest, out in ((quantized, "b"), (source, "c")):
        done = cli(deploy_env, "fetch", digest, "-o", str(tmp_path / out))
        assert stderr_of(done) == ""
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == b"\0" * 4096
    artifacts.set_status(ctx, entry, "superseded", "replaced")
    assert fetch(ctx, entry, str(tmp_path / "d")).notes == ()  # rollbacks need it
