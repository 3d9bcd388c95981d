"""A real local Ray cluster for the fleet tests, started once per xdist worker that runs them
(the Ray modules are two xdist groups, `tests/ray::ray_cluster-1` and `-2`, so two workers each
start one and run their halves side by side; one at a time without xdist). It is scoped to this
package, so it stops when its worker moves on to other tests: an idle cluster's raylets, GCS
and agents poll (~2.8 CPU-s a minute here), and a session-scoped one idled from its group's
last test to the end of the run (~10 minutes for each of the two).

`ray.cluster_utils.Cluster` starts real raylets (their own processes, on this machine):

    head     the CPU node (advertises no gpu:* resource)
    h100-a   gpu:H100-SXM5-80GB: 2, num_gpus 2
    h100-b   gpu:H100-SXM5-80GB: 2, num_gpus 2
    l40s     gpu:L40S: 1, num_gpus 1

Each node has its own directory: the config its `nvidia-smi` stand-in reports (SKU, driver;
`FakeNode.set_driver` bumps it), its ENGINECTL_HOME (work dirs, fetch cache), and the flag
files of tests/ray/nodebin. Its PATH finds tests/ray/nodebin, then tests/fakes/bin (nvidia-smi,
trtllm-build, trtllm-serve), as tests/integration/test_build.py does on one machine.

Token authentication is on (RAY_AUTH_MODE=token, a token made here): the CLI gets it the way
a user's does, through RAY_AUTH_TOKEN. Each test gets its own store and registry (`fleet_env`),
which the driver hands to the workers through the job's runtime environment.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.s3server import CLEARED, CREDENTIALS, S3Server
from tests.ray.fleet import SECRET, FakeCluster


@pytest.fixture(scope="package")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeCluster]:
    from ray.cluster_utils import Cluster

    token = secrets.token_hex(16)
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
               "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {name: os.environ.get(name) for name in ray_env}
    os.environ.update(ray_env)  # the raylets inherit it
    from ray._raylet import Config

    Config.initialize("")  # Ray caches its config at import: read RAY_AUTH_MODE again
    cluster = Cluster()
    fake = FakeCluster(cluster, tmp_path_factory.mktemp("ray-nodes"), {}, ray_env)
    try:
        for name in ("head", "h100-a", "h100-b", "l40s"):
            fake.add(name)  # one at a time: raylets on one host must not race for ports
        cluster.wait_for_nodes()
        fake.ray_env["RAY_ADDRESS"] = cluster.address
        yield fake
    finally:
        cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(params=[("file", "sqlite"), ("s3", "postgresql")], ids=["file-sqlite",
                                                                        "s3-postgresql"])
def fleet_env(request: pytest.FixtureRequest, tmp_path: Path,
              ray_cluster: FakeCluster) -> Iterator[dict[str, str]]:
    """The driver's environment: the cluster, and a fresh store and registry: the embedded
    defaults (a file store, SQLite: every node is on this machine), or the team setup (S3
    over HTTP, PostgreSQL)."""
    store, registry = request.param
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ENGINECTL_", "FAKE_", "AWS_")) and k not in CLEARED}
    # TTL 30 s: at 8 s, renewals from a node starved of CPU (3 busy loops beside the suite on
    # 2 cores) did not reach the registry in time and lost their lease mid-stage
    env |= {**ray_cluster.ray_env, "ENGINECTL_HOME": str(tmp_path / "driver-home"),
            "HF_HUB_OFFLINE": "1", "ENGINECTL_LEASE_TTL_S": "30",
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}
    bucket = None
    server: S3Server | None = None
    if store == "s3":
        server = request.getfixturevalue("s3_server")
        bucket = server.create_bucket()
        env |= {**CREDENTIALS, "AWS_SECRET_ACCESS_KEY": SECRET,
                "ENGINECTL_STORE_URL": f"s3://{bucket}/fleet",
                "ENGINECTL_S3_ENDPOINT_URL": server.endpoint_url}
    else:
        env["ENGINECTL_STORE_URL"] = (tmp_path / "store").as_uri()
    if registry == "postgresql":  # trust auth: any password is taken, and must never show
        url = request.getfixturevalue("postgres_url")
        env["ENGINECTL_REGISTRY_URL"] = url.replace("postgres@", f"postgres:{SECRET}@", 1)
    else:
        env["ENGINECTL_REGISTRY_URL"] = f"sqlite:///{tmp_path / 'registry.db'}"
    try:
        yield env
    finally:
        if server is not None and bucket is not None:
            server.delete_bucket(bucket)
