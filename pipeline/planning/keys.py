"""Stage keys: what a stage run is asked to produce, known before anything runs.

    key = "k1:" + sha256(canonical_json({stage, stage_version, params, inputs, toolchain}))

Input keys are sorted, so the order a recipe lists things in never matters. Bump a stage's
version when its code changes what it produces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from registry.identity.digest import sha256_of_json

KEY_PREFIX: Final = "k1:"

STAGE_VERSIONS: Final[Mapping[str, int]] = {
    "snapshot": 1,
    "quantize": 1,
    "convert": 1,
    "build": 1,
    "smoke": 1,
    "warm-cache": 1,  # not a stage of the plan: the caches a smoke's server wrote
}


def stage_key(
    stage: str,
    params: Mapping[str, Any],
    inputs: Iterable[str],
    toolchain: Mapping[str, Any],
) -> str:
    body = {
        "stage": stage,
        "stage_version": STAGE_VERSIONS[stage],
        "params": dict(params),
        "inputs": sorted(inputs),
        "toolchain": dict(toolchain),
    }
    return KEY_PREFIX + sha256_of_json(body).hex


def short_key(key: str) -> str:
    return key.removeprefix(KEY_PREFIX)[:12]
