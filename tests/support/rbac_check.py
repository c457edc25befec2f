"""Check the requests a test made to the Kubernetes-API test server against the RBAC rules the
controller declares (:mod:`controller.rbac`), as a real apiserver's authorizer would."""

from __future__ import annotations

import re
from collections.abc import Iterable

from controller.rbac import CLUSTER_RULES, LEASE_RULES, allowed
from support.kubeapi import LoggedRequest

__all__ = ["rbac_violations"]

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/[^/]+)?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _verb(request: LoggedRequest, named: bool) -> str:
    if request.method == "GET":
        if "watch" in {k.lower() for k in request.query} and request.query.get("watch") not in (
            "false",
            "0",
        ):
            return "watch"
        return "get" if named else "list"
    return _VERBS[request.method]


def rbac_violations(requests: Iterable[LoggedRequest]) -> list[str]:
    """``METHOD path (group resource verb)`` for every request the rules do not allow."""
    out = []
    for r in requests:
        m = _PATH.match(r.path)
        if m is None:
            continue  # discovery and the like
        group = m["group"] or ""
        resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
        verb = _verb(r, named=m["name"] is not None)
        if not allowed((*CLUSTER_RULES, *LEASE_RULES), group, resource, verb):
            out.append(f"{r.method} {r.path} ({group or 'core'} {resource} {verb})")
    return sorted(set(out))
