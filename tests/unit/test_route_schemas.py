"""`enginectl route`'s Kubernetes outputs validate, strictly, against the CRDs of the versions
they name (tests/data/schemas/README.md says where each came from): Envoy AI Gateway v1.1.0's
AIGatewayRoute and AIServiceBackend, Envoy Gateway v1.8.1's Backend and BackendTrafficPolicy,
the Gateway API inference extension v1.0.2's InferencePool v1, Gateway API v1.5.1's HTTPRoute.
The manifest they render from, and the choice of primary and fallback. Pure."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from pipeline.advise.decide import Advice, decide
from pipeline.advise.manifest import choose, route_manifest
from pipeline.advise.routers import envoy_ai_gateway, inference_pool, litellm
from pipeline.serving.capacity import Slo
from registry.errors import UsageError
from tests.unit.test_capacity_curves import curve, point, proof
from tests.unit.test_deploy_schemas import KUBERNETES, OBJECT_META, SCHEMAS

ROUTES = {name: SCHEMAS / name for name in (
    "envoy-ai-gateway-v1.1.0-strict.json", "envoy-gateway-v1.8.1-strict.json",
    "gateway-api-inference-extension-v1.0.2-strict.json", "gateway-api-v1.5.1-strict.json")}
T0 = datetime(2026, 12, 1, tzinfo=UTC)


@functools.cache
def _schemas(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def errors(document: dict[str, Any]) -> list[str]:
    """What the API server would refuse in *document* under Strict field validation."""
    kind = f"{document.get('apiVersion')}/{document.get('kind')}"
    for path in ROUTES.values():
        kinds = _schemas(path)["kinds"]
        if kind in kinds:
            schema = {"$defs": _schemas(path)["$defs"], "$ref": kinds[kind]["$ref"]}
            meta = {"$defs": _schemas(KUBERNETES)["$defs"], "$ref": f"#/$defs/{OBJECT_META}"}
            found = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                     for e in Draft202012Validator(schema).iter_errors(document)]
            return found + [f"metadata/{'/'.join(map(str, e.absolute_path))}: {e.message}"
                            for e in Draft202012Validator(meta).iter_errors(
                                document.get("metadata", {}))]
    pytest.fail(f"no schema for {kind}")


def advice(*, vllm_cheaper: bool = False) -> Advice:
    fast = curve(point(1, 0.05), point(8, 0.1), point(16, 0.6)).as_dict()
    slow = curve(point(1, 0.1), point(2, 0.2), point(4, 0.6)).as_dict()
    proofs = [
        proof("sha256:" + "e" * 64, "trtllm-engine", "H100-SXM5-80GB", T0, fast, tp=2,
              price=20.0 if vllm_cheaper else 2.0),
        proof("sha256:" + "c" * 64, "trtllm-checkpoint", "H100-SXM5-80GB", T0, fast, tp=2,
              price=21.0 if vllm_cheaper else 2.0),
        proof("sha256:" + "f" * 64, "vllm", "H100-SXM5-80GB", T0, slow),
    ]
    return decide("Llama-3.1_8B", proofs, {}, slo=Slo(0.3), rate=20, prices={})


def test_an_engine_leads_and_the_best_vllm_entry_backs_it_up() -> None:
    chosen = choose(advice())
    assert [o.kind for o in chosen] == ["trtllm-engine", "vllm"]  # not the checkpoint


def test_when_vllm_ranks_first_the_best_trtllm_option_backs_it_up() -> None:
    chosen = choose(advice(vllm_cheaper=True))
    assert [o.kind for o in chosen] == ["vllm", "trtllm-engine"]  # the cheaper TRT-LLM one


def test_the_neutral_manifest_names_each_variant_with_its_proof_and_limits() -> None:
    manifest = route_manifest(advice(), {"primary": "http://10.0.0.1:8000/v1"})
    data = json.loads(json.dumps(manifest.as_dict()))
    primary, fallback = data["variants"]
    assert primary["name"] == "llama-3-1-8b-trtllm-eeeeeeee"
    assert primary["endpoint"] == "http://10.0.0.1:8000/v1"
    assert fallback["endpoint"] == f"http://{fallback['name']}:8000/v1"
    assert (primary["role"], primary["priority"]) == ("primary", 0)
    capacity, replicas = primary["capacity_rps"], primary["replicas"]
    assert primary["rpm"] == int(capacity * replicas * 60)
    assert primary["max_parallel_requests"] >= 1
    assert primary["proof"]["at"] == T0.isoformat()
    with pytest.raises(UsageError, match="--endpoint 'secondary' names no variant"):
        route_manifest(advice(), {"secondary": "http://x/v1"})


@pytest.mark.parametrize("render", [envoy_ai_gateway, inference_pool])
def test_each_kubernetes_document_validates_against_its_crd(render: Any) -> None:
    documents = render(route_manifest(advice()), gateway="edge", namespace="serving")
    for document in yaml.safe_load_all(yaml.safe_dump_all(documents)):
        assert errors(document) == [], document["kind"]


def test_envoy_ai_gateway_keeps_the_rules_its_crds_state_in_cel() -> None:
    documents = envoy_ai_gateway(route_manifest(advice()), gateway="edge", namespace="serving")
    kinds = [d["kind"] for d in documents]
    assert kinds == ["Backend", "AIServiceBackend", "Backend", "AIServiceBackend",
                     "AIGatewayRoute", "BackendTrafficPolicy"]
    for backend in (d for d in documents if d["kind"] == "AIServiceBackend"):
        ref = backend["spec"]["backendRef"]  # "BackendRef must be a Backend resource"
        assert (ref["kind"], ref["group"]) == ("Backend", "gateway.envoyproxy.io")
    route = documents[4]
    assert all(p["kind"] == "Gateway" for p in route["spec"]["parentRefs"])
    assert [b["priority"] for b in route["spec"]["rules"][0]["backendRefs"]] == [0, 1]
    policy = documents[5]  # on the HTTPRoute the AIGatewayRoute makes: the same name
    assert policy["spec"]["targetRefs"][0]["name"] == route["metadata"]["name"]


def test_a_document_with_an_unknown_field_is_refused() -> None:
    documents = inference_pool(route_manifest(advice()), gateway="edge", namespace="serving")
    pool = json.loads(json.dumps(documents[0]))
    pool["spec"]["priority"] = 1
    assert errors(pool)


def test_litellm_orders_the_deployments_and_names_the_fallback_group() -> None:
    config = litellm(route_manifest(advice()))
    first, second, standby = config["model_list"]
    assert first["model_name"] == second["model_name"] == "Llama-3.1_8B"
    assert (first["litellm_params"]["order"], second["litellm_params"]["order"]) == (1, 2)
    assert standby["model_name"] == "Llama-3.1_8B-fallback"
    assert config["router_settings"] == {"enable_pre_call_checks": True,
                                         "fallbacks": [{"Llama-3.1_8B":
                                                        ["Llama-3.1_8B-fallback"]}]}
    for deployment in config["model_list"]:
        assert deployment["litellm_params"]["rpm"] >= 1
        assert deployment["litellm_params"]["max_parallel_requests"] >= 1
