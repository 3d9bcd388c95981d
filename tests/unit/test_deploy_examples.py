"""deploy/ holds the cluster examples a team starts from; their resource names must be the
ones enginectl's planner asks Ray for, or every task would wait for a resource no node has;
the pull and serve they run must resolve to something the shipped recipes build; and what a
platform team applies must hold together: /dev/shm for a multi-GPU server, the fetch cache
on a volume the node's pods share, secrets from Secrets, Ray token auth on every driver, and
no `--notify` without a URL. (tests/unit/test_deploy_schemas.py: the Kubernetes and KubeRay
schemas.)"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from pipeline.cli import main
from pipeline.deploy.node import node_request
from pipeline.executors.pools import CPU_POOL, placement, resource
from pipeline.planning.plan import plan_recipe
from pipeline.recipe.reader import load_recipe
from pipeline.settings import Settings
from registry.gpus import GpuSpec, lookup_gpu
from registry.ops.resolve import Candidate, Ranked, rank

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _asked(recipe: Path) -> dict[str, int]:
    """The gpu:<SKU> resources the planner asks for, with the most units one run needs."""
    plan = plan_recipe(load_recipe(recipe), Settings.from_env({"ENGINECTL_HOME": "/nowhere"}))
    asked: dict[str, int] = {}
    for run in plan.stages.values():
        where = placement(plan, run)
        if where.pool != CPU_POOL:
            name = resource(where.pool)
            assert set(where.resources) == {name}
            asked[name] = max(asked.get(name, 0), where.num_gpus)
    return asked


def _raycluster_pools() -> dict[str, int]:
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    assert cluster["kind"] == "RayCluster"
    assert "resources" not in cluster["spec"]["headGroupSpec"]["rayStartParams"]  # CPU pool
    pools: dict[str, int] = {}
    for group in cluster["spec"]["workerGroupSpecs"]:
        params = group["rayStartParams"]
        # KubeRay passes the value to `ray start --resources` as a quoted JSON string
        advertised = json.loads(json.loads(params["resources"]))
        ((name, units),) = advertised.items()
        sku = name.removeprefix("gpu:")
        assert lookup_gpu(sku).sku == sku, f"{name} is not spelled as the catalog spells it"
        spec = group["template"]["spec"]
        product = spec["nodeSelector"]["nvidia.com/gpu.product"]
        assert lookup_gpu(product).sku == sku, (group["groupName"], product)
        (container,) = spec["containers"]
        assert int(params["num-gpus"]) == units
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == units
        assert container["image"].endswith("enginectl-builder:1.2.1")
        pools[name] = units
    return pools


def _bare_metal_pools() -> dict[str, int]:
    text = (DEPLOY / "bare-metal" / "ray-start.sh").read_text()
    pools: dict[str, int] = {}
    for gpus, resources in re.findall(r"--num-gpus (\d+) --resources '(\{[^']*\})'", text):
        ((name, units),) = json.loads(resources).items()
        assert lookup_gpu(name.removeprefix("gpu:")).sku == name.removeprefix("gpu:")
        assert int(gpus) == units
        pools[name] = units
    return pools


def test_the_raycluster_and_ray_start_lines_advertise_what_the_fleet_recipe_asks_for() -> None:
    asked = _asked(ROOT / "recipes" / "llama8b-fleet.yaml")
    assert set(asked) == {"gpu:A100-SXM4-80GB", "gpu:L40S", "gpu:H100-SXM5-80GB"}
    for pools in (_raycluster_pools(), _bare_metal_pools()):
        assert set(pools) == set(asked)
        for name, units in asked.items():
            assert units <= pools[name], f"a run asks {units} {name}, a node has {pools[name]}"


def test_the_rayjob_builds_a_shipped_recipe_on_that_cluster() -> None:
    job = yaml.safe_load((DEPLOY / "kuberay" / "rayjob-build.yaml").read_text())
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    assert job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    argv = job["spec"]["entrypoint"].split()
    assert argv[:2] == ["enginectl", "build"]
    assert argv[argv.index("--executor") + 1] == "ray"
    recipe = Path(argv[2])
    assert recipe.parts[:3] == ("/", "opt", "enginectl")  # the builder image's WORKDIR
    assert (ROOT / Path(*recipe.parts[3:])).is_file()


# --- what a platform team applies: the pull resolves, shm, cache, secrets, token auth ---------

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PULL = DEPLOY / "k8s-pull-deployment.yaml"
SERVE = DEPLOY / "k8s-serve-deployment.yaml"
CRONJOB = DEPLOY / "scheduling" / "nightly-cronjob.yaml"
SERVICE = DEPLOY / "scheduling" / "enginectl-nightly.service"


def _params(argv: list[str]) -> dict[str, Any]:
    """*argv* (`enginectl …`) parsed by enginectl's own CLI parser, running nothing."""
    assert argv[0] == "enginectl", argv
    root = click.Context(main, info_name="enginectl")
    name, command, rest = main.resolve_command(root, argv[1:])
    assert command is not None, argv
    return dict(command.make_context(name or "", rest, parent=root).params)


def _recipe_of(model: str) -> Path:
    """The shipped recipe that builds *model*."""
    found = [path for path in sorted((ROOT / "recipes").glob("*.yaml"))
             if yaml.safe_load(path.read_text())["model"]["name"] == model]
    assert len(found) == 1, f"no one recipe in recipes/ builds {model}: {found}"
    return found[0]


def _built(recipe: Path, node: GpuSpec) -> list[Candidate]:
    """What the registry would list once *recipe* is built and smoked: one `ready` artifact
    per planned entry, labelled as the plan says, proven on the GPU its target names."""
    plan = plan_recipe(load_recipe(recipe), Settings.from_env({"ENGINECTL_HOME": "/nowhere"}))
    artifacts: dict[str, Candidate] = {}
    for planned in plan.targets:
        target, (*_, entry_key, smoke_key) = planned.target, planned.chain
        entry = plan.stages[entry_key]
        assert plan.stages[smoke_key].stage == "smoke"
        assert entry.stage == "build"
        artifacts[entry.key] = Candidate(
            digest=entry.key, kind=entry.kind, model=plan.loaded.recipe.model.name,
            status="ready", created_at=EPOCH,
            gpu=target.gpu.sku if entry.kind == "trtllm-engine" else None,
            quant=target.quant, kv_cache_dtype=target.kv_cache_dtype, tp=target.tp,
            max_batch_size=target.shape.max_batch_size, max_seq_len=target.shape.max_seq_len,
            proven=target.gpu.sku == node.sku)
    return list(artifacts.values())


def _resolved(argv: list[str], pod: dict[str, Any], container: dict[str, Any],
              **override: Any) -> list[tuple[GpuSpec, Ranked]]:
    """What `enginectl pull|serve` with *argv* would rank in *container* of *pod*, on each
    GPU it can land on, against the artifacts its model's recipe builds: `--gpu auto` is the
    GPU the pod's nodeSelector pins (else each GPU of the recipe) and the count the
    container is given. The ranking is resolve's own (`registry.ops.resolve.rank`)."""
    params = {**_params(argv), **override}
    assert params["ref"] is None, "a REF names one digest: nothing to resolve"
    recipe = _recipe_of(params["model"])
    if params["gpu"] != "auto":
        nodes = [lookup_gpu(params["gpu"])]
    elif "nodeSelector" in pod:
        nodes = [lookup_gpu(pod["nodeSelector"]["nvidia.com/gpu.product"])]
    else:
        matrix = yaml.safe_load(recipe.read_text())["matrix"]["gpu"]
        nodes = [lookup_gpu(name) for name in matrix]
    count = params["gpu_count"] or int(container["resources"]["limits"]["nvidia.com/gpu"])
    ranked = []
    for node in nodes:
        request = node_request(params["model"], node, gpu_count=count,
                               min_seq_len=params["min_seq_len"],
                               min_batch=params["min_batch"], prefer=params["prefer"])
        ranked.append((node, rank(_built(recipe, node), request)))
    return ranked


def _pull_and_serve() -> list[tuple[str, list[str], dict[str, Any], dict[str, Any]]]:
    pull_pod = yaml.safe_load(PULL.read_text())["spec"]["template"]["spec"]
    serve_pod = yaml.safe_load(SERVE.read_text())["spec"]["template"]["spec"]
    (init,), (server,) = pull_pod["initContainers"], pull_pod["containers"]
    (serving,) = serve_pod["containers"]
    return [("pull", init["command"], pull_pod, server),  # --gpu auto sees the server's GPUs
            ("serve", serving["command"], serve_pod, serving)]


@pytest.mark.parametrize("which", ["pull", "serve"])
def test_the_deployments_resolve_to_something_the_shipped_recipes_build(which: str) -> None:
    (_, argv, pod, container), = [x for x in _pull_and_serve() if x[0] == which]
    assert argv[1] == which
    for node, ranked in _resolved(argv, pod, container):
        assert ranked.candidates, (node.sku, ranked.reasons())
        best = ranked.candidates[0]
        assert best.proven, best
        assert (best.kind, best.gpu) == ("trtllm-engine", node.sku), best
        assert (best.max_seq_len or 0) >= _params(argv)["min_seq_len"]


def test_the_tp8_deployment_resolves_to_a_tp8_engine_it_has_the_gpus_for() -> None:
    (_, argv, pod, server), _ = _pull_and_serve()
    assert int(server["resources"]["limits"]["nvidia.com/gpu"]) == 8
    ((_, ranked),) = _resolved(argv, pod, server)
    assert max(c.tp for c in ranked.candidates) == 8


def test_a_seq_len_no_recipe_builds_would_resolve_nothing() -> None:
    """The check above is real: the serve Deployment's old --min-seq-len 8192 (the fleet
    recipe builds 4096) leaves nothing to pull, on any GPU."""
    _, (_, argv, pod, container) = _pull_and_serve()
    for node, ranked in _resolved(argv, pod, container, min_seq_len=8192):
        assert ranked.candidates == [], node.sku
        assert any("max_seq_len 4096 < 8192" in line for line in ranked.reasons())


def _pods() -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec in deploy/, named."""
    pods = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            name = f"{path.relative_to(DEPLOY)}:{doc['kind']}"
            spec = doc["spec"]
            if doc["kind"] == "Deployment":
                pods.append((name, spec["template"]["spec"]))
            elif doc["kind"] == "CronJob":
                pods.append((name, spec["jobTemplate"]["spec"]["template"]["spec"]))
            elif doc["kind"] == "RayCluster":
                pods.append((f"{name}:head", spec["headGroupSpec"]["template"]["spec"]))
                pods += [(f"{name}:{g['groupName']}", g["template"]["spec"])
                         for g in spec["workerGroupSpecs"]]
            elif doc["kind"] == "RayJob":
                pods.append((f"{name}:submitter", spec["submitterPodTemplate"]["spec"]))
    return pods


def _gibibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Mi|Gi|Ti)", quantity)
    assert match, f"{quantity!r}: write sizes in Mi, Gi or Ti"
    return int(match[1]) * {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}[match[2]]


def test_a_container_with_several_gpus_has_a_sized_memory_backed_dev_shm() -> None:
    """NCCL between the ranks of a tp > 1 server (and Ray's object store) live in /dev/shm,
    64 MiB in a container unless a volume says otherwise."""
    checked = []
    for name, pod in _pods():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            gpus = int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
            if gpus <= 1:
                continue
            shm = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert len(shm) == 1, f"{name} {container['name']}: {gpus} GPUs and no /dev/shm"
            empty = volumes[shm[0]["name"]]["emptyDir"]
            assert empty["medium"] == "Memory", name
            size = _gibibytes(empty["sizeLimit"])
            memory = container["resources"]["limits"].get("memory")
            assert memory is None or size < _gibibytes(memory), name
            checked.append(name)
    assert "k8s-pull-deployment.yaml:Deployment" in checked
    assert sum("RayCluster" in n for n in checked) == 3  # the h100, l40s and a100 workers


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _mount_of(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volumeMount *path* lies under (the longest that holds it)."""
    mounts = [m for m in container.get("volumeMounts", [])
              if Path(path).is_relative_to(m["mountPath"])]
    assert mounts, f"{container['name']}: {path} is on no volume"
    return max(mounts, key=lambda m: len(m["mountPath"]))


def test_the_fetch_cache_is_on_a_volume_the_pods_of_a_node_share() -> None:
    """Every container that fetches (pull, serve, the Ray pods that run stages) names its
    cache, on a hostPath volume (a restarted pod downloads nothing again); where enginectl
    links out of the cache (serve's directory, the stage work directories under the home),
    the cache is on the same volume as the home."""
    checked = []
    for name, pod in _pods():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            command = container.get("command", [])
            fetches = command[:2] in (["enginectl", "pull"], ["enginectl", "serve"]) or (
                "RayCluster" in name)
            if not fetches:
                continue
            env = _env(container)
            assert "ENGINECTL_CACHE_DIR" in env, f"{name} {container['name']}: default cache"
            cache = _mount_of(container, env["ENGINECTL_CACHE_DIR"]["value"])
            assert "hostPath" in volumes[cache["name"]], name
            if command[:2] != ["enginectl", "pull"]:
                home = _mount_of(container, env["ENGINECTL_HOME"]["value"])
                assert home["name"] == cache["name"], f"{name}: home and cache apart"
            checked.append(name)
    assert len(checked) == 6  # pull, serve, the head and three worker groups


SECRET_NAMES = re.compile(r".*(TOKEN|SECRET.*|ACCESS_KEY.*|REGISTRY_URL|WEBHOOK)")


def test_secrets_come_from_secrets_and_hf_token_reaches_every_driver() -> None:
    drivers = 0
    for name, pod in _pods():
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            for var, item in _env(container).items():
                if SECRET_NAMES.fullmatch(var):
                    assert "value" not in item, f"{name}: {var} is written in the manifest"
                    ref = item["valueFrom"]["secretKeyRef"]
                    assert ref.get("optional") is not True, f"{name}: {var} may be missing"
            # the drivers of builds (the head runs a RayJob's entrypoint; the nightly's Job)
            # pass HF_TOKEN on to the snapshots of gated hf:// sources
            if name.endswith("RayCluster:head") or "CronJob" in name:
                hf = _env(container)["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
                assert hf["key"], name
                assert hf["name"], name
                drivers += 1
    assert drivers == 2


def test_ray_token_auth_through_kuberay_and_every_driver_presents_the_token() -> None:
    cluster = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
    auth = cluster["spec"]["authOptions"]
    assert auth["mode"] == "token"
    assert "KubeRay >= v1.6.0" in (DEPLOY / "kuberay" / "raycluster.yaml").read_text()
    # KubeRay sets RAY_AUTH_MODE/RAY_AUTH_TOKEN on its pods unless a container already has
    # them (pod.go, SetContainerTokenAuthEnvVars): none may, or it would win over the Secret
    for name, pod in _pods():
        if "kuberay/" in name:
            for container in pod["containers"]:
                assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} & set(_env(container)), name
    # the nightly drives the cluster from outside, over ray://, with the same token
    pod = yaml.safe_load(CRONJOB.read_text())["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (nightly,) = pod["containers"]
    env = _env(nightly)
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": auth["secretName"], "key": "auth_token"}  # the key KubeRay reads
    address = _params(nightly["command"])["address"]
    assert address == f"ray://{cluster['metadata']['name']}-head-svc:10001"  # KubeRay's name


def test_the_bare_metal_script_starts_no_node_without_token_auth() -> None:
    script = DEPLOY / "bare-metal" / "ray-start.sh"
    env = {"PATH": "/usr/bin:/bin", "HEAD": "h"}
    refused = subprocess.run(["sh", str(script), "h100"], env=env, capture_output=True,
                             text=True, timeout=30, check=False)
    assert refused.returncode == 2
    assert "RAY_AUTH_MODE=token" in refused.stderr
    usage = subprocess.run(["sh", str(script), "nothing"], env={**env, "RAY_AUTH_MODE": "token"},
                           capture_output=True, text=True, timeout=30, check=False)
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage:")  # past the check, and nothing started


def _systemd_words(exec_start: str, environment: dict[str, str]) -> list[str]:
    """ExecStart as systemd expands it: `${NAME}` is one word (empty when unset), a word that
    is `$NAME` alone is NAME's value split at whitespace (no word when unset or empty)."""
    words: list[str] = []
    for word in shlex.split(exec_start):
        alone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if alone:
            words += environment.get(alone.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                                lambda m: environment.get(m.group(1), ""), word))
    return words


def test_no_example_can_run_notify_with_nothing() -> None:
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"--notify(=|\s+)(''|\"\")", text), path
    # the CronJob: every $(NAME) in its command is a required env entry of the container
    pod = yaml.safe_load(CRONJOB.read_text())["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (nightly,) = pod["containers"]
    env = _env(nightly)
    command = nightly["command"]
    assert command[command.index("--notify") + 1].strip()
    for word in command:
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
            ref = env[var]["valueFrom"]["secretKeyRef"]  # KeyError: $(NAME) left literal
            assert ref.get("optional") is not True, var
    # systemd: with and without a webhook in the environment file
    service = configparser.ConfigParser(interpolation=None, strict=False)
    service.read(SERVICE)
    exec_start = service["Service"]["ExecStart"]
    bare = _systemd_words(exec_start, {})
    assert "--notify" not in bare
    assert _params(["enginectl", *bare[1:]])["notify_url"] is None
    hooked = _systemd_words(exec_start, {
        "ENGINECTL_NIGHTLY_ARGS": "--notify https://hooks.example.com/nightly"})
    assert _params(["enginectl", *hooked[1:]])["notify_url"] == \
        "https://hooks.example.com/nightly"
