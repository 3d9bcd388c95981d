"""The Kubernetes examples in deploy/ parse, say what they mean, and run command lines that
enginectl accepts; the server container's one-liner runs the argv a real pull wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from pipeline.cli import main
from pipeline.deploy.pull import pull
from registry.config import RegistryConfig
from registry.context import Context
from tests.deploy import artifacts
from tests.helpers import ROOT

PULL = ROOT / "deploy" / "k8s-pull-deployment.yaml"
SERVE = ROOT / "deploy" / "k8s-serve-deployment.yaml"


def pod(path: Path) -> dict[str, Any]:
    (document,) = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert document["apiVersion"] == "apps/v1"
    assert document["kind"] == "Deployment"
    spec = document["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"][
        "labels"].items()
    template: dict[str, Any] = spec["template"]["spec"]
    return template


def accepted(argv: list[str]) -> dict[str, Any]:
    """Parse *argv* (without the leading `enginectl`) exactly as the CLI would, running
    nothing; the subcommand's parameters. A usage error fails the test."""
    assert argv[0] == "enginectl"
    try:
        with main.make_context("enginectl", argv[1:]) as root:
            command = main.get_command(root, argv[1])
            assert command is not None, argv
            with command.make_context(argv[1], argv[2:], parent=root) as ctx:
                return dict(ctx.params)
    except click.ClickException as exc:
        pytest.fail(f"enginectl refuses {argv}: {exc.format_message()}")


def mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def env_names(container: dict[str, Any]) -> set[str]:
    return {item["name"] for item in container.get("env", [])}


def test_the_init_container_pulls_for_this_node_and_the_server_runs_what_it_wrote(
    tmp_path: Path
) -> None:
    spec = pod(PULL)
    (init,) = spec["initContainers"]
    (server,) = spec["containers"]
    params = accepted(init["command"])
    assert init["command"][:2] == ["enginectl", "pull"]
    assert params["ref"] is None
    assert params["model"] == "llama-3.3-70b-instruct"
    assert params["gpu"] == "auto"
    assert params["output"] == Path("/models")
    assert params["host"] == "0.0.0.0"  # noqa: S104 - what a pod must listen on
    assert params["port"] == server["ports"][0]["containerPort"]
    assert mounts(init)["models"] == mounts(server)["models"] == "/models"
    assert {"ENGINECTL_STORE_URL", "ENGINECTL_REGISTRY_URL", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY"} <= env_names(init)
    cache = next(e["value"] for e in init["env"] if e["name"] == "ENGINECTL_CACHE_DIR")
    assert mounts(init)["enginectl-cache"] == cache
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(volumes) == {"models", "enginectl-cache", "dshm"}  # dshm: the server's /dev/shm
    assert init["resources"]["limits"]["nvidia.com/gpu"] == \
        server["resources"]["limits"]["nvidia.com/gpu"]  # --gpu auto sees the server's GPUs

    # the server's one-liner runs the argv that a real pull wrote into /models/serve.json
    command = server["command"]
    assert command[:2] == ["python3", "-c"]
    config = RegistryConfig.from_env({"ENGINECTL_HOME": str(tmp_path / "home")})
    with Context(config) as ctx:
        engine = artifacts.engine(ctx, tmp_path / "engine")
        pulled = pull(ctx, engine, tmp_path / "models", executable="/bin/echo",
                      host=params["host"], port=params["port"])
    code = command[2].replace('"/models/serve.json"', repr(str(tmp_path / "models" /
                                                                "serve.json")))
    assert code != command[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == pulled.argv[1:]
    assert pulled.argv[pulled.argv.index("--port") + 1] == "8000"


def test_the_one_container_form_runs_enginectl_serve() -> None:
    spec = pod(SERVE)
    (server,) = spec["containers"]
    params = accepted(server["command"])
    assert server["command"][:2] == ["enginectl", "serve"]
    assert params["model"] == "llama-3.1-8b-instruct"
    assert params["gpu"] == "auto"
    assert params["port"] == server["ports"][0]["containerPort"]
    home = next(e["value"] for e in server["env"] if e["name"] == "ENGINECTL_HOME")
    assert mounts(server)["enginectl-home"] == home  # cache and serving dir on one volume
    cache = next(e["value"] for e in server["env"] if e["name"] == "ENGINECTL_CACHE_DIR")
    assert Path(cache).is_relative_to(home)  # (the default cache is ~/.cache, elsewhere)
    assert spec["terminationGracePeriodSeconds"] >= 30


def test_a_command_enginectl_refuses_is_caught() -> None:
    """The check above is real: a misspelt option fails it."""
    with pytest.raises(pytest.fail.Exception, match="No such option '--modle'"):
        accepted(["enginectl", "pull", "--modle", "m", "-o", "/models"])
