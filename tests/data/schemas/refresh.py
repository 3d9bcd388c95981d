"""Rewrite the vendored schemas of this folder from their sources (README.md here says which).

    python tests/data/schemas/refresh.py (options: --help; README.md here has the command)

What it keeps is what validation reads, nothing more:
- Kubernetes: the kinds in KINDS (their per-kind file: apiVersion/kind enums) and every
  definition they reach through `$ref`, from `_definitions.json`; refs made local.
- KubeRay: each CRD's `openAPIV3Schema` of the version served, made strict the way
  `kubectl apply` (server-side field validation Strict) treats an unknown field: every
  object schema with `properties` and neither `additionalProperties` nor
  `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`, and OpenAPI's
  `nullable: true` becomes a `null` in `type`.
- Both: `description` strings dropped (documentation, never a constraint), and every
  schema subtree of 2 KB or more that occurs more than once (a CRD repeats the whole
  PodTemplateSpec per group) stored once under `$defs` and referenced by its content
  digest. Neither changes what a document validates against.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
KINDS = {  # (apiVersion, kind) -> the kubernetes-validate file of that kind
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("batch/v1", "CronJob"): "cronjob-batch-v1.json",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1.json",
}
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"  # a CR's metadata, too
CRDS = {("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
        ("ray.io/v1", "RayJob"): "ray.io_rayjobs.yaml"}
SHARED_MIN_BYTES = 2048

SUBSCHEMA_KEYS = ("items", "additionalProperties", "not")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")


def children(node: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Where *node* holds subschemas: (key, None) for one, (key, name or index) in maps/lists."""
    found: list[tuple[str, str | None]] = []
    for key in SUBSCHEMA_KEYS:
        if isinstance(node.get(key), dict):
            found.append((key, None))
    for key in SUBSCHEMA_LISTS + SUBSCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            found += [(key, name) for name in value]
        elif isinstance(value, list):
            found += [(key, str(i)) for i in range(len(value))]
    return found


def get(node: dict[str, Any], key: str, name: str | None) -> Any:
    value = node[key]
    if name is None:
        return value
    return value[int(name)] if isinstance(value, list) else value[name]


def rebuild(node: dict[str, Any], change: Any) -> dict[str, Any]:
    """*node* with *change* applied to each subschema, and its `description` dropped."""
    out = {k: v for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    for key in SUBSCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = change(out[key])
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [change(v) if isinstance(v, dict) else v for v in out[key]]
    for key in SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {n: change(v) if isinstance(v, dict) else v for n, v in out[key].items()}
    return out


def bare(node: dict[str, Any]) -> dict[str, Any]:
    return rebuild(node, bare)


def strict(node: dict[str, Any]) -> dict[str, Any]:
    out = rebuild(node, strict)
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]  # OpenAPI's nullable, as JSON Schema says it
    return out


def canonical(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def shared(defs: dict[str, Any]) -> dict[str, Any]:
    """*defs* with each large subtree that occurs twice or more stored once, under a name
    made of its content digest, and referenced wherever it was."""
    counts: Counter[str] = Counter()

    def count(node: dict[str, Any]) -> None:
        counts[canonical(node)] += 1
        for key, name in children(node):
            value = get(node, key, name)
            if isinstance(value, dict):
                count(value)

    for node in defs.values():
        count(node)
    out: dict[str, Any] = {}

    def intern(node: dict[str, Any]) -> dict[str, Any]:
        text = canonical(node)
        if counts[text] > 1 and len(text) >= SHARED_MIN_BYTES:
            name = "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:16]
            if name not in out:
                out[name] = {}  # claimed before its body, which may hold smaller shared parts
                out[name] = rebuild(node, intern)
            return {"$ref": f"#/$defs/{name}"}
        return rebuild(node, intern)

    for name, node in defs.items():
        out[name] = rebuild(node, intern)  # a named definition keeps its own name
    return dict(sorted(out.items()))


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def local(node: Any) -> Any:
    """kubernetes-validate's `/api/_definitions.json#/$defs/X` refs as `#/$defs/X`."""
    if isinstance(node, dict):
        return {k: (v.split("_definitions.json", 1)[-1] if k == "$ref" and isinstance(v, str)
                    else local(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [local(v) for v in node]
    return node


def kubernetes(folder: Path) -> dict[str, Any]:
    definitions = json.loads((folder / "_definitions.json").read_text(encoding="utf-8"))["$defs"]
    kinds = {f"{api}/{kind}": local(json.loads((folder / file).read_text(encoding="utf-8")))
             for (api, kind), file in KINDS.items()}
    for schema in kinds.values():
        for key in ("$schema", "$id", "x-kubernetes-group-version-kind"):
            schema.pop(key, None)
    wanted, todo = {OBJECT_META}, [*kinds.values(), definitions[OBJECT_META]]
    while todo:
        for ref in refs(todo.pop()):
            name = ref.removeprefix("#/$defs/")
            if name not in wanted:
                wanted.add(name)
                todo.append(definitions[name])
    defs = {name: bare(definitions[name]) for name in sorted(wanted)}
    return {"kinds": {name: bare(schema) for name, schema in kinds.items()}, "$defs": defs}


def kuberay(folder: Path) -> dict[str, Any]:
    kinds: dict[str, Any] = {}
    for (api, kind), file in CRDS.items():
        crd = yaml.safe_load((folder / file).read_text(encoding="utf-8"))
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
        assert f"{crd['spec']['group']}/{version['name']}" == api, (file, api)
        schema = strict(version["schema"]["openAPIV3Schema"])
        schema["properties"]["apiVersion"]["enum"] = [api]
        schema["properties"]["kind"]["enum"] = [kind]
        kinds[f"{api}/{kind}"] = schema
    return {"kinds": kinds}


def kind_def(name: str) -> str:
    """The `$defs` name of a kind's schema: `kind.apps-v1.Deployment` (no `/` to escape)."""
    api, _, kind = name.rpartition("/")
    return f"kind.{api.replace('/', '-')}.{kind}"


def write(path: Path, source: dict[str, str], schemas: dict[str, Any]) -> None:
    kinds = schemas["kinds"]
    defs = {**schemas.get("$defs", {}), **{kind_def(k): v for k, v in kinds.items()}}
    out = {"source": source,
           "kinds": {k: {"$ref": f"#/$defs/{kind_def(k)}"} for k in sorted(kinds)},
           "$defs": shared(defs)}
    path.write_text(json.dumps(out, sort_keys=True, separators=(",", ":")) + "\n",
                    encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kubernetes", type=Path, required=True,
                        help="kubernetes-validate's vX.Y.Z-local-strict folder")
    parser.add_argument("--kubernetes-from", required=True,
                        help="where that folder came from (package and version), for `source`")
    parser.add_argument("--kuberay", type=Path, required=True,
                        help="helm-chart/kuberay-operator/crds of a KubeRay checkout")
    parser.add_argument("--kuberay-tag", required=True, help="its tag, e.g. v1.6.0")
    parser.add_argument("--kuberay-commit", required=True, help="the tag's commit")
    args = parser.parse_args()
    version = args.kubernetes.name.split("-", 1)[0]
    write(HERE / f"kubernetes-{version}-strict.json",
          {"from": args.kubernetes_from, "folder": args.kubernetes.name},
          kubernetes(args.kubernetes))
    write(HERE / f"kuberay-{args.kuberay_tag}-strict.json",
          {"from": f"ray-project/kuberay {args.kuberay_tag} ({args.kuberay_commit})",
           "folder": "helm-chart/kuberay-operator/crds"},
          kuberay(args.kuberay))


if __name__ == "__main__":
    main()
