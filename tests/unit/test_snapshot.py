"""What a snapshot refuses, and how an hf:// branch is pinned."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pipeline.errors import RecipeError, StageError
from pipeline.stages.snapshot import LFS_POINTER, check_checkpoint
from tests.helpers import plan_of, recipe_data


def _checkpoint(root: Path, weights: bytes) -> Path:
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    return root


def test_real_weights_pass(tmp_path: Path) -> None:
    check_checkpoint(_checkpoint(tmp_path / "ok", b"\x08" * 64), "k1:x")


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [(b"", "is empty"), (LFS_POINTER + b"v1\noid sha256:abc\nsize 123\n", "Git LFS pointer")],
)
def test_lfs_pointers_and_empty_weights_are_refused(
    tmp_path: Path, weights: bytes, fragment: str
) -> None:
    with pytest.raises(StageError, match=fragment):
        check_checkpoint(_checkpoint(tmp_path / "bad", weights), "k1:x")


def test_no_config_or_no_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(StageError, match=r"no config\.json"):
        check_checkpoint(tmp_path / "empty", "k1:x")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(StageError, match="no weight files"):
        check_checkpoint(tmp_path / "empty", "k1:x")


def test_a_branch_is_refused_unless_the_recipe_asks_to_resolve_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy.deepcopy(recipe_data("llama70b-h100.yaml"))
    data["model"]["revision"] = "main"
    with pytest.raises(RecipeError, match="pin the commit, not a branch"):
        plan_of(data, tmp_path)
    data["model"]["resolve_revision"] = True
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # resolving needs the hub: offline, it says so
    with pytest.raises(RecipeError, match="cannot resolve 'main'"):
        plan_of(data, tmp_path)
