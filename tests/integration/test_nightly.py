"""`enginectl nightly` as a scheduler runs it: real processes, a real registry (SQLite and
PostgreSQL) and store, an "H100" made by the nvidia-smi stand-in, TensorRT-LLM's programs
through their stand-ins (tests/fakes/bin), whose server can be told to answer slower.

The tiny-model end to end run with real quantization and vLLM's CPU build is
tests/e2e/test_nightly_e2e.py; these use a toy checkpoint and stand-ins only, so each runs in
seconds: a driver bump rebuilds the engine and re-proves the checkpoint entry, a node slower
for every artifact promotes the candidate and raises the toolchain regression alarm, two
nightlies at once build each key once, rollback and gc --keep-superseded, the report as JSON,
HTML (in headless Chromium) and a webhook POST. Verdicts, the alarm and the page's layout:
tests/integration/test_nightly_verdicts.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from registry.sql.alias_records import alias_history, get_alias
from registry.sql.db import open_registry
from registry.sql.records import get_status, list_artifacts
from registry.sql.smoke_records import smoke_reports
from tests.integration.browser import browse
from tests.integration.nightly_box import (
    CHECKPOINT_ALIAS,
    ENGINE_ALIAS,
    ENGINE_TARGET,
    ENGINECTL,
    NEW,
    NEWER,
    OLD,
    Box,
    target,
)

pytestmark = pytest.mark.waits  # on a slowed stand-in server: spread (tests/conftest.py)

# the CUDA each driver runs (its branch's, in nvidia-smi's banner) moves with it; no key takes it
DRIVER_CUDA_BUMP = {"field": "driver_cuda", "old": "12.8", "new": "12.9"}


def test_a_driver_bump_rebuilds_the_engine_and_re_proves_the_checkpoint(box: Box) -> None:
    with open_registry(box.registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)
        checkpoint = get_alias(session, CHECKPOINT_ALIAS)
    assert old_engine
    assert checkpoint

    quiet = box.nightly()  # no arguments: every recipe the build recorded
    assert quiet["nothing_changed"]
    assert quiet["exit_code"] == 0
    assert quiet["recipes"][0]["path"] == str(box.recipe.resolve())

    box.bump(NEW)
    dry = box.nightly("--dry-run")
    assert dry["pools"][0]["changes"] == [{"field": "driver", "old": OLD, "new": NEW},
                                        DRIVER_CUDA_BUMP]
    assert {s["outcome"] for r in dry["recipes"] for t in r["targets"] for s in t["stages"]} \
        == {"would run"}

    report = box.nightly()
    assert report["exit_code"] == 0
    assert report["pools"][0]["changes"] == [{"field": "driver", "old": OLD, "new": NEW},
                                        DRIVER_CUDA_BUMP]
    engine = target(report, ENGINE_TARGET)
    assert [s["stage"] for s in engine["stages"]] == ["build", "smoke"]  # not convert
    assert all(s["because"] == [f"driver {OLD} → {NEW}"] for s in engine["stages"])
    assert engine["verdict"] == "promoted"  # rebuilt, and its alias moved
    [moved] = engine["promotions"]
    assert (moved["action"], moved["old"]) == ("promoted", old_engine)
    assert {level["concurrency"] for level in moved["levels"]} == {1, 2}
    assert all(level["old_tokens_per_s"] and level["new_tokens_per_s"]
               for level in moved["levels"])
    pytorch = target(report, ENGINE_TARGET.replace("/trtllm", "/trtllm-pytorch"))
    assert [s["stage"] for s in pytorch["stages"]] == ["smoke"]
    assert pytorch["verdict"] == "re-proved"
    assert pytorch["start"]["warm_cache"] is None  # a new driver: no warm cache fits, cold
    assert pytorch["start"]["ready_s"] > 0
    assert pytorch["promotions"][0]["action"] == "re-proved"
    # exactly the driver-dependent keys: the snapshot and convert were not among them
    stages = {s["stage"] for r in report["recipes"] for t in r["targets"] for s in t["stages"]}
    assert stages == {"build", "smoke"}
    assert OLD in report["text"]
    assert NEW in report["text"]

    with open_registry(box.registry_url) as registry, registry.session() as session:
        new_engine = get_alias(session, ENGINE_ALIAS)
        assert new_engine == moved["new"] != old_engine
        assert get_alias(session, CHECKPOINT_ALIAS) == checkpoint  # same digest
        statuses = {a.digest: a.status for a in list_artifacts(session, kind="trtllm-engine")}
        assert statuses == {old_engine: "superseded", new_engine: "ready"}
        event = alias_history(session, ENGINE_ALIAS)[-1]
        assert event.previous_digest == old_engine
        assert event.details is not None
        assert [lv["concurrency"] for lv in event.details["levels"]] == [1, 2]
        proofs = [r for r in smoke_reports(session, checkpoint) if r.passed]
        assert [r.toolchain["driver"] for r in proofs if r.toolchain] == [OLD, NEW]
        # the re-proof captured a warm cache for the new driver; the old one stays for the
        # nodes still on the old driver (issue 25)
        warm = [a for a in list_artifacts(session, kind="warm-cache")
                if a.labels.get("artifact") == checkpoint]
        assert sorted(a.toolchain["driver"] for a in warm) == sorted([OLD, NEW])
        assert all(a.status == "ready" for a in warm)

    again = box.run("nightly")
    assert again.stdout.startswith("nothing changed since ")

    # rollback: the alias goes back, the engine it leaves no longer resolves
    rolled = json.loads(box.run("rollback", ENGINE_ALIAS, "--json").stdout)
    assert (rolled["digest"], rolled["previous"]) == (old_engine, new_engine)
    with open_registry(box.registry_url) as registry, registry.session() as session:
        statuses = {a.digest: a.status for a in list_artifacts(session, kind="trtllm-engine")}
        assert statuses == {old_engine: "ready", new_engine: "superseded"}
    failed = box.run("rollback", "toy/nothing/here", code=6)
    assert "points nowhere" in failed.stderr

    # promotion, supersession and rollback are in the store: reindex restores them
    fresh = f"sqlite:///{box.cwd / 'reindexed.db'}"
    box.run("reindex", env={"ENGINECTL_REGISTRY_URL": fresh})
    with open_registry(fresh) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == old_engine
        statuses = {a.digest: a.status for a in list_artifacts(session, kind="trtllm-engine")}
        assert statuses == {old_engine: "ready", new_engine: "superseded"}
        moves = alias_history(session, ENGINE_ALIAS)
        assert [m.digest for m in moves] == [old_engine, new_engine, old_engine]
        assert moves[1].details is not None
        assert moves[1].details["rule"] == "nightly"


def test_gc_keeps_superseded_within_the_window(box: Box) -> None:
    digests = []
    for driver in (NEW, NEWER):
        box.bump(driver)
        box.nightly()
        with open_registry(box.registry_url) as registry, registry.session() as session:
            digests.append(get_alias(session, ENGINE_ALIAS))
    kept = json.loads(box.run("gc", "--dry-run", "--json").stdout)
    assert kept["retired"] == []  # two earlier engines, within the default 3
    one = json.loads(box.run("gc", "--keep-superseded", "1", "--json", "--grace", "0s").stdout)
    with open_registry(box.registry_url) as registry, registry.session() as session:
        engines = list_artifacts(session, kind="trtllm-engine")
    first = next(e for e in engines if e.digest not in digests)
    assert one["retired"] == [first.digest]
    assert {e.digest: e.status for e in engines} == {
        first.digest: "deleted", digests[0]: "superseded", digests[1]: "ready"}
    assert one["manifests"] == [first.digest]


# SQLite alone: what holds and what accepts is the nightly's decision, the same on either
# database (a killed nightly's baseline runs on both: test_nightly_killed.py); ~60 s a run
@pytest.mark.parametrize("registry_url", ["sqlite"], indirect=True)
def test_a_regressed_toolchain_holds_the_candidate_until_a_run_accepts_it(
        tmp_path: Path, registry_url: str) -> None:
    box = Box(tmp_path, registry_url, max_regression=0.5, gate_rounds=3)
    box.run("build", str(box.recipe))
    with open_registry(box.registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)
    box.bump(NEW)
    # the stand-in server answers 20x slower than it did, for every artifact: the gate serves
    # both engines on the slow node, so the candidate is no worse than the incumbent, but the
    # incumbent against its own last proof is a toolchain regression, which holds the alias
    slower = {"FAKE_OPENAI_TOKEN_DELAY_S": "0.05"}
    report = box.nightly(str(box.recipe), code=5, **slower)
    engine = target(report, ENGINE_TARGET)
    [held] = engine["promotions"]
    assert (held["action"], held["rule"], held["old"]) == ("held", "toolchain-regressed",
                                                           old_engine)
    assert held["reason"].startswith(f"toolchain regressed: toolchain regression of the "
                                     f"incumbent {old_engine[:19]}… on H100-SXM5-80GB "
                                     f"(driver {OLD} → {NEW}")
    assert re.search(r"c=1 \d+\.\d → \d+\.\d tok/s", held["reason"])  # both numbers
    assert all(lv["old_tokens_per_s"] and lv["new_tokens_per_s"] for lv in held["levels"])
    assert engine["verdict"] == "regressed"
    assert [r["role"] for r in engine["regressions"]] == ["incumbent"]
    assert all(lv["new_tokens_per_s"] < lv["old_tokens_per_s"] / 2
               for lv in engine["regressions"][0]["levels"])
    assert report["failures"] == []  # a regression is the alarm, not a failure
    assert not report["settled"]
    assert "0 aliases promoted, 1 held" in report["text"]
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == old_engine  # nothing moved
        assert get_status(session, held["new"]) == "ready"

    # a later run that accepts the regression promotes what was held; it still exits 5
    accepted = box.nightly(str(box.recipe), "--accept-regression", code=5, **slower)
    [moved] = target(accepted, ENGINE_TARGET)["promotions"]
    assert (moved["action"], moved["rule"], moved["new"]) == ("promoted", "ab", held["new"])
    assert moved["reason"].endswith("the toolchain regression was accepted "
                                    "(--accept-regression)")
    assert accepted["settled"]
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == held["new"]
        assert get_status(session, old_engine) == "superseded"
    text = box.run("nightly", str(box.recipe)).stdout  # the alarm is not news the next night
    assert text.startswith("nothing changed since")


def test_two_nightlies_at_once_build_each_key_once(box: Box) -> None:
    box.bump(NEW)
    runs = [subprocess.Popen([ENGINECTL, "nightly", "--json"], env=box.env, cwd=box.cwd,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    reports = [json.loads(out) for out, _ in outputs]
    worked = [r for r in reports if not r["nothing_changed"]]
    assert len(worked) == 1, reports
    waited = next(r for r in reports if r["nothing_changed"])
    assert waited["since"] is not None
    with open_registry(box.registry_url) as registry, registry.session() as session:
        engines = list_artifacts(session, kind="trtllm-engine")
        assert len(engines) == 2  # the old one and one rebuild, never two
        checkpoint = get_alias(session, CHECKPOINT_ALIAS)
        assert checkpoint is not None
        assert len([r for r in smoke_reports(session, checkpoint) if r.passed]) == 2


class Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        type(self).received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        return


@pytest.fixture
def webhook() -> Iterator[str]:
    Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_notify_posts_the_report_and_a_dead_hook_never_fails_the_run(
        box: Box, webhook: str, tmp_path: Path) -> None:
    box.bump(NEW)
    done = box.run("nightly", "--notify", webhook)
    [posted] = Hook.received
    assert posted["exit_code"] == 0
    assert posted["pools"][0]["changes"][0]["new"] == NEW
    assert posted["text"].startswith("enginectl nightly: ")
    assert NEW in posted["text"]
    assert NEW in done.stdout
    dead = box.run("nightly", "--notify", "http://127.0.0.1:9/none", "--html",
                   str(tmp_path / "n.html"))
    assert "the POST failed" in dead.stderr
    assert (tmp_path / "n.html").read_text().startswith("<!DOCTYPE html>")


def test_html_report_renders_in_chromium(box: Box, chromium: str, tmp_path: Path) -> None:
    box.bump(NEW)
    page = tmp_path / "nightly.html"
    box.run("nightly", "--html", str(page))
    dom = browse(chromium, tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    assert re.findall(r'<tr class="target" data-verdict="([^"]+)"', dom) == [
        "promoted", "re-proved"]
    assert f"driver {OLD} → {NEW}" in dom
    assert "promoted toy/h100-sxm5-80gb/trtllm" in dom
    shot = tmp_path / "nightly.png"
    browse(chromium, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,900",
           "--hide-scrollbars", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_target_never_blocks_the_others_and_exits_3_with_its_log(box: Box) -> None:
    with open_registry(box.registry_url) as registry, registry.session() as session:
        old_engine = get_alias(session, ENGINE_ALIAS)
    box.bump(NEW)
    failing = {"FAKE_TRTLLM_FAIL": "out of memory while building layer 7"}
    report = box.nightly(code=3, **failing)
    [failure] = report["failures"]
    assert (failure["target"], failure["stage"], failure["outcome"]) == (
        ENGINE_TARGET, "build", "failed")
    assert "out of memory while building layer 7" in failure["error"]
    assert Path(failure["log"]).is_file()
    engine = target(report, ENGINE_TARGET)
    assert (engine["verdict"], engine["fault"]) == ("failed", "artifact")
    assert engine["evidence"] == failure["log"]  # the verdict comes from the build's log
    assert engine["detail"].startswith("artifact fault: build failed: ")
    pytorch = target(report, ENGINE_TARGET.replace("/trtllm", "/trtllm-pytorch"))
    assert pytorch["verdict"] == "re-proved"  # not blocked by the engine
    assert target(report, ENGINE_TARGET)["promotions"][0]["action"] == "not-ready"
    text = box.run("nightly", code=3, env=failing).stdout
    assert "out of memory while building layer 7" in text
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == old_engine
    healed = box.nightly()  # the failure is not "nothing changed": the next run retries
    engine = target(healed, ENGINE_TARGET)
    assert engine["verdict"] == "promoted"  # rebuilt, and its alias moved
    assert engine["stages"][0]["because"][0].startswith("its last run failed")


def test_a_build_with_nothing_to_run_still_fills_a_channel_and_records_its_recipe(
        box: Box) -> None:
    # a channel emptied by hand: the next build has nothing to run but an alias to move
    box.run("untag", ENGINE_ALIAS)
    again = json.loads(box.run("build", str(box.recipe), "--json").stdout)
    assert again["built"] == 0
    assert [(p["alias"], p["action"]) for p in again["promotions"]] == [(ENGINE_ALIAS, "promoted")]
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS)

    # edited and built, then put back and built again (every key already done): the nightly
    # takes the content built last, not the edit
    original = box.recipe.read_text()
    first = box.nightly("--dry-run")["recipes"][0]["digest"]
    box.recipe.write_text(original.replace("max_tokens: 4", "max_tokens: 3"))
    box.run("build", str(box.recipe))
    assert box.nightly("--dry-run")["recipes"][0]["digest"] != first
    box.recipe.write_text(original)
    box.run("build", str(box.recipe))
    assert box.nightly("--dry-run")["recipes"][0]["digest"] == first
