"""Router configurations rendered from the neutral manifest (`pipeline.advise.manifest`).
Pure: each returns plain data for YAML.

- `litellm`: a LiteLLM proxy config. Every variant is a deployment of the model's group with
  `order` (1 first: LiteLLM sends to the lowest order that is healthy and under its limits,
  which `enable_pre_call_checks` makes it check), `rpm` and `max_parallel_requests`; the
  fallback variant is also its own group, named in `fallbacks`, for errors the order does not
  cover. The proxy's master key is read from `LITELLM_MASTER_KEY`.
- `envoy_ai_gateway`: Envoy AI Gateway v1.1 (`aigateway.envoyproxy.io/v1beta1`): per variant a
  `Backend` (Envoy Gateway `gateway.envoyproxy.io/v1alpha1`) and an `AIServiceBackend`; one
  `AIGatewayRoute` whose rule for the model lists them with `priority` (0 first); and the
  `BackendTrafficPolicy` on the route's HTTPRoute (same name) that retries on the next
  priority when a backend fails to connect or answers 5xx (Envoy AI Gateway's provider
  fallback).
- `inference_pool`: the Gateway API inference extension: one `InferencePool`
  (`inference.networking.k8s.io/v1`) per variant (pods labelled
  `enginectl.io/variant: NAME`, its endpoint picker the Service `NAME-epp`) and one `HTTPRoute`
  (`gateway.networking.k8s.io/v1`). Gateway API has no priority between backendRefs: the
  route gives the primary all the traffic (weight 1) and keeps the fallback at weight 0,
  listed so that moving traffic is one edit of the weights.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from pipeline.advise.manifest import PORT, RouteManifest, Variant, dns_label

FORMATS: Final = ("litellm", "envoy-ai-gateway", "inference-pool")
LABEL: Final = "enginectl.io/variant"
EPP_PORT: Final = 9002  # the endpoint picker's gRPC port in the extension's examples


def _annotations(variant: Variant) -> dict[str, str]:
    option = variant.option
    return {"enginectl.io/digest": option.digest,
            "enginectl.io/capacity-rps": f"{option.capacity.rate or 0:.3f}",
            "enginectl.io/replicas": str(option.replicas or 1),
            "enginectl.io/proof-at": option.proof_at}


def litellm(manifest: RouteManifest) -> dict[str, Any]:
    """The LiteLLM proxy config (module doc)."""
    model = manifest.model
    deployments: list[dict[str, Any]] = []
    fallback_group = f"{model}-fallback"

    def deployment(variant: Variant, group: str, ident: str) -> dict[str, Any]:
        return {"model_name": group,
                "litellm_params": {"model": f"openai/{model}", "api_base": variant.endpoint,
                                   "api_key": "none", "order": variant.priority + 1,
                                   "rpm": variant.rpm,
                                   "max_parallel_requests": variant.max_parallel_requests},
                "model_info": {"id": ident}}

    for variant in manifest.variants:
        deployments.append(deployment(variant, model, variant.name))
    settings: dict[str, Any] = {"enable_pre_call_checks": True}
    fallbacks = [v for v in manifest.variants if v.role == "fallback"]
    if fallbacks:
        deployments += [deployment(v, fallback_group, f"{v.name}-fallback") for v in fallbacks]
        settings["fallbacks"] = [{model: [fallback_group]}]
    # the proxy refuses to start without a master key: it is read from the environment
    return {"model_list": deployments, "router_settings": settings,
            "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"}}


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80)


def envoy_ai_gateway(manifest: RouteManifest, *, gateway: str, namespace: str
                     ) -> list[dict[str, Any]]:
    """Envoy AI Gateway's resources (module doc), in *namespace*, attached to *gateway*."""
    route = dns_label(f"{manifest.model}-route")
    documents: list[dict[str, Any]] = []
    for variant in manifest.variants:
        host, port = _host_port(variant.endpoint)
        documents.append({
            "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "Backend",
            "metadata": {"name": variant.name, "namespace": namespace},
            "spec": {"endpoints": [{"fqdn": {"hostname": host, "port": port}}]}})
        documents.append({
            "apiVersion": "aigateway.envoyproxy.io/v1beta1", "kind": "AIServiceBackend",
            "metadata": {"name": variant.name, "namespace": namespace,
                         "annotations": _annotations(variant)},
            "spec": {"schema": {"name": "OpenAI"},
                     "backendRef": {"name": variant.name, "kind": "Backend",
                                    "group": "gateway.envoyproxy.io"}}})
    documents.append({
        "apiVersion": "aigateway.envoyproxy.io/v1beta1", "kind": "AIGatewayRoute",
        "metadata": {"name": route, "namespace": namespace},
        "spec": {
            "parentRefs": [{"name": gateway, "kind": "Gateway",
                            "group": "gateway.networking.k8s.io"}],
            "rules": [{
                "matches": [{"headers": [{"type": "Exact", "name": "x-ai-eg-model",
                                          "value": manifest.model}]}],
                "backendRefs": [{"name": v.name, "priority": v.priority}
                                for v in manifest.variants]}]}})
    documents.append({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
        "metadata": {"name": f"{route}-fallback", "namespace": namespace},
        "spec": {
            # the HTTPRoute Envoy AI Gateway makes of an AIGatewayRoute has its name
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                            "name": route}],
            "retry": {"numAttemptsPerPriority": 1, "numRetries": len(manifest.variants),
                      "perRetry": {"backOff": {"baseInterval": "100ms",
                                               "maxInterval": "10s"}},
                      "retryOn": {"httpStatusCodes": [500, 502, 503, 504],
                                  "triggers": ["connect-failure",
                                               "retriable-status-codes"]}}}})
    return documents


def inference_pool(manifest: RouteManifest, *, gateway: str, namespace: str
                   ) -> list[dict[str, Any]]:
    """The Gateway API inference extension's resources (module doc)."""
    documents: list[dict[str, Any]] = [{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": v.name, "namespace": namespace, "annotations": _annotations(v)},
        "spec": {"selector": {"matchLabels": {LABEL: v.name}},
                 "targetPorts": [{"number": PORT}],
                 "endpointPickerRef": {"name": f"{v.name}-epp",
                                       "port": {"number": EPP_PORT}}}}
        for v in manifest.variants]
    documents.append({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": dns_label(f"{manifest.model}-route"), "namespace": namespace},
        "spec": {
            "parentRefs": [{"name": gateway, "kind": "Gateway",
                            "group": "gateway.networking.k8s.io"}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": "inference.networking.k8s.io",
                                 "kind": "InferencePool", "name": v.name,
                                 "weight": 1 if v.priority == 0 else 0}
                                for v in manifest.variants]}]}})
    return documents


def render(manifest: RouteManifest, fmt: str, *, gateway: str, namespace: str
           ) -> dict[str, Any] | list[dict[str, Any]]:
    """*manifest* in router format *fmt* (one of `FORMATS`)."""
    if fmt == "litellm":
        return litellm(manifest)
    if fmt == "envoy-ai-gateway":
        return envoy_ai_gateway(manifest, gateway=gateway, namespace=namespace)
    return inference_pool(manifest, gateway=gateway, namespace=namespace)
