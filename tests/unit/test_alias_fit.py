"""registry.ops.alias_fit: which of an alias's targets runs on a node's toolchain. Pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from registry.errors import AliasToolchainError
from registry.ops.alias_fit import fit, needs
from registry.sql.alias_targets import Target

AT = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def engine(digest: str, built: str | None, *proofs: dict[str, Any],
           status: str = "ready") -> Target:
    return Target(digest, AT, "trtllm-engine", status,
                  {"trtllm": built, "tensorrt": "10.14.1.48"} if built else {}, list(proofs))


@pytest.mark.parametrize(("target", "node", "missing"), [
    (engine("a", "1.2.1", {"trtllm": "1.2.1"}), {"trtllm": "1.2.1"}, []),
    (engine("a", "1.3.0", {"trtllm": "1.3.0"}), {"trtllm": "1.2.1"}, ["trtllm 1.3.0"]),
    # built with another release: its plan does not load, whatever the proofs say
    (engine("a", "1.3.0"), {"trtllm": "1.2.1"}, ["trtllm 1.3.0"]),
    # never smoked, built where nothing was recorded: nothing says it cannot run
    (engine("a", None), {"trtllm": "1.2.1"}, []),
    # proven on two releases: one is the node's
    (engine("a", None, {"trtllm": "1.3.0"}, {"trtllm": "1.2.1"}), {"trtllm": "1.2.1"}, []),
    # a CUDA minor release runs what its major built; another major does not
    (engine("a", None, {"cuda": "12.8"}), {"cuda": "12.9"}, []),
    (engine("a", None, {"cuda": "13.0"}), {"cuda": "12.9"}, ["cuda 13.0"]),
    # the node reports nothing to compare: nothing is held against the target
    (engine("a", "1.3.0", {"trtllm": "1.3.0"}), {"driver": "575.57.08"}, []),
    (Target("v", AT, "vllm", "ready", {}, [{"vllm": "0.33.0", "trtllm": "9"}]),
     {"vllm": "0.32.0", "trtllm": "1.2.1"}, ["vllm 0.33.0"]),
])
def test_what_a_target_needs(target: Target, node: dict[str, Any], missing: list[str]) -> None:
    assert needs(target, node) == missing


def test_the_latest_earlier_target_that_runs_and_is_ready_or_superseded() -> None:
    history = [engine("c", "1.3.0", {"trtllm": "1.3.0"}),
               engine("q", "1.2.1", {"trtllm": "1.2.1"}, status="quarantined"),
               engine("b", "1.2.1", {"trtllm": "1.2.1"}, status="superseded"),
               engine("a", "1.2.1", {"trtllm": "1.2.1"})]
    assert fit("m/prod", "c", history, {"trtllm": "1.3.0"}) is None
    fitted = fit("m/prod", "c", history, {"trtllm": "1.2.1", "tensorrt": "10.14.1.48"})
    assert fitted is not None
    assert (fitted.digest, fitted.status) == ("b", "superseded")
    assert fitted.note == ("m/prod points at c…, which needs trtllm 1.3.0 (this node has "
                           "tensorrt 10.14.1.48, trtllm 1.2.1); pulling its earlier target b "
                           "since 2026-12-01 03:00, which runs here")
    with pytest.raises(AliasToolchainError, match=r"^m/prod needs trtllm 1.3.0: its target c… "
                       r"was proven only there, and this node has trtllm 1.1.0;") as raised:
        fit("m/prod", "c", history, {"trtllm": "1.1.0"})
    assert raised.value.exit_code == 6
    assert fit("m/prod", "unknown", history, {"trtllm": "1.1.0"}) is None  # not in history
