"""The nightly's promotion gate, a same-run A/B (pipeline.serving.abgate), driven as a scheduler
runs it: a driver bump (the nvidia-smi stand-in) rebuilds the engine, and the gate serves the
alias's incumbent and the new engine in turn through the trtllm-serve stand-in, whose speed
and noise each run sets (tests/fakes/openai_server.py): FAKE_OPENAI_TOKEN_DELAY_S for every
engine, FAKE_OPENAI_DELAYS for an engine built with use_fused_mlp off (the build stand-in's
FAKE_TRTLLM_PLUGIN_CONFIG), FAKE_OPENAI_SLOW_FRACTION/FACTOR for a noisy neighbour. The speeds
differ by 3x (20 ms against 60 ms a token) so the verdict is never a matter of timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from registry.sql.alias_records import alias_history, get_alias
from registry.sql.db import open_registry
from tests.integration.nightly_box import ENGINE_ALIAS, ENGINE_TARGET, NEW, Box, target

pytestmark = pytest.mark.waits  # on a slowed stand-in server: spread (tests/conftest.py)

FAST, SLOW = "0.02", "0.06"  # seconds a token
# what the gate and the alarm allow: far from a 3x slowdown (67% slower), and wide enough for
# what a busy test machine adds to a request (HTTP, threads) beside the stand-in's delay
MAX_REGRESSION = 0.3
ROUNDS = 2  # each side's rounds in the A/B (the default is 3)
UNFUSED = {"FAKE_TRTLLM_PLUGIN_CONFIG": json.dumps({"use_fused_mlp": False}),
           "FAKE_OPENAI_DELAYS": json.dumps({"build_config.plugin_config.use_fused_mlp=false":
                                             float(SLOW)})}
NOISY = {"FAKE_OPENAI_SLOW_FRACTION": "0.25", "FAKE_OPENAI_SLOW_FACTOR": "4",
         "FAKE_OPENAI_SEED": "7"}


def built(tmp_path: Path, *, requests: int = 4, rounds: int = ROUNDS) -> Box:
    """A box whose recipe's smoke sends *requests* requests a level, built at FAST; the
    gate and the alarm allow MAX_REGRESSION, the gate measures *rounds* rounds a side."""
    made = Box(tmp_path, f"sqlite:///{tmp_path / 'home' / 'registry.db'}",
               max_regression=MAX_REGRESSION)
    recipe = yaml.safe_load(made.recipe.read_text())
    recipe["smoke"]["requests"] = requests
    recipe["nightly"] = {"max_regression": MAX_REGRESSION, "gate_rounds": rounds}
    made.recipe.write_text(yaml.safe_dump(recipe))
    made.run("build", str(made.recipe), env={"FAKE_OPENAI_TOKEN_DELAY_S": FAST})
    return made


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return built(tmp_path)


def gated(box: Box, env: dict[str, str], *args: str, code: int = 0
          ) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Bump the driver, run the nightly with *args* and *env* (exiting *code*); the engine's
    promotion, the digest the alias held before, and the engine target's report."""
    with open_registry(box.registry_url) as registry, registry.session() as session:
        before = get_alias(session, ENGINE_ALIAS)
    assert before
    box.bump(NEW)
    report = box.nightly(*args, code=code, **env)
    assert report["exit_code"] == code
    [promotion] = target(report, ENGINE_TARGET)["promotions"]
    assert promotion["old"] == before
    return promotion, before, target(report, ENGINE_TARGET)


def test_a_uniformly_slower_candidate_is_held(box: Box) -> None:
    held = {"FAKE_OPENAI_TOKEN_DELAY_S": FAST, **UNFUSED}
    promotion, before, _ = gated(box, held, code=5)  # held: the nightly exits 5
    assert (promotion["action"], promotion["rule"]) == ("held", "ab"), promotion
    assert "same-run A/B" in promotion["reason"]
    assert all(level["regressed"] and level["rounds"] == ROUNDS for level in promotion["levels"])
    for level in promotion["levels"]:
        assert level["new_tokens_per_s"] < 0.5 * level["old_tokens_per_s"]
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == before


def test_a_noisy_node_holds_nothing_when_nothing_changed(tmp_path: Path) -> None:
    # a quarter of all requests 4x slower at random: the median of 16 requests a level (of
    # each round, and of the rounds) stays with the other three quarters, so neither the
    # gate nor the alarm sees a change where there is none (a burst's mean would drop by 43%)
    box = built(tmp_path, requests=16)
    promotion, before, engine = gated(box, {"FAKE_OPENAI_TOKEN_DELAY_S": FAST, **NOISY})
    assert not engine["regressions"], engine
    assert (promotion["action"], promotion["rule"]) == ("promoted", "ab"), promotion
    assert not any(level["regressed"] for level in promotion["levels"])
    with open_registry(box.registry_url) as registry, registry.session() as session:
        assert get_alias(session, ENGINE_ALIAS) == promotion["new"] != before
        event = alias_history(session, ENGINE_ALIAS)[-1]
        assert event.details is not None
        assert (event.details["rule"], event.details["gate_rule"]) == ("nightly", "ab")


def test_both_slower_than_their_history_is_the_node_not_the_candidate(box: Box) -> None:
    # built at 20 ms a token; tonight every engine takes 60 ms: the node regressed
    # (the toolchain regression alarm's business: the nightly exits 5 for it, not for this,
    # and holds the alias unless the run accepts the regression, as this one does)
    promotion, _, _ = gated(box, {"FAKE_OPENAI_TOKEN_DELAY_S": SLOW}, "--accept-regression",
                            code=5)
    assert (promotion["action"], promotion["rule"]) == ("promoted", "ab"), promotion
    assert {level["figure"] for level in promotion["levels"]} == \
        {"median_request_tokens_per_s"}


def test_an_incumbent_that_cannot_load_leaves_the_fallback_to_decide(box: Box) -> None:
    # a TRT-LLM bump: the new release cannot deserialize the old engine
    promotion, _, _ = gated(box, {"FAKE_OPENAI_TOKEN_DELAY_S": FAST,
                                       "FAKE_TRTLLM_VERSION": "1.3.0"})
    assert (promotion["action"], promotion["rule"]) == ("promoted", "fallback"), promotion
    assert "the incumbent cannot run here" in promotion["reason"]
    assert "candidate's own smoke" in promotion["reason"]
    assert "Failed to deserialize cuda engine" in promotion["reason"]  # the server's log


def test_a_node_busy_as_each_artifact_first_serves_raises_no_alarm(tmp_path: Path) -> None:
    # every artifact's first server start this night is 4x slower (the node busy just then):
    # the re-proved checkpoint's smoke falls below the alarm's line (the alarm on that smoke
    # alone exited 5); the alarm decides by the fastest of this run's measurements
    # (pipeline.nightly.alarm), measuring the checkpoint again, so nothing regressed and the
    # nightly exits 0. Three rounds: the first round of each artifact in a new directory is
    # busy too, so two are not (no single measurement decides, as none should)
    box = built(tmp_path, rounds=3)
    box.bump(NEW)
    report = box.nightly(FAKE_OPENAI_TOKEN_DELAY_S=FAST, FAKE_OPENAI_SLOW_FACTOR="4",
                         FAKE_OPENAI_BUSY_ONCE=str(tmp_path / "busy"))
    assert report["regressions"] == [], report
    [promotion] = target(report, ENGINE_TARGET)["promotions"]
    assert (promotion["action"], promotion["rule"]) == ("promoted", "ab"), promotion
    checkpoint = target(report, ENGINE_TARGET + "-pytorch")
    assert checkpoint["verdict"] == "re-proved", checkpoint
    [smoke] = [p["levels"] for p in checkpoint["promotions"]]  # its smoke alone: below the line
    assert any(lv["new_tokens_per_s"] < (1 - MAX_REGRESSION) * lv["old_tokens_per_s"]
               for lv in smoke), smoke
    measured_again = sorted((tmp_path / "home" / "work" / "alarm").glob("*/round*.log"))
    assert len(measured_again) == 3, measured_again  # the checkpoint's, one dir
