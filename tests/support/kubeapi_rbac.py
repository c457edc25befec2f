"""The apiserver's RBAC authorizer for the test API server, over the roles the Helm chart renders.

A real apiserver authorizes every request before it reaches a handler: the controller runs as
the chart's ServiceAccount, bound to the chart's ClusterRole and (in the release namespace) its
leader-election Role, and whatever those rules do not grant is a 403 before anything changes.
Checking the request log against the rules afterwards misses what the controller does with a
403 (it may log it and carry on, and the test passes), so the test server refuses as the
apiserver would, and remembers each refusal for the fixture to fail the test on.

* **The roles are the chart's**, rendered with the real Helm engine (helm-python-sdk) for the
  settings under test (:class:`RbacSettings`: ``controller.workloadKinds``,
  ``controller.kueue``, ``serviceObjectives.namespaces``, the release namespace), once per
  settings: every ClusterRole and Role bound to the controller's ServiceAccount.
* **The decision** is RBAC's (kubernetes ``plugin/pkg/auth/authorizer/rbac/rbac.go``
  ``RuleAllows``): a rule allows a request when its apiGroups, resources (``pods/eviction`` for a
  subresource) and verbs contain the request's (or ``*``), and its resourceNames, when set,
  the object's name. Discovery (non-resource paths) is allowed, as ``system:discovery`` is to
  every authenticated user.
* **The refusal** is the apiserver's (``k8s.io/apiserver`` ``pkg/endpoints/handlers/
  responsewriters/errors.go`` ``forbiddenMessage``, then ``apierrors.NewForbidden``): 403,
  reason Forbidden, ``pods "p-0" is forbidden: User "system:serviceaccount:NS:SA" cannot patch
  resource "pods" in API group "" in the namespace "ml"``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
from ruamel.yaml import YAML

from controller.process.settings import DEFAULT_WORKLOAD_KINDS

from .kubeapi_objects import ApiError

__all__ = [
    "Attributes",
    "Authorizer",
    "RbacSettings",
    "Roles",
    "attributes",
    "chart_authorizer",
    "chart_roles",
]

CHART = Path(__file__).resolve().parents[2] / "helm" / "ebbtide"
RELEASE = "ebb"

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})


@dataclass(frozen=True, slots=True)
class RbacSettings:
    """The chart values the roles are rendered with: the settings under test."""

    kinds: tuple[str, ...] = DEFAULT_WORKLOAD_KINDS
    """``controller.workloadKinds``."""
    kueue: bool = False
    """``controller.kueue``."""
    namespace: str = "ebbtide-system"
    """The release namespace: where the leader-election Role (and so the Lease) is."""
    objectives: tuple[str, ...] = ()
    """``serviceObjectives.namespaces``: where ServiceObjectives are granted (``*``: all)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule as rendered (a ``*`` in any list matches anything)."""

    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]

    def allows(self, a: Attributes) -> bool:
        def has(items: frozenset[str], item: str) -> bool:
            return "*" in items or item in items

        named = not self.names or (a.name is not None and a.name in self.names)
        return (
            has(self.groups, a.group)
            and has(self.resources, a.resource)
            and has(self.verbs, a.verb)
            and named
        )


@dataclass(frozen=True, slots=True)
class Roles:
    """The controller's identity and the rules bound to it."""

    user: str
    cluster: tuple[Rule, ...]
    """The ClusterRole's rules: every namespace and the cluster scope."""
    namespace: str
    namespaced: tuple[Rule, ...]
    """The Role's rules: in :attr:`namespace` only."""
    elsewhere: tuple[tuple[str, tuple[Rule, ...]], ...] = ()
    """Other Roles bound to it (the ServiceObjectives'), as (namespace, rules)."""


@dataclass(frozen=True, slots=True)
class Attributes:
    """What RBAC decides on: verb, API group, resource (``pods/eviction`` with a subresource),
    namespace and name."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


def attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes | None:
    """The request's attributes, or None for a non-resource request (discovery)."""
    m = _PATH.match(path)
    if m is None:
        return None
    if method == "GET":
        if m["name"] is None and query.get("watch", "") in _TRUE:
            verb = "watch"
        else:
            verb = "get" if m["name"] is not None else "list"
    elif method == "DELETE" and m["name"] is None:
        verb = "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
    return Attributes(verb, m["group"] or "", resource, m["namespace"], m["name"])


class Authorizer:
    """Decides every request as the apiserver's RBAC authorizer would for :class:`Roles`."""

    def __init__(self, roles: Roles) -> None:
        self.roles = roles

    def refusal(self, method: str, path: str, query: Mapping[str, str]) -> ApiError | None:
        """The 403 the apiserver answers, or None when the roles allow the request."""
        a = attributes(method, path, query)
        if a is None:
            return None
        rules = self.roles.cluster
        if a.namespace == self.roles.namespace:
            rules = (*rules, *self.roles.namespaced)
        for namespace, more in self.roles.elsewhere:
            if a.namespace == namespace:
                rules = (*rules, *more)
        if any(rule.allows(a) for rule in rules):
            return None
        base = a.resource.partition("/")[0]
        qualified = f"{base}.{a.group}" if a.group else base
        where = (
            f'in the namespace "{a.namespace}"'
            if a.namespace is not None
            else "at the cluster scope"
        )
        why = (
            f'User "{self.roles.user}" cannot {a.verb} resource "{a.resource}" '
            f'in API group "{a.group}" {where}'
        )
        subject = f'{qualified} "{a.name}"' if a.name else qualified
        return ApiError(
            403,
            f"{subject} is forbidden: {why}",
            details={"name": a.name or "", "group": a.group, "kind": base},
        )


def _rules(role: Mapping[str, Any]) -> tuple[Rule, ...]:
    return tuple(
        Rule(
            frozenset(r.get("apiGroups") or ()),
            frozenset(r.get("resources") or ()),
            frozenset(r.get("verbs") or ()),
            frozenset(r.get("resourceNames") or ()),
        )
        for r in role.get("rules") or ()
    )


@functools.cache
def chart_roles(settings: RbacSettings) -> Roles:
    """The controller's ClusterRole and Role as the chart renders them for ``settings``, and the
    ServiceAccount its bindings name."""
    values = {
        "controller": {"workloadKinds": list(settings.kinds), "kueue": settings.kueue},
        "serviceObjectives": {"namespaces": list(settings.objectives)},
    }
    chart = helm.Chart.load(CHART)
    try:
        out = chart.render(values, name=RELEASE, namespace=settings.namespace, is_install=True)
    finally:
        chart.close()
    docs = [
        d for d in YAML(typ="safe", pure=True).load_all(out["ebbtide/templates/rbac.yaml"]) if d
    ]

    def controller(kind: str) -> list[Mapping[str, Any]]:
        return [
            d
            for d in docs
            if d["kind"] == kind
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"
        ]

    (subject,) = controller("ClusterRoleBinding")[0]["subjects"]
    (role, *others) = controller("Role")
    return Roles(
        user=f"system:serviceaccount:{subject['namespace']}:{subject['name']}",
        cluster=tuple(r for cluster in controller("ClusterRole") for r in _rules(cluster)),
        namespace=role["metadata"]["namespace"],
        namespaced=_rules(role),
        elsewhere=tuple((o["metadata"]["namespace"], _rules(o)) for o in others),
    )


def chart_authorizer(settings: RbacSettings | None = None) -> Authorizer:
    """An authorizer over the chart's roles for ``settings`` (the chart's defaults)."""
    return Authorizer(chart_roles(settings or RbacSettings()))
