"""pull ALIAS on a node whose vLLM is not the one the alias's target was proven on takes the
alias's latest earlier target proven there, read from the registry's alias history and smoke
reports on the database driver alone. Every case on SQLite and PostgreSQL (file store)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from pipeline.deploy.pull import pull
from registry.context import Context
from registry.errors import AliasToolchainError
from registry.sql import smoke_records
from registry.sql.alias_targets import alias_targets
from tests.deploy import artifacts

PYTHON = sys.executable  # stands in for vLLM's Python: pull never runs it


def vllm_python(root: Path, version: str) -> str:
    """A Python whose importable `vllm` is distribution vllm *version* (what pull probes)."""
    site = root / "site"
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)


def proven(ctx: Context, digest: str, vllm: str, *, passed: bool = True) -> None:
    with ctx.registry.session() as session:
        smoke_records.add_smoke_report(session, digest, passed, {"best_output_tokens_per_s": 9.0},
                                       gpu="CPU", toolchain={"gpu": "CPU", "vllm": vllm})


@pytest.mark.parametrize("store", ["file"], indirect=True)
def test_an_alias_gives_a_node_its_latest_target_proven_on_its_vllm(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = artifacts.checkpoint(ctx, tmp_path / "ckpt")
    first, second, third = (artifacts.vllm_entry(ctx, tmp_path / name, source,
                                                 extra={"n": name.encode()})
                            for name in ("first", "second", "third"))
    proven(ctx, first, "0.31.0")
    proven(ctx, second, "0.31.0")
    proven(ctx, second, "0.32.0", passed=False)  # a failed run proves nothing
    proven(ctx, third, "0.32.0")
    for digest in (first, second, third):
        artifacts.alias(ctx, "m/cpu/prod", digest)
    artifacts.set_status(ctx, second, "quarantined", "smoke failed: chat: HTTP 500")
    moves = alias_targets(ctx.config.registry_url, "m/cpu/prod")
    assert [(t.digest, t.status, [p["vllm"] for p in t.proofs]) for t in moves] == [
        (third, "ready", ["0.32.0"]), (second, "quarantined", ["0.31.0"]),
        (first, "ready", ["0.31.0"])]

    monkeypatch.setenv("ENGINECTL_VLLM_PYTHON", vllm_python(tmp_path / "new", "0.32.0"))
    on_new = pull(ctx, "m/cpu/prod", tmp_path / "a", executable=PYTHON)
    assert (on_new.digest, on_new.notes) == (third, ())

    monkeypatch.setenv("ENGINECTL_VLLM_PYTHON", vllm_python(tmp_path / "old", "0.31.0"))
    on_old = pull(ctx, "m/cpu/prod", tmp_path / "b", executable=PYTHON)
    assert on_old.digest == first  # the quarantined one between them is never sent
    assert on_old.notes == (
        (f"m/cpu/prod points at {third[:19]}…, which needs vllm 0.32.0 (this node has vllm "
        f"0.31.0); pulling its earlier target {first} since {moves[2].since:%Y-%m-%d %H:%M}, "
        "which runs here"),)
    assert pull(ctx, third, tmp_path / "c", executable=PYTHON).digest == third  # by digest

    monkeypatch.setenv("ENGINECTL_VLLM_PYTHON", vllm_python(tmp_path / "older", "0.30.0"))
    with pytest.raises(AliasToolchainError) as refused:
        pull(ctx, "m/cpu/prod", tmp_path / "d", executable=PYTHON)
    assert refused.value.exit_code == 6
    assert str(refused.value).startswith(
        f"m/cpu/prod needs vllm 0.32.0: its target {third[:19]}… was proven only there, and "
        "this node has vllm 0.30.0; no earlier target of it runs on this node's toolchain")
    assert not (tmp_path / "d").exists()
