"""Pure functions over Kubernetes JSON objects, used by the test API server.

Everything here works on plain ``dict`` objects as they travel over the wire and does no I/O, so
the store (``kubeapi_store``) and the HTTP layer (``kubeapi``) share one definition of:

- ``ApiError``: an error that becomes a ``v1.Status`` answer with the apiserver's reason strings.
- label selectors, both the query-string form (``a=b,c!=d,e in (x,y),f notin (z),g,!h``) and the
  structured ``LabelSelector`` form (``matchLabels`` + ``matchExpressions``) used by PDBs;
- field selectors (``=``, ``==``, ``!=`` over any dotted path; a missing field compares as ``""``,
  which is how ``spec.nodeName=`` finds unscheduled pods);
- patches: JSON merge patch (RFC 7386), strategic merge patch (treated as a merge patch: lists are
  replaced, not merged by key) and JSON patch (RFC 6902, all six operations);
- disruption-budget arithmetic as the disruption controller does it: healthy = Running and Ready
  and not being deleted; ``minAvailable``/``maxUnavailable`` as an int or a percentage rounded up;
- builders for tests: ``make_pod`` and ``make_node``.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
LabelMatcher = Callable[[Mapping[str, str]], bool]
ObjMatcher = Callable[[Obj], bool]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An API failure, answered as a ``v1.Status`` object with ``code`` = HTTP status."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: Obj | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> Obj:
        """The ``v1.Status`` body the apiserver would send."""
        return status_object(self.code, self.message, reason=self.reason, details=self.details)


def status_object(
    code: int, message: str, *, reason: str | None = None, details: Obj | None = None
) -> Obj:
    """A ``v1.Status``; ``status`` is Success for 2xx codes and Failure otherwise."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if 200 <= code < 300 else "Failure",
        "message": message,
        "reason": reason if reason is not None else _REASONS.get(code, ""),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


# --- paths -------------------------------------------------------------------------------------


def get_path(obj: Any, path: str) -> Any:
    """The value at a dotted path (``spec.nodeName``), or None when any step is missing."""
    node = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def set_path(obj: Obj, path: str, value: Any) -> None:
    """Set the value at a dotted path, creating intermediate objects."""
    parts = path.split(".")
    node = obj
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


# --- label selectors ---------------------------------------------------------------------------

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_EXISTS_RE = re.compile(rf"^(!?)\s*({_KEY})$")
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^)]*)\)$")
_EQ_RE = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_./]*)$")


def _split_requirements(selector: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _requirement(key: str, op: str, values: Iterable[str]) -> LabelMatcher:
    wanted = frozenset(values)
    if op == "In":
        return lambda labels: key in labels and labels[key] in wanted
    if op == "NotIn":
        return lambda labels: key not in labels or labels[key] not in wanted
    if op == "Exists":
        return lambda labels: key in labels
    if op == "DoesNotExist":
        return lambda labels: key not in labels
    raise ApiError(400, f"{op!r} is not a valid label selector operator")


def _all_of(matchers: list[LabelMatcher]) -> LabelMatcher:
    return lambda labels: all(match(labels) for match in matchers)


def parse_label_selector(selector: str | None) -> LabelMatcher:
    """Compile the query-string form; the empty selector matches everything."""
    matchers: list[LabelMatcher] = []
    for req in _split_requirements(selector or ""):
        if m := _SET_RE.match(req):
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            matchers.append(
                _requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", values)
            )
        elif m := _EQ_RE.match(req):
            op = "NotIn" if m.group(2) == "!=" else "In"
            matchers.append(_requirement(m.group(1), op, [m.group(3)]))
        elif m := _EXISTS_RE.match(req):
            op = "DoesNotExist" if m.group(1) else "Exists"
            matchers.append(_requirement(m.group(2), op, ()))
        else:
            raise ApiError(400, f"unable to parse requirement: {req!r}")
    return _all_of(matchers)


def label_selector_matcher(selector: Obj | None) -> LabelMatcher:
    """Compile a structured ``LabelSelector``; an empty or missing one matches everything."""
    selector = selector or {}
    matchers = [
        _requirement(key, "In", [value])
        for key, value in (selector.get("matchLabels") or {}).items()
    ]
    for expr in selector.get("matchExpressions") or []:
        matchers.append(_requirement(expr["key"], expr["operator"], expr.get("values") or ()))
    return _all_of(matchers)


def label_selector_string(selector: Obj | None) -> str:
    """The query-string form of a structured ``LabelSelector`` (as ``Scale.status.selector``)."""
    selector = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or ())
        parts.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    return ",".join(parts)


def labels_of(obj: Obj) -> Mapping[str, str]:
    """An object's labels, empty when it has none."""
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


# --- field selectors ---------------------------------------------------------------------------

_FIELD_RE = re.compile(r"^([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)$")


def _field_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str | None) -> ObjMatcher:
    """Compile a field selector over dotted paths; the empty selector matches everything."""
    tests: list[tuple[str, bool, str]] = []
    for req in _split_requirements(selector or ""):
        m = _FIELD_RE.match(req)
        if not m:
            raise ApiError(400, f"invalid field selector: {req!r}")
        tests.append((m.group(1), m.group(2) == "!=", m.group(3).strip()))
    return lambda obj: all(
        (_field_text(get_path(obj, path)) == value) != negate for path, negate, value in tests
    )


# --- patches -----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(node: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(node)
    if not token.isdigit() or int(token) > len(node) - (0 if allow_end else 1):
        raise ApiError(422, f"array index {token!r} out of range")
    return int(token)


def _resolve(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise ApiError(422, f"path /{'/'.join(tokens)} does not exist")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], allow_end=True), value)
    else:
        raise ApiError(422, f"cannot add to /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise ApiError(422, "cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    if isinstance(parent, dict) and tokens[-1] in parent:
        return parent.pop(tokens[-1])
    if isinstance(parent, list):
        return parent.pop(_index(parent, tokens[-1], allow_end=False))
    raise ApiError(422, f"path /{'/'.join(tokens)} does not exist")


def json_patch(target: Obj, operations: Any) -> Obj:
    """RFC 6902 over a copy of ``target``; a failed ``test`` or bad path is a 422."""
    if not isinstance(operations, list):
        raise ApiError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc: Any = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"malformed JSON patch operation: {op!r}")
        tokens, kind = _pointer(op["path"]), op["op"]
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            doc = _replace(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "move":
            doc = _add(doc, tokens, _remove(doc, _pointer(op["from"])))
        elif kind == "copy":
            doc = _add(doc, tokens, copy.deepcopy(_resolve(doc, _pointer(op["from"]))))
        elif kind == "test":
            if _resolve(doc, tokens) != op.get("value"):
                raise ApiError(422, f"test operation failed at {op['path']}")
        else:
            raise ApiError(400, f"unknown JSON patch operation {kind!r}")
    if not isinstance(doc, dict):
        raise ApiError(422, "a JSON patch must leave an object")
    return doc


def _replace(doc: Any, tokens: list[str], value: Any) -> Any:
    _resolve(doc, tokens)  # must exist
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    if isinstance(parent, list):
        parent[_index(parent, tokens[-1], allow_end=False)] = value
    else:
        parent[tokens[-1]] = value
    return doc


def apply_patch(target: Obj, body: Any, content_type: str) -> Obj:
    """Apply a patch body of the given content type to a copy of ``target``."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH:
        return json_patch(target, body)
    if kind in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(body, dict):
            raise ApiError(400, "a merge patch body must be a JSON object")
        result: Obj = merge_patch(target, body)
        return result
    raise ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media "
        f"types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}",
    )


# --- disruption budgets ------------------------------------------------------------------------


def pod_is_healthy(pod: Obj) -> bool:
    """Running, Ready=True and not being deleted: what the disruption controller counts."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_is_terminal(pod: Obj) -> bool:
    """Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


ControllerScale = Callable[[Obj], "tuple[str, int] | None"]
"""Given a pod: (its controller's uid, that controller's replica count), or None."""


def disruption_status(
    pdb: Obj, pods: Iterable[Obj], *, controller_scale: ControllerScale | None = None
) -> Obj:
    """The ``status`` a disruption controller would write, given all pods in the namespace.

    As the disruption controller does: with an integer ``minAvailable`` the expected count is
    the number of matching pods; otherwise it is the sum of the replica counts of the pods'
    controllers (``controller_scale``), so a pod just evicted still counts as expected. A pod
    whose controller is unknown counts as itself (a real controller would refuse to compute).
    With neither ``minAvailable`` nor ``maxUnavailable`` nothing is protected.
    """
    spec = pdb.get("spec") or {}
    match = label_selector_matcher(spec.get("selector"))
    matching = [p for p in pods if match(labels_of(p)) and not pod_is_terminal(p)]
    healthy = sum(pod_is_healthy(p) for p in matching)
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if isinstance(min_available, int):
        expected, desired = len(matching), min_available
    else:
        controllers: dict[str, int] = {}
        loose = 0
        for pod in matching:
            scale = controller_scale(pod) if controller_scale else None
            if scale is None:
                loose += 1
            else:
                controllers[scale[0]] = scale[1]
        expected = loose + sum(controllers.values())
        if min_available is not None:
            desired = _scaled(min_available, expected)
        elif max_unavailable is not None:
            desired = max(0, expected - _scaled(max_unavailable, expected))
        else:
            desired = 0
    return {
        "observedGeneration": (pdb.get("metadata") or {}).get("generation", 1),
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": max(0, healthy - desired),
    }


# --- builders for tests ------------------------------------------------------------------------


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    phase: str = "Running",
    ready: bool = True,
    node: str | None = None,
    gpus: int = 0,
    priority_class: str | None = None,
) -> Obj:
    """A v1 Pod; Running and Ready by default, so PodDisruptionBudgets count it healthy."""
    container: Obj = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: Obj = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": spec,
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def make_node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    gpus: int = 0,
    unschedulable: bool = False,
) -> Obj:
    """A v1 Node with ``gpus`` whole GPUs (``nvidia.com/gpu`` capacity and a count label)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
        all_labels["nvidia.com/gpu.count"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
