"""deploy/scheduling: the nightly's CronJob and systemd units parse, and the command line each
runs is one enginectl's own CLI parser accepts."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from pipeline.cli import main

SCHEDULING = Path(__file__).resolve().parents[2] / "deploy" / "scheduling"


def accepted(argv: list[str]) -> click.Context:
    """Parse *argv* (without the program: a command and its arguments) as `enginectl`
    would; raises on anything it refuses."""
    root = click.Context(main, info_name="enginectl")
    name, command, rest = main.resolve_command(root, list(argv))
    assert command is not None
    return command.make_context(name or "", rest, parent=root)


def expand(argv: list[str]) -> list[str]:
    """Environment references ($(NAME) in Kubernetes, ${NAME} in systemd) as a value; a
    systemd word that is `$NAME` alone as none (NAME unset: systemd splits it into no word)."""
    return [re.sub(r"\$[({][A-Z_]+[)}]", "https://hooks.example.com/x", a) for a in argv
            if not re.fullmatch(r"\$[A-Z_]+", a)]


def test_cronjob_runs_the_nightly_on_the_ray_cluster_one_at_a_time() -> None:
    job = yaml.safe_load((SCHEDULING / "nightly-cronjob.yaml").read_text())
    assert job["kind"] == "CronJob"
    assert job["apiVersion"] == "batch/v1"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    [container] = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert "enginectl-builder" in container["image"]
    argv = container["command"]
    assert argv[:2] == ["enginectl", "nightly"]
    parsed = accepted(expand(argv[1:]))
    assert parsed.params["executor"] == "ray"
    assert parsed.params["address"].startswith("ray://")
    assert parsed.params["recipes"] == ()  # every recorded recipe


def test_systemd_service_and_timer() -> None:
    service = configparser.ConfigParser(interpolation=None, strict=False)
    service.read(SCHEDULING / "enginectl-nightly.service")
    assert service["Service"]["Type"] == "oneshot"
    argv = shlex.split(service["Service"]["ExecStart"])
    assert Path(argv[0]).name == "enginectl"
    parsed = accepted(expand(argv[1:]))
    assert parsed.info_name == "nightly"
    assert parsed.params["executor"] == "local"
    timer = configparser.ConfigParser(interpolation=None, strict=False)
    timer.read(SCHEDULING / "enginectl-nightly.timer")
    assert timer["Timer"]["Unit"] == "enginectl-nightly.service"
    assert timer["Timer"]["OnCalendar"]
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_the_parser_refuses_what_enginectl_refuses() -> None:
    with pytest.raises(click.UsageError):
        accepted(["nightly", "--executor", "slurm"])
    with pytest.raises(click.UsageError):
        accepted(["nightly", "--every-night"])
