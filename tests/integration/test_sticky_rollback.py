"""Sticky rollbacks (issue 23 item 5), run as a user would with the stand-ins and the toy
recipe of tests/integration/test_nightly.py, on SQLite and PostgreSQL: after `rollback`, a
`build` and a `nightly` leave the alias where the rollback put it (the rolled-back-from digest
is held even when it re-proves); `show` says it is pinned, when and why; a passing re-smoke
keeps a superseded artifact superseded; reindex keeps the pin; a `tag` moves it and clears
the pin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from registry.sql.alias_records import get_alias, pinned_by_rollback
from registry.sql.db import open_registry
from registry.sql.records import get_status
from tests.cli_forkserver import run_cli
from tests.integration.nightly_box import (
    CHECKPOINT_ALIAS,
    ENGINE_ALIAS,
    ENGINECTL,
    NEW,
    NEWER,
    Box,
    target,
)

ENGINE_TARGET = "H100-SXM5-80GB/tp1/pp1/bf16/kv-auto/small/trtllm"
CHECKPOINT_TARGET = ENGINE_TARGET.replace("/trtllm", "/trtllm-pytorch")
WHY = "TTFT regression in prod"


@pytest.fixture
def rolled(tmp_path: Path, registry_url: str) -> tuple[Box, str, str]:
    """A build on the old driver, a nightly on the new one that promoted the new engine,
    then `rollback --note`: (box, the engine rolled back to, the one rolled back from)."""
    box = Box(tmp_path, registry_url, max_regression=0.99)  # noise never holds it here
    box.run("build", str(box.recipe))
    box.bump(NEW)
    box.nightly()
    rolled = json.loads(box.run("rollback", ENGINE_ALIAS, "--note", WHY, "--json").stdout)
    return box, rolled["digest"], rolled["previous"]


def nightly(box: Box, *args: str) -> tuple[dict[str, Any], int]:
    """`nightly --json ARGS`'s report and its exit code."""
    done = run_cli([ENGINECTL, "nightly", "--json", *args], env=box.env, timeout=600,
                   cwd=box.cwd)
    assert done.stdout, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report, done.returncode


def state(box: Box, url: str | None = None) -> tuple[str | None, dict[str, str | None]]:
    with open_registry(url or box.registry_url) as registry, registry.session() as session:
        alias = get_alias(session, ENGINE_ALIAS)
        statuses = {d: get_status(session, d) for d in (alias or "",) if d}
        return alias, statuses


def status_of(box: Box, digest: str) -> str | None:
    with open_registry(box.registry_url) as registry, registry.session() as session:
        return get_status(session, digest)


def test_a_build_after_a_rollback_leaves_the_alias_and_show_says_it_is_pinned(
    rolled: tuple[Box, str, str]
) -> None:
    box, back_to, left = rolled
    assert back_to != left
    built = box.run("build", str(box.recipe), "--json")
    assert json.loads(built.stdout)["promotions"] == []
    assert state(box)[0] == back_to
    assert status_of(box, left) == "superseded"  # its smoke run is reused, not redone

    shown = box.run("show", ENGINE_ALIAS).stdout
    [line] = [line for line in shown.splitlines() if line.strip().startswith("pinned")]
    assert ENGINE_ALIAS in line
    assert f"from {left}" in line
    assert line.endswith(f": {WHY}")
    pins = json.loads(box.run("show", ENGINE_ALIAS, "--json").stdout)["pins"]
    assert [(p["alias"], p["from"], p["to"], p["note"]) for p in pins] == [
        (ENGINE_ALIAS, left, back_to, WHY)]

    # a re-smoke of the artifact it left passes and keeps it superseded
    smoked = box.run("smoke", left).stdout
    assert smoked.splitlines()[-1] == f"{left}: superseded"
    assert status_of(box, left) == "superseded"
    assert state(box)[0] == back_to

    # reindex: the pin comes back from the store's alias records
    fresh = f"sqlite:///{box.cwd / 'reindexed.db'}"
    box.run("reindex", env={"ENGINECTL_REGISTRY_URL": fresh})
    with open_registry(fresh) as registry, registry.session() as session:
        pin = pinned_by_rollback(session, ENGINE_ALIAS)
        assert pin is not None
        assert (pin.from_digest, pin.to_digest, pin.note) == (left, back_to, WHY)
        assert get_status(session, left) == "superseded"

    # a tag by hand moves it (a superseded artifact is proven: it is ready again) and
    # clears the pin
    box.run("tag", left, ENGINE_ALIAS, "--note", "fixed upstream")
    assert state(box) == (left, {left: "ready"})
    assert "pinned" not in box.run("show", ENGINE_ALIAS).stdout
    assert json.loads(box.run("show", ENGINE_ALIAS, "--json").stdout)["pins"] == []


def test_a_tag_to_the_digest_it_already_points_at_clears_the_pin(
    rolled: tuple[Box, str, str]
) -> None:
    box, back_to, _ = rolled
    box.run("tag", back_to, ENGINE_ALIAS, "--note", "keep it, by hand")
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert pinned_by_rollback(session, ENGINE_ALIAS) is None
        assert get_alias(session, ENGINE_ALIAS) == back_to


def test_a_nightly_holds_the_rolled_back_from_digest_and_a_new_winner_moves_it(
    tmp_path: Path, registry_url: str
) -> None:
    """The checkpoint entry keeps its digest across a driver bump, so a nightly re-proves
    the very digest a rollback left: it is held (and stays superseded); the engine alias,
    not pinned, still moves. A newer engine that wins the gate moves a pinned alias."""
    box = Box(tmp_path, registry_url, max_regression=0.99)  # noise never holds it here
    box.run("build", str(box.recipe))
    with open_registry(box.registry_url) as registry, registry.session() as session:
        entry, engine = get_alias(session, CHECKPOINT_ALIAS), get_alias(session, ENGINE_ALIAS)
    assert entry
    assert engine
    # history [entry, engine, entry]; the rollback leaves the entry for the old engine
    box.run("tag", engine, CHECKPOINT_ALIAS)
    box.run("tag", entry, CHECKPOINT_ALIAS)
    rolled = json.loads(box.run("rollback", CHECKPOINT_ALIAS, "--note", WHY, "--json").stdout)
    assert (rolled["digest"], rolled["previous"]) == (engine, entry)
    assert status_of(box, entry) == "superseded"

    box.bump(NEW)
    page = tmp_path / "nightly.html"
    report, code = nightly(box, "--html", str(page))
    assert code == 0, report  # a hold that only keeps a rollback is no failure
    assert report["failures"] == []
    assert report["text"].endswith("1 aliases promoted, 1 held. Exit 0.")  # held, not failed
    pytorch = target(report, CHECKPOINT_TARGET)
    assert [s["stage"] for s in pytorch["stages"]] == ["smoke"]  # re-proved: same digest
    [held] = pytorch["promotions"]
    assert (held["action"], held["old"], held["new"]) == ("held", engine, entry)
    assert "pinned by a rollback" in held["reason"]
    assert WHY in held["reason"]
    # the held row shows what the alias keeps (the engine's last proof) beside the candidate
    assert [lv["concurrency"] for lv in held["levels"]] == [1, 2]
    row = next(r for r in page.read_text().split("<tr ") if r.startswith(
        f'class="target" data-verdict="held"><td>{CHECKPOINT_TARGET}<'))
    assert f"{CHECKPOINT_ALIAS} keeps {engine[:19]}… → candidate" in row
    for level in held["levels"]:
        assert (f"c={level['concurrency']}: {level['old_tokens_per_s']:.1f} → "
                f"{level['new_tokens_per_s']:.1f}") in row
    moved = target(report, ENGINE_TARGET)["promotions"][0]
    assert moved["action"] == "promoted"  # the unpinned alias moves as before
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, CHECKPOINT_ALIAS) == engine
        assert get_status(session, entry) == "superseded"  # re-proved, still superseded
        assert pinned_by_rollback(session, CHECKPOINT_ALIAS) is not None
        new_engine = get_alias(session, ENGINE_ALIAS)

    # the engine alias, rolled back, then a newer engine wins the gate against it
    box.run("rollback", ENGINE_ALIAS)
    assert state(box)[0] == engine
    box.bump(NEWER)
    report, _code = nightly(box)
    [moved] = target(report, ENGINE_TARGET)["promotions"]
    assert moved["action"] == "promoted", moved
    assert moved["new"] not in (engine, new_engine)
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == moved["new"]
        assert pinned_by_rollback(session, ENGINE_ALIAS) is None
