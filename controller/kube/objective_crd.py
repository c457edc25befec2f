"""The ``ServiceObjective`` custom resource: one inference service's objective and scaling, owned
by its team in its own namespace.

Design:

* The spec is the policy file's service (:class:`policies.model.ServiceSpec`) without
  ``namespace`` (the object's own), named by the object: its OpenAPI schema is generated from
  the model (:func:`objective_crd`), so the two cannot drift; a test keeps the chart's
  ``helm/ebbtide/crds/serviceobjectives.yaml`` equal to it.
* What the schema cannot say is said by CEL rules (``x-kubernetes-validations``, evaluated by the
  API server at admission, Kubernetes 1.25+; ``messageExpression`` 1.27+) whose messages are the
  policy loader's own (:data:`RULES`), so a team sees at ``kubectl apply`` what ``ebbtide policy
  validate`` would say. Checks that need the cluster-wide policy (does the pool exist?) are made
  by the controller and reported in the object's ``Ready`` condition.
* Durations here are Go durations (``ms``, ``s``, ``m``, ``h``; no ``d``), the units CEL's
  ``duration()`` reads, so the rules comparing ``window`` and ``resolution`` can be written.
* The status (conditions ``Ready``, ``Breaching``, ``AbleToScale``, ``ScalingLimited``, as the
  HPA's autoscaling/v2 ``HorizontalPodAutoscalerCondition``; the objective, current percentile,
  state and replicas for ``kubectl get``'s printer columns) is a subresource, written by the
  controller.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from policies.model import Policy, ServiceSpec, SloSpec, format_duration, format_loc

__all__ = [
    "GROUP",
    "KIND",
    "PAUSED_ANNOTATION",
    "PLURAL",
    "RULES",
    "VERSION",
    "Admission",
    "objective_crd",
    "with_objectives",
]

GROUP: Final = "ebbtide.io"
VERSION: Final = "v1alpha1"
KIND: Final = "ServiceObjective"
PLURAL: Final = "serviceobjectives"
#: On a ServiceObjective or its workload: ``"true"`` stops every action for the service (as
#: KEDA's ``autoscaling.keda.sh/paused``); shown in its status.
PAUSED_ANNOTATION: Final = "ebbtide.io/paused"

_GO_DURATION: Final = r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$"
_AT_MOST_100: Final = r"^(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)\s*%$"
_ZERO_OR_100: Final = r"^(0+(\.0+)?|100(\.0+)?)\s*%$"
_PERCENT_RULE: Final = {
    "rule": f"self.matches('{_AT_MOST_100}')",
    "messageExpression": "'a percentage here is at most 100%; got ' + self",
}
_STEP_RULE: Final = {
    "rule": f"type(self) == int ? self >= 1 : self.matches('{_AT_MOST_100}') && "
    f"!self.matches('^0+(\\\\.0+)?\\\\s*%$')",
    "messageExpression": "type(self) == int ? 'a step is at least 1 replica; got ' + "
    'string(self) : "a percentage step is above 0% and at most 100%; got \'" + self + "\'"',
}

_WINDOW: Final = format_duration(SloSpec.model_fields["window"].default)
_RESOLUTION: Final = format_duration(SloSpec.model_fields["resolution"].default)

#: CEL rules by the spec path they sit on, with the policy loader's messages
#: (policies/model.py's validators).
RULES: Final[dict[str, list[dict[str, str]]]] = {
    "": [
        {
            "rule": "!has(self.scale) || has(self.replicas)",
            "message": "replicas (min/max) is required when scale is set",
        }
    ],
    "replicas": [
        {
            "rule": "!has(self.min) || self.min <= self.max",
            "messageExpression": "'min (' + string(self.min) + ') is greater than max (' + "
            "string(self.max) + ')'",
        }
    ],
    "slo": [
        {
            "rule": f"duration(has(self.resolution) ? self.resolution : '{_RESOLUTION}') <= "
            f"duration(has(self.window) ? self.window : '{_WINDOW}')",
            "message": "resolution must not be longer than window",
        },
        {
            "rule": f"duration(has(self.window) ? self.window : '{_WINDOW}').getMilliseconds() "
            f"<= 720 * duration(has(self.resolution) ? self.resolution : '{_RESOLUTION}')"
            ".getMilliseconds()",
            "message": "window / resolution gives more than 720 slots; raise the resolution",
        },
    ],
    "scale": [
        {
            "rule": "!has(self.shrinkFirst) || !self.shrinkFirst || "
            "(has(self.readyEndsCooldown) && self.readyEndsCooldown)",
            "message": "shrinkFirst needs readyEndsCooldown: the step into the freed GPUs would "
            "wait a whole cooldown",
        }
    ],
    "scale.down": [
        {
            "rule": f"!has(self.below) || !self.below.matches('{_ZERO_OR_100}')",
            "message": "below must be above 0% and below 100%",
        }
    ],
}

_CONDITION: Final = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string", "description": "Ready, Breaching, AbleToScale, ScalingLimited."},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "description": "One CamelCase word."},
        "message": {"type": "string", "description": "Why, for people."},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer"},
    },
}
_STATUS: Final = {
    "type": "object",
    "description": "Written by the controller (rate-limited: at most once per interval).",
    "properties": {
        "conditions": {
            "type": "array",
            "items": _CONDITION,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        "objective": {"type": "string", "description": "e.g. P99 <= 300ms."},
        "current": {"type": "string", "description": "The percentile now, e.g. 412ms."},
        "state": {"type": "string", "description": "ok, breaching, recovering, stale."},
        "replicas": {"type": "integer"},
        "desiredReplicas": {"type": "integer"},
        "paused": {"type": "boolean"},
        "lastDecision": {"type": "string", "description": "Action, change, outcome, reason."},
        "observedGeneration": {"type": "integer"},
    },
}
_COLUMNS: Final = [
    {"name": "Objective", "type": "string", "jsonPath": ".status.objective"},
    {"name": "Current", "type": "string", "jsonPath": ".status.current"},
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Paused", "type": "boolean", "jsonPath": ".status.paused", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _openapi(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON Schema (2020-12, pydantic's) node as a structural OpenAPI v3.0 schema."""
    if "$ref" in node:
        return _openapi(defs[node["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            return _openapi({**options[0], "description": node.get("description", "")}, defs)
        # a Step: a number of replicas or a percentage of them
        return {
            "x-kubernetes-int-or-string": True,
            "description": node.get("description", ""),
            "x-kubernetes-validations": [dict(_STEP_RULE)],
        }
    out: dict[str, Any] = {}
    for key in ("type", "description", "minimum", "maximum", "minLength", "maxLength", "enum"):
        if key in node:
            out[key] = node[key]
    if "const" in node:
        out["enum"] = [node["const"]]
    for key, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if key in node:
            out[flag] = node[key]
            out[key] = True
    if "pattern" in node:
        pattern = node["pattern"]
        if pattern.endswith("(?:ms|s|m|h|d))+$"):
            out["pattern"] = _GO_DURATION
            out["description"] = (
                out.get("description", "") + " A Go duration: 500ms, 30s, 10m, 1h30m."
            ).strip()
        else:
            out["pattern"] = pattern
        if pattern == r"^\d+(\.\d+)?\s*%$":
            out["x-kubernetes-validations"] = [dict(_PERCENT_RULE)]
    if node.get("type") == "object" and "properties" in node:
        out["properties"] = {k: _openapi(v, defs) for k, v in node["properties"].items()}
        if node.get("required"):
            out["required"] = list(node["required"])
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _openapi(node["additionalProperties"], defs)
    if node.get("type") == "array" and "items" in node:
        out["items"] = _openapi(node["items"], defs)
    return out


def _spec_schema() -> dict[str, Any]:
    schema = ServiceSpec.model_json_schema(by_alias=True, mode="validation")
    defs = schema.get("$defs", {})
    spec = _openapi(schema, defs)
    del spec["properties"]["namespace"]  # the object's own namespace
    spec["description"] = (
        "One inference service (named by this object, in its namespace): its objective and "
        "how Ebbtide scales it. The fields of a policy file's spec.services entry, less "
        "namespace (docs/policies.md)."
    )
    for path, rules in RULES.items():
        node = spec
        for part in filter(None, path.split(".")):
            node = node["properties"][part]
        node.setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
    return spec


def objective_crd() -> dict[str, Any]:
    """The CustomResourceDefinition, as the chart ships it under ``crds/``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["svcobj"],
                "categories": ["ebbtide"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": copy.deepcopy(_COLUMNS),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An inference service's objective and scaling, "
                            "owned by its team (Ebbtide).",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": _spec_schema(),
                                "status": copy.deepcopy(_STATUS),
                            },
                        }
                    },
                }
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether one ServiceObjective joined the policy: ``reason`` is its ``Ready`` condition's
    (``Accepted``, ``NamespaceNotAllowed``, ``NameTaken``, ``InvalidSpec``), ``message`` the
    policy loader's words."""

    key: str
    """``namespace/name``."""
    accepted: bool
    reason: str
    message: str


def with_objectives(
    policy: Policy, objects: Sequence[Mapping[str, Any]], namespaces: Collection[str] | None
) -> tuple[Policy, list[Admission]]:
    """``policy`` with each admissible ServiceObjective in ``objects`` as one more service (in
    ``namespace/name`` order), and a verdict for every object. ``namespaces``: where objectives
    may be defined (``None``: anywhere). A service's name is its key in ``spec.services``, so
    an object whose name the policy file or an earlier object already uses is refused
    (NameTaken), as is one whose pool the policy does not define (InvalidSpec)."""
    services = dict(policy.spec.services)
    verdicts: list[Admission] = []

    def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or "default"), str(meta.get("name") or "")

    for obj in sorted(objects, key=key_of):
        namespace, name = key_of(obj)
        key = f"{namespace}/{name}"

        def refuse(reason: str, message: str, key: str = key) -> None:
            verdicts.append(Admission(key, False, reason, message))

        if namespaces is not None and namespace not in namespaces:
            allowed = ", ".join(sorted(namespaces)) or "none"
            refuse("NamespaceNotAllowed", f"namespace {namespace} may not define objectives "
                   f"(the chart's serviceObjectives.namespaces: {allowed})")  # fmt: skip
            continue
        if name in services:
            owner = services[name].namespace
            where = "the policy file" if name in policy.spec.services else "another objective"
            refuse("NameTaken", f"service {name!r} is already defined by {where} (namespace "
                   f"{owner}), which wins; service names are unique across namespaces")  # fmt: skip
            continue
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            refuse("InvalidSpec", "spec: required key is missing")
            continue
        try:
            svc = ServiceSpec.model_validate({**spec, "namespace": namespace})
        except ValidationError as exc:
            refuse("InvalidSpec", "; ".join(_messages(exc)))
            continue
        if svc.pool not in policy.spec.pools:
            known = ", ".join(sorted(policy.spec.pools)) or "none"
            refuse("InvalidSpec", f"spec.pool: undefined pool {svc.pool!r} (pools: {known})")
            continue
        services[name] = svc
        verdicts.append(Admission(key, True, "Accepted", f"service {key} is in the policy"))
    spec = policy.spec.model_copy(update={"services": services})
    return policy.model_copy(update={"spec": spec}), verdicts


def _messages(exc: ValidationError) -> list[str]:
    """pydantic's errors as the policy loader words them (``spec.slo.window: …``)."""
    out = []
    for err in exc.errors(include_url=False):
        loc = ("spec", *(p for p in err["loc"] if p != "[key]"))
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        elif err["type"] == "missing":
            message = "required key is missing"
        out.append(f"{format_loc(loc)}: {message}")
    return out
