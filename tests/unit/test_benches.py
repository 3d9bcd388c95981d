"""Benches that keep running: every script in bench/ has a short mode (`--quick`), and CI's
main job runs each so (`scripts/bench-quick`, last in `scripts/main`). Checked from the files
alone; the runs themselves are the main job's (a few seconds each, a Ray cluster's start for
`ray_overhead.py`), never the suite's."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

BENCH = ROOT / "bench"
HELPERS = {"_support.py": "their shared module",
           "s3sink.py": "the server `upload_s3.py --sink` starts"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_bench_script_has_a_short_mode(name: str) -> None:
    text = (BENCH / name).read_text()
    assert "add_quick(parser)" in text, f"bench/{name} takes no --quick (`_support.add_quick`)"
    assert "quick_mode(" in text, f"bench/{name} never reads --quick (`_support.quick_mode`)"
    assert "--quick" in text.split('"""', 2)[1], f"bench/{name}'s docstring does not say it"


def test_ci_main_job_runs_every_script_in_its_short_mode() -> None:
    runner = (ROOT / "scripts" / "bench-quick").read_text()
    assert "for script in bench/*.py" in runner  # every script, as it is added
    assert re.search(r"python \$run --quick", runner)
    for name in HELPERS:
        assert name in runner  # named as run through the others, not forgotten
    main = (ROOT / "scripts" / "main").read_text()
    assert main.rstrip().endswith("scripts/bench-quick")
