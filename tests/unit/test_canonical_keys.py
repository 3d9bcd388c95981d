"""Canonical JSON, digests and stage keys: stable, order independent, strict."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.planning.keys import stage_key
from registry.identity.canonical import canonical_json, floats_as_strings
from registry.identity.digest import Digest, sha256_of_json

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def test_canonical_json_is_sorted_compact_utf8() -> None:
    expected = '{"a":[true,null,"é"],"b":1}'.encode()
    assert canonical_json({"b": 1, "a": [True, None, "é"]}) == expected


@pytest.mark.parametrize("bad", [{"x": 1.5}, {1: "a"}, {"x": {1, 2}}, [float("nan")]])
def test_canonical_json_refuses_what_it_cannot_write_stably(bad: object) -> None:
    with pytest.raises(TypeError):
        canonical_json(bad)


def test_floats_are_written_as_strings_by_the_caller() -> None:
    assert canonical_json(floats_as_strings({"f": 0.9, "l": [1.0]})) == b'{"f":"0.9","l":["1.0"]}'


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=8))
def test_canonical_json_ignores_key_order(value: dict[str, object]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert canonical_json(value) == canonical_json(reordered)
    assert json.loads(canonical_json(value)) == value


@given(st.lists(st.text(min_size=1, max_size=10), max_size=6))
def test_stage_key_ignores_input_order(inputs: list[str]) -> None:
    assert stage_key("build", {}, inputs, {}) == stage_key("build", {}, list(reversed(inputs)), {})


def test_stage_key_golden_vectors() -> None:
    """If one of these changes, every key in every registry changes: bump deliberately."""
    snapshot = stage_key("snapshot", {"source": "hf://a/b", "revision": "0" * 40}, [], {})
    body = (
        b'{"inputs":[],"params":{"revision":"' + b"0" * 40 + b'","source":"hf://a/b"},'
        b'"stage":"snapshot","stage_version":1,"toolchain":{}}'
    )
    assert snapshot == "k1:" + hashlib.sha256(body).hexdigest()
    assert snapshot == "k1:4c7874c4955b741855f6ba586174aa1ab48b265d27bda22727358a38521fcf4e"
    build = stage_key(
        "build", {"flags": {"--max_batch_size": "128"}}, ["k1:y", "k1:x"],
        {"gpu": "H100-SXM5-80GB", "sm": 90},
    )
    assert build == "k1:f2882410364a24db7828412161cbaa6f06684fcf877a58e3e73d2f4c94ca9500"


def test_keys_do_not_depend_on_the_hash_seed() -> None:
    code = (
        "from pipeline.planning.keys import stage_key;"
        "print(stage_key('quantize', {'b': [1, 2], 'a': {'z': 'x', 'y': None}},"
        " ['k1:b', 'k1:a'], {}))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1


@pytest.mark.parametrize(
    "text",
    ["sha256:" + "a" * 64, "xxh3-128:" + "0" * 32],
)
def test_digest_round_trips(text: str) -> None:
    assert str(Digest.parse(text)) == text


@pytest.mark.parametrize(
    "text",
    ["sha256:" + "A" * 64, "sha256:abc", "md5:" + "0" * 32, "xxh3-128:" + "0" * 64, "", "sha256:"],
)
def test_digest_parsing_is_strict(text: str) -> None:
    with pytest.raises(ValueError, match="digest"):
        Digest.parse(text)


def test_sha256_of_json_matches_canonical_bytes() -> None:
    value = {"b": [1, 2], "a": "x"}
    assert sha256_of_json(value).hex == hashlib.sha256(canonical_json(value)).hexdigest()


def test_the_registry_schema_head_constant_matches_alembic() -> None:
    """registry.sql.schema.HEAD lets a current registry open without importing Alembic; it must
    name the newest migration."""
    from registry.sql import schema

    assert schema.head_revision() == schema.HEAD
