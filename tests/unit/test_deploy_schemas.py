"""Every manifest in deploy/ is one `kubectl apply` takes: each document validates against the
schema of its kind, Kubernetes v1.33.0's or KubeRay v1.6.0's CRD, strictly (an unknown field
fails, as kubectl's server-side field validation Strict refuses it; a custom resource's
metadata is checked as the ObjectMeta it is). The schemas are vendored in tests/data/schemas/,
whose README.md says where each came from and how to refresh them."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = ROOT / "tests" / "data" / "schemas"
KUBERNETES = SCHEMAS / "kubernetes-v1.33.0-strict.json"
KUBERAY = SCHEMAS / "kuberay-v1.6.0-strict.json"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))


@functools.cache
def _schemas(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _validator(path: Path, ref: str) -> Draft202012Validator:
    schema = {"$defs": _schemas(path)["$defs"], "$ref": ref}
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def errors(document: dict[str, Any]) -> list[str]:
    """What `kubectl apply` would refuse in *document*, one line per error (path: why)."""
    kind = f"{document.get('apiVersion')}/{document.get('kind')}"
    found: list[str] = []
    for path in (KUBERNETES, KUBERAY):
        if kind in _schemas(path)["kinds"]:
            checks = [(_validator(path, _schemas(path)["kinds"][kind]["$ref"]), document, "")]
            if path == KUBERAY:  # the CRD says only `type: object`; the API server says more
                meta = _validator(KUBERNETES, f"#/$defs/{OBJECT_META}")
                checks.append((meta, document.get("metadata", {}), "metadata/"))
            for validator, part, prefix in checks:
                found += [f"{prefix}{'/'.join(map(str, e.absolute_path))}: {e.message}"
                          for e in validator.iter_errors(part)]
            return found
    pytest.fail(f"no schema for {kind}: add it to tests/data/schemas/refresh.py and refresh")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def test_every_example_is_checked() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {"k8s-pull-deployment.yaml", "k8s-serve-deployment.yaml",
            "kuberay/raycluster.yaml", "kuberay/rayjob-build.yaml",
            "scheduling/nightly-cronjob.yaml", "scheduling/nightly-reports-pvc.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_each_manifest_validates_against_its_kind(path: Path) -> None:
    found = documents(path)
    assert found, f"{path} holds no document"
    for document in found:
        assert errors(document) == [], f"{path}: {document['kind']}"


def _pod(document: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = document["spec"]["template"]["spec"]
    return template


# (file, what is changed, the change): each must make the document invalid
BROKEN = [
    ("k8s-pull-deployment.yaml", "an unknown container field",
     lambda d: _pod(d)["containers"][0].update(envFrm=[])),
    ("k8s-pull-deployment.yaml", "an unknown emptyDir field",
     lambda d: _pod(d)["volumes"][-1]["emptyDir"].update(sizeLimt="1Gi")),
    ("k8s-pull-deployment.yaml", "a secretKeyRef without its key",
     lambda d: _pod(d)["initContainers"][0]["env"][1]["valueFrom"]["secretKeyRef"].pop("key")),
    ("k8s-serve-deployment.yaml", "an unknown metadata field",
     lambda d: d["metadata"].update(label={})),
    ("kuberay/raycluster.yaml", "an unknown authOptions field",
     lambda d: d["spec"]["authOptions"].update({"secretname": "enginectl-ray-token"})),
    ("kuberay/raycluster.yaml", "an auth mode KubeRay does not know",
     lambda d: d["spec"]["authOptions"].update(mode="tokens")),
    ("kuberay/raycluster.yaml", "a rayStartParams value that is not a string",
     lambda d: d["spec"]["workerGroupSpecs"][0]["rayStartParams"].update({"num-gpus": 8})),
    ("kuberay/raycluster.yaml", "an unknown field in a worker's pod template",
     lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"].update(nodeSelektor={})),
    ("kuberay/raycluster.yaml", "an unknown field in the metadata of the custom resource",
     lambda d: d["metadata"].update(nme="x")),
    ("kuberay/rayjob-build.yaml", "an unknown RayJob field",
     lambda d: d["spec"].update(entrypint="enginectl build")),
    ("scheduling/nightly-cronjob.yaml", "an unknown field in the job's pod",
     lambda d: d["spec"]["jobTemplate"]["spec"]["template"]["spec"].update(restartPolity="x")),
    ("scheduling/nightly-reports-pvc.yaml", "an unknown PVC field",
     lambda d: d["spec"].update(storageClass="fast")),
]


@pytest.mark.parametrize(("name", "what", "change"), BROKEN, ids=[b[1] for b in BROKEN])
def test_validation_refuses_what_kubectl_refuses(name: str, what: str, change: Any) -> None:
    """The check above is real: each small mistake in an example fails it."""
    (document,) = documents(DEPLOY / name)
    document = copy.deepcopy(document)
    change(document)
    assert errors(document), f"{name} with {what} still validates"


def test_the_schemas_say_where_they_came_from() -> None:
    readme = (SCHEMAS / "README.md").read_text(encoding="utf-8")
    for path in sorted(SCHEMAS.glob("*-strict.json")):
        assert path.name in readme, f"{path.name} is not described in {SCHEMAS}/README.md"
        assert _schemas(path)["source"]["from"] in readme, path.name
