"""What a marker may claim (`registry.ops.marker.parse_marker`, pure): anything enginectl never
writes is refused before a single name is proven or removed. The CLI's reproductions over a
real volume: tests/deploy/test_placement.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from registry.ops.marker import MARKER_SCHEMA, MarkerError, parse_marker

DIGEST = "sha256:" + "ab" * 32
HERE = Path("/models")


def data(**fields: Any) -> dict[str, Any]:
    return {"schema": MARKER_SCHEMA, "by": "pull", "digest": DIGEST, "sources": [DIGEST],
            "entries": ["config.json"], **fields}


@pytest.mark.parametrize(("fields", "problem"), [
    ({"schema": "enginectl.target/v0"}, "is not a enginectl.target/v1 marker"),
    ({"by": "rsync"}, "names 'rsync' as its writer"),
    ({"entries": ["../victim"]}, "names '../victim', which is not a name in it"),
    ({"entries": ["/srv/data"]}, "names '/srv/data', which is not a name in it"),
    ({"entries": ["a\\b"]}, "which is not a name in it"),
    ({"digest": "sha256:"}, "which is not a digest"),
    ({"sources": ["../x"]}, "records '../x', which is not a digest"),
    ({"under": [["..", DIGEST]]}, "names '..', which is not a name in it"),
    # a warm cache cannot be proven file by file: only the folder a pull places it in
    ({"writable": {"datasets": DIGEST}}, "names 'datasets' as a folder the runtime writes"),
    ({"writable": {"../.warm": DIGEST}}, "which is not a name in it"),
])
def test_a_marker_enginectl_never_writes_is_refused(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(MarkerError, match="refusing to replace /models") as caught:
        parse_marker(HERE, data(**fields))
    assert problem in str(caught.value)


def test_a_marker_pull_writes_is_read() -> None:
    marker = parse_marker(HERE, data(entries=["config.json", ".warm"],
                                     writable={".warm": DIGEST}))
    assert marker.writable == {".warm": DIGEST}
    assert marker.entries == frozenset({"config.json", ".warm"})
