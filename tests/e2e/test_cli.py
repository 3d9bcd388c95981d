"""What every `enginectl` command shares, run as a user runs it: a reader that stops reading
(`| head`), -q/-v, help with examples, bad input with the valid values, an unexpected error
as one line and exit 1, and `--traceback`."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from pipeline.cli import main
from tests.cli_forkserver import ENGINECTL, run_cli
from tests.e2e.cli import GOOD_RECIPE, PREFIX, env_for
from tests.e2e.cli import enginectl as run
from tests.helpers import ROOT

PIPE_BYTES = 4096  # the smallest pipe Linux makes: the writer blocks after one page
RUNS = 5


def read_then_close(home: Path, args: list[str], lines: int) -> tuple[int, str]:
    """Run enginectl into a one-page pipe, read *lines* lines, close the pipe while it is
    still writing (its output is longer than the pipe), and return (status, stderr)."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    proc = subprocess.Popen([ENGINECTL, *args], cwd=ROOT, env=env_for(home), stdout=write_end,
                            stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as out:
        for _ in range(lines):
            assert out.readline()
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr


@pytest.mark.parametrize("args", [
    ["plan", str(GOOD_RECIPE), "--commands"],
    ["plan", str(GOOD_RECIPE), "--json"],
    ["plan", str(GOOD_RECIPE)],
    ["--help"],
])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path,
                                                            args: list[str]) -> None:
    for _ in range(RUNS):
        code, stderr = read_then_close(tmp_path, ["-q", *args], lines=1)
        assert (code, stderr) == (0, "")


def test_the_readme_main_command_passes_under_pipefail(tmp_path: Path) -> None:
    """What scripts/main runs, with a real `head`."""
    line = f"{ENGINECTL} plan {GOOD_RECIPE} --commands | head -n 3"
    for _ in range(RUNS):
        done = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=ROOT,
                              env=env_for(tmp_path), capture_output=True, text=True,
                              check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 3
        assert "error" not in done.stderr


def test_quiet_silences_notes_and_verbose_contradicts_it(tmp_path: Path) -> None:
    noisy = run(tmp_path, "plan", str(GOOD_RECIPE))
    assert noisy.stderr.startswith("enginectl: note: ")
    for args in (["-q", "plan", str(GOOD_RECIPE)], ["plan", "-q", str(GOOD_RECIPE)]):
        quiet = run(tmp_path, *args)
        assert quiet.returncode == 0
        assert quiet.stderr == ""
        assert quiet.stdout == noisy.stdout
    both = run(tmp_path, "-q", "plan", "-v", str(GOOD_RECIPE))
    assert both.returncode == 2
    (line,) = both.stderr.splitlines()
    assert line.startswith(f"{PREFIX}enginectl plan: -q/--quiet and -v/--verbose contradict")


@pytest.mark.parametrize(("args", "fragment"), [
    (["compare", "--model", ""], "Invalid value for '--model': '' is empty"),
    (["resolve", "--model", " ", "--gpu", "h100"], "Invalid value for '--model': ' ' is empty"),
    (["ls", "--model", ""], "Invalid value for '--model': '' is empty"),
    (["import", ".", "--kind", "vllm", "--model", ""], "Invalid value for '--model'"),
    (["ls", "--status", "bogus"],
     "--status 'bogus' is not one of building, built, ready, quarantined, superseded, deleted"),
    (["ls", "--kind", "engine"], "--kind 'engine' is not one of trtllm-engine, "),
    (["nightly", "--notify", "hooks.example/x"],
     "--notify 'hooks.example/x': not an http:// or https:// URL"),
])
def test_bad_filters_are_refused_with_the_valid_values(tmp_path: Path, args: list[str],
                                                       fragment: str) -> None:
    done = run(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(PREFIX)
    assert fragment in line
    assert not (tmp_path / "registry.db").exists()  # refused before anything was opened


# ---- help: an example for every command, help for every option -----------------------------

def commands(group: click.Group = main, prefix: str = "") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = [(prefix.strip() or "enginectl", group)]
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found += commands(command, f"{path} ")
        else:
            found.append((path, command))
    return found


ALL_COMMANDS = [pytest.param(command, id=path) for path, command in commands()]


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_help_has_an_example(command: click.Command) -> None:
    assert re.search(r"\x08\s*\n\s*Examples:\n", command.help or ""), command.help


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_every_option_has_help(command: click.Command) -> None:
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{param.opts} has no help"


def test_every_command_takes_quiet_and_verbose() -> None:
    for path, command in commands():
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert {"-q", "--quiet", "-v", "--verbose"} <= options, path


def test_shell_completion_lists_the_commands(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "_ENGINECTL_COMPLETE": "bash_complete",
           "COMP_WORDS": "enginectl i", "COMP_CWORD": "1"}
    done = run_cli([ENGINECTL], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "plain,info" in done.stdout.splitlines()
    assert "plain,import" in done.stdout.splitlines()


# ---- unexpected errors ----------------------------------------------------------------------

# The real entry point and error handling with one extra command, added the way every command
# module adds its own, that fails the way a bug would.
BROKEN = textwrap.dedent("""
    import sys
    from pipeline.cli import entry, main
    from pipeline.cli.base import handle_errors

    @main.command("explode")
    @handle_errors
    def explode() -> None:
        '''Fail like a bug.'''
        {}.get("key")["field"]

    sys.argv[0] = "enginectl"
    entry()
""")


def test_an_unexpected_error_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", BROKEN, "explode"], cwd=ROOT,
                          env=env_for(tmp_path), capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line == (f"{PREFIX}unexpected TypeError: 'NoneType' object is not subscriptable "
                    "(rerun with --traceback)")


def test_traceback_shows_the_stack(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", BROKEN, "--traceback", "explode"], cwd=ROOT,
                          env=env_for(tmp_path), capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 1
    assert "Traceback (most recent call last):" in done.stderr
    assert 'in explode' in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"{PREFIX}unexpected TypeError")


def test_a_bad_lease_ttl_is_a_usage_error(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "ENGINECTL_LEASE_TTL_S": "soon"}
    done = run_cli([ENGINECTL, "plan", str(GOOD_RECIPE)], cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (f"{PREFIX}ENGINECTL_LEASE_TTL_S='soon': expected seconds between 0.5 and "
                    "86400, e.g. 120")


def test_a_bad_warm_capture_cap_is_a_usage_error(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "ENGINECTL_WARM_CAPTURE_MAX_BYTES": "lots"}
    done = run_cli([ENGINECTL, "plan", str(GOOD_RECIPE)], cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (f"{PREFIX}ENGINECTL_WARM_CAPTURE_MAX_BYTES='lots': expected a size in "
                    "bytes, e.g. 4G or 1073741824")


def test_python_m_pipeline_cli_runs_it(tmp_path: Path) -> None:
    """`python -m pipeline.cli` is the console script: the same plan, the same one-line error
    (the other end-to-end tests run the installed `enginectl`)."""
    def both(*args: str) -> list[tuple[int, str, str]]:
        module = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=ROOT,
                                env=env_for(tmp_path), capture_output=True, text=True,
                                check=False, timeout=60)
        script = run(tmp_path, *args)
        return [(done.returncode, done.stdout, done.stderr) for done in (module, script)]

    module, script = both("plan", str(GOOD_RECIPE), "--json")
    assert module == script
    assert module[0] == 0
    module, script = both("plan", "recipes/missing.yaml")
    assert module == script
    assert module[0] == 2
    assert module[2].startswith(PREFIX)
