"""The stand-in server's speed knobs (tests/fakes/openai_server.py), which the gate's and the
alarm's tests rely on: a per-artifact delay chosen by a value in the served directory's
config.json, and seeded noise. No server is started and nothing is timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.openai_server import Fake

SELECTOR = "build_config.plugin_config.use_fused_mlp=false"


def engine(directory: Path, fused: bool) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(
        {"version": "1.2.1", "build_config": {"plugin_config": {"use_fused_mlp": fused}}}))
    return directory


def test_the_delay_follows_the_served_directory(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OPENAI_TOKEN_DELAY_S", "0.02")
    monkeypatch.setenv("FAKE_OPENAI_DELAYS", json.dumps({SELECTOR: 0.06}))
    fused, unfused = Fake("a", 512), Fake("b", 512)
    fused.delay_for(engine(tmp_path / "fused", True))
    unfused.delay_for(engine(tmp_path / "unfused", False))
    assert fused.generation_delay(4) == pytest.approx(0.08)
    assert unfused.generation_delay(4) == pytest.approx(0.24)


def test_seeded_noise_slows_the_asked_share_by_the_asked_factor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_OPENAI_TOKEN_DELAY_S", "0.01")
    monkeypatch.setenv("FAKE_OPENAI_SLOW_FRACTION", "0.25")
    monkeypatch.setenv("FAKE_OPENAI_SLOW_FACTOR", "4")
    monkeypatch.setenv("FAKE_OPENAI_SEED", "7")
    first = Fake("a", 512)
    drawn = [first.generation_delay(1) for _ in range(400)]
    again = Fake("a", 512)
    assert drawn == [again.generation_delay(1) for _ in range(400)]  # the seed decides
    assert {round(d, 6) for d in drawn} == {0.01, 0.04}
    slow = sum(d > 0.02 for d in drawn) / len(drawn)
    assert 0.15 < slow < 0.35
