"""ray_cluster: joining a Ray cluster as a driver, and what it has right now.

    connect      ray.init with the workers' environment (store and registry URLs,
                 credentials, `worker_env`), after checking in seconds that something at the
                 address answers as Ray does (Ray itself retries for minutes)
    disconnect   leave it (Ray ends every task this driver still has)
    live_nodes, free_resources   the cluster's nodes and what is free on them

Imported after `pipeline.executors.fleet.require_ray` only, so the local paths never import Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

import ray
import ray._private.worker as ray_worker
import ray.exceptions

from pipeline.errors import FleetError
from registry.config import RegistryConfig

FORWARDED: Final = (
    "ENGINECTL_LEASE_TTL_S", "ENGINECTL_REGISTRY_RETRY_S",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
    "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_CA_BUNDLE", "HF_TOKEN", "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
)
"""What a worker gets from the driver's environment besides the store and registry: their
credentials. Node-local places (ENGINECTL_HOME, work dir, cache, TRT-LLM examples, Pythons)
are the node's own, and so is ENGINECTL_IMAGE_DIGEST: a pool's fingerprint carries the digest
of the image its nodes run, never the driver's. ENGINECTL_RAY_ENV names more
(comma-separated)."""


def worker_env(config: RegistryConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables every task gets through the job's runtime env. Values are
    secrets (credentials, a registry password): they are never logged or printed."""
    env = {"ENGINECTL_STORE_URL": config.store_url,
           "ENGINECTL_REGISTRY_URL": config.registry_url}
    if config.s3_endpoint_url:
        env["ENGINECTL_S3_ENDPOINT_URL"] = config.s3_endpoint_url
    extra = [n.strip() for n in environ.get("ENGINECTL_RAY_ENV", "").split(",") if n.strip()]
    for name in (*FORWARDED, *extra):
        if name in environ:
            env[name] = environ[name]
    return env


def connect(address: str, config: RegistryConfig) -> None:
    """Join the cluster at *address* (`auto`, `host:6379`, or `ray://head:10001`) as a driver
    whose tasks get the store and registry of *config*."""
    env = worker_env(config, os.environ)
    check_reachable(address)
    try:
        ray.init(address=address, runtime_env={"env_vars": env}, namespace="enginectl",
                 logging_level=logging.ERROR, log_to_driver=False, ignore_reinit_error=True,
                 configure_logging=True)
    except ray.exceptions.AuthenticationError as exc:
        raise FleetError(
            f"the Ray cluster at {address!r} refused this driver's token: set RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH) to the cluster's token (`ray get-auth-token` on the "
            "head) and RAY_AUTH_MODE=token", address=address) from exc
    except (ConnectionError, RuntimeError, ValueError, TimeoutError,
            ray.exceptions.RaySystemError) as exc:
        why = " ".join(str(exc).split())[:300]
        raise FleetError(f"cannot join the Ray cluster at {address!r}: {why}; check --address "
                         "(or RAY_ADDRESS) and `ray status` on the head", address=address) from exc
    # Ray prints what its raylets report (a worker that died, ...) on this process's stdout
    # even with log_to_driver=False, which would corrupt `--json`; enginectl reports every
    # run itself. Ray's own debugger (ray.util.rpdb) silences the same switch.
    setattr(ray_worker, "_worker_logs_enabled", False)  # noqa: B010


# Ray's GCS (HOST:6379) and its client server (ray://HOST:10001) speak gRPC, which is HTTP/2
# over cleartext unless the cluster is set up for TLS: sent HTTP/2's connection preface and
# an empty SETTINGS frame, such a server answers with a SETTINGS frame of its own at once.
_HTTP2_PREFACE: Final = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                         b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
_HTTP2_SETTINGS: Final = 0x04
CONNECT_TIMEOUT_S: Final = 5.0
ANSWER_TIMEOUT_S: Final = 10.0


def check_reachable(address: str) -> None:
    """Fail in seconds when nothing at *address* answers as Ray does: Ray itself retries for
    minutes (a silent port, or one that speaks HTTP/1), then its C++ core ends the process
    with a page of log. Under RAY_USE_TLS only the connection is checked."""
    if "://" not in address and address.count(":") != 1:
        return  # auto, local: Ray's own lookup, which fails at once when nothing runs
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    hint = "check --address (or RAY_ADDRESS) and `ray status` on the head"
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise FleetError(f"cannot join the Ray cluster at {address!r}: nothing answers at "
                         f"{host}:{port} ({why}); {hint}", address=address) from exc
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        why = _not_grpc(sock)
    if why is not None:
        raise FleetError(f"cannot join the Ray cluster at {address!r}: {host}:{port} is not "
                         f"Ray ({why}); {hint}", address=address)


def _not_grpc(sock: socket.socket) -> str | None:
    """Why the server on *sock* is not a gRPC (HTTP/2) one, or None: it must answer the
    HTTP/2 preface with a SETTINGS frame within ANSWER_TIMEOUT_S."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    answer = b""
    try:
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.sendall(_HTTP2_PREFACE)
        while len(answer) < 9:  # a frame header: length (3), type (1), flags, stream id
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    except TimeoutError:
        return f"no answer in {ANSWER_TIMEOUT_S:g} s" if not answer else \
            f"it answered {answer!r}, then nothing"
    except OSError as exc:
        return f"it ended the connection: {exc.strerror or exc}"
    if len(answer) == 9 and answer[3] == _HTTP2_SETTINGS:
        return None
    if not answer:
        return "it closed the connection without a word"
    return f"it does not speak gRPC: it answered {answer!r}"


def disconnect() -> None:
    """Leave the cluster: Ray ends every task this driver still has (they die with it)."""
    with contextlib.suppress(Exception):  # never mask what made the build stop
        ray.shutdown()


def live_nodes() -> list[dict[str, Any]]:
    return list(ray.nodes())  # type: ignore[no-untyped-call]


def free_resources() -> dict[str, float]:
    found = ray.available_resources()  # type: ignore[no-untyped-call]
    return {str(k): float(v) for k, v in found.items()}
