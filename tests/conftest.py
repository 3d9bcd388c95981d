"""How the suite shares its costly fixtures when pytest-xdist runs it on several workers.

scripts/test runs `pytest -n 4 --dist loadgroup`: tests are spread one by one over the workers,
except those in one `xdist_group`, which run on one worker. A module-, package- or
session-scoped fixture is made once per worker that asks for it, and a few cost tens of seconds
each (a Ray cluster, the tiny Llama and its quantized checkpoints, a vLLM model, a built
wheel). Every test that uses one of those is put in the group named after it (where it is
defined, and its name), so it is made once. A test that uses several goes with the
session-scoped one, the most widely shared. A module that names its own `xdist_group` keeps it:
the Ray modules are split into two groups, each on its own worker with its own cluster, so that
neither half waits for the other.

Fixtures used in more than one folder are defined here or in the plugins below, never imported
by a test module: the S3 servers, buckets and stores (tests/integration/s3_fixtures.py), the
registry databases (tests/integration/db_fixtures.py), and `vllm_python`.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.models import unavailable
from tests.ordering import spread_waiting

pytest_plugins = ("tests.integration.s3_fixtures", "tests.integration.db_fixtures")

# The stand-ins in tests/fakes are `#!/usr/bin/env python3` scripts: the python3 they find is
# this venv's, as in the builder image, where trtllm-build and trtllm-serve are entry points of
# its one Python. Otherwise, where python3 is a pyenv shim, every nvidia-smi, trtllm-build
# and trtllm-serve call first runs ~25 shell processes (0.1-0.5 s each call, thousands of
# calls), and trtllm-serve's stand-in starts twice (it re-runs itself under a Python with
# transformers). Set here, before any test or worker builds an environment from os.environ.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
# torch's OpenMP threads (the quantizer, the tiny models, vLLM) spin for a while when idle,
# waiting for the next parallel region: on 2 cores shared by 4 workers that spinning is CPU the
# others need (a loaded INT4-AWQ export: 11-12 CPU-s passive against 13-18 spinning, same
# thread count, same numbers). Idle threads sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# vLLM's CPU build starts three processes per server by default: the API server, its engine
# core and the engine's model worker (the CPU platform turns vLLM's uni-process executor into
# its multiprocess one while VLLM_ENABLE_V1_MULTIPROCESSING is on: vllm/platforms/cpu.py,
# check_and_update_config), each importing torch and vLLM (~10 CPU-s, ~11 starts a run). Off
# (vLLM's own setting), the worker runs inside the engine core: still a real server, still a
# group of two processes for enginectl to stop. tests/deploy/test_vllm_cpu.py's SIGTERM test
# turns it back on, so the default layout stays tested.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM titles its engine core and worker with setproctitle, which by default writes the title
# over the process's environment block too, where /proc/PID/environ reads it: the TAG that
# tests/processes.py's `tagged_processes` looks for vanished from them, so a leaked engine core
# went unseen. SPT_NOENV (setproctitle's own setting) keeps the environment intact.
os.environ.setdefault("SPT_NOENV", "1")

SHARED = frozenset({
    "ray_cluster",  # tests/ray: four raylets
    "tiny_model", "fp8_checkpoint",  # tests/quantize, tests/integration: the tiny Llama;
    # tests/quantize: a real modelopt export
    "tiny_models",  # tests/smoke: the tiny Llamas vLLM serves
    "built",  # tests/deploy/test_vllm_cpu.py: an entry built and pulled
    "seeded",  # tests/integration/test_compare.py: a registry with smoked engines
    "installed",  # tests/e2e/test_packaging.py: the wheel, installed in a fresh venv
})
"""The costly fixtures shared by several tests (by name; the scope is read from pytest)."""


@pytest.fixture(scope="session", autouse=True)
def trtllm_serve_memo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the trtllm-serve stand-in remembers the tokenizer and config loads that succeeded
    (FAKE_TRTLLM_MEMO, one per worker; tests/fakes/transformers_memo.py): ~350 starts import
    transformers a few times instead of every time, and a load that fails still fails."""
    memo = tmp_path_factory.mktemp("trtllm-serve-memo")
    os.environ["FAKE_TRTLLM_MEMO"] = str(memo)
    return memo


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """scripts/install-vllm's python; the tests that need it skip without it, and fail
    instead under CI=true."""
    proc = subprocess.run([str(ROOT / "scripts" / "install-vllm"), "--check"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        unavailable(proc.stderr.strip() or "vLLM's CPU build is not installed; "
                    "run scripts/install-vllm", "vLLM's CPU build is")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the marks to group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        if definitions is None:
            continue
        shared = []
        for name in SHARED.intersection(getattr(item, "fixturenames", ())):
            fixture = definitions.name2fixturedefs[name][-1]  # the one this test gets
            if fixture.scope in ("session", "package", "module"):
                shared.append((fixture.scope != "session", fixture.baseid, name))
        if shared and item.get_closest_marker("xdist_group") is None:  # a module may choose
            _, where, name = min(shared)
            item.add_marker(pytest.mark.xdist_group(f"{where or 'tests'}::{name}"))
    items[:] = spread_waiting(
        items, waits=lambda item: item.get_closest_marker("waits") is not None,
        quick=lambda item: item.nodeid.startswith("tests/unit/"))


_UNGROUPED = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collect garbage less often from here on, and note when the groups did not take.

    A worker's heap after collection (every test, pytest, hypothesis, SQLAlchemy, boto3) is
    ~0.7 M objects, and at Python's default thresholds its garbage collections were ~25 % of
    the worker's CPU (measured over tests/unit and a registry module: 6.9 of 26.8 CPU-s, 2.3
    after this). So the heap as collected is frozen out of later collections, and the young
    generation is collected every 10,000 allocations instead of every 700. Nothing the suite
    checks waits for a collection; the processes it starts keep Python's defaults.

    Grouping. pytest-xdist's loadgroup sends a group to one
    worker by the `@group` it appends to each marked test's node id (by now, collection is
    over). Its hook once ran before the one above (no mark yet), and pytest 9.2 ignores the
    renaming; either way every costly fixture was made once per worker (four Ray clusters,
    the deploy build twice, the quantized exports up to four times) and nothing said so.
    Such a run now fails each marked test."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist's workers
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None
            and item.nodeid.rfind("@") <= item.nodeid.rfind("]")]
    if lost:
        session.config.stash[_UNGROUPED] = (
            f"{len(lost)} tests marked xdist_group are not grouped: pytest "
            f"{pytest.__version__} with this pytest-xdist does not group tests (see the pin "
            "in pyproject.toml)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    ungrouped = item.config.stash.get(_UNGROUPED, None)
    if ungrouped is not None and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(ungrouped, pytrace=False)


_CHECKOUT_BEFORE = pytest.StashKey["set[str] | None"]()


def _checkout_changes() -> set[str] | None:
    """`git status` of the checkout, a line per changed or untracked file (None: no git)."""
    done = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                           "--untracked-files=all"], capture_output=True, text=True, check=False)
    return set(done.stdout.splitlines()) if done.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, once
        session.config.stash[_CHECKOUT_BEFORE] = _checkout_changes()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run when a test wrote into the checkout (a tool's default output path,
    relative to where a test ran it, once left ./model.cache there)."""
    before = session.config.stash.get(_CHECKOUT_BEFORE, None)
    after = _checkout_changes() if before is not None else None
    if before is None or after is None or not (written := sorted(after - before)):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests wrote into the checkout {ROOT}: {', '.join(written)}",
                            red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
