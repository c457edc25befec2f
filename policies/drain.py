"""Drain eligibility: which pods must leave a node before its GPUs are repartitioned, and whether
each of them may be evicted.

One rule for every place that empties a node, so that they cannot disagree: MIG planning
(:mod:`policies.mig` picks no node it could not empty), the Kubernetes MIG flow's drain step
(which rolls back before evicting anything when a pod may not go) and the simulated cluster's
drain (which refuses exactly what a real cluster would, so replays and simulations show the
same outcome). When the planner and the flow disagreed, a real cluster rolled the flow back and
the engine picked the same node again on the next tick, forever.

Design:

* Only pods holding GPUs (whole cards or MIG slices) must leave: the MIG manager needs the GPUs
  and nothing else. Pods without GPU requests (DaemonSet agents, ``kube-system`` pods, monitoring)
  neither block a drain nor are evicted by it.
* A GPU pod may be evicted only when it is in no protected namespace, is not annotated
  ``ebbtide.io/do-not-disrupt`` (any value but ``false``) nor protected by Karpenter's or the
  cluster autoscaler's annotation (:func:`disrupt_annotation`), is not a pod of a workload the
  policy names as an inference service, and matches the training selector. Any other GPU pod
  blocks the drain, and the reason says which rule held it.
* :func:`protection` is the part victim selection shares: what may never be disrupted at all.
* Pure: snapshot pods in, a frozen :class:`DrainPlan` out. :class:`DrainRule` is built from the
  policy once (:meth:`DrainRule.of`) and is a plain value a simulator can hold.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from policies.model import DO_NOT_DISRUPT, Policy
from policies.snapshot import Pod

__all__ = [
    "DrainPlan",
    "DrainRule",
    "disrupt_annotation",
    "disrupt_forbidden",
    "must_leave",
    "plan_drain",
    "protection",
]


#: Other controllers' "leave this pod alone" annotations, and the value that says so.
_FOREIGN_PROTECTIONS: Final = (
    ("karpenter.sh/do-not-disrupt", "true"),
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
)


def disrupt_annotation(annotations: Mapping[str, str]) -> str | None:
    """The annotation forbidding disruption: ``ebbtide.io/do-not-disrupt`` set to anything but
    ``false``, Karpenter's ``karpenter.sh/do-not-disrupt: "true"`` or the cluster autoscaler's
    ``safe-to-evict: "false"`` (what a user set for one node autoscaler holds for Ebbtide too)."""
    value = annotations.get(DO_NOT_DISRUPT)
    if value is not None and value.strip().lower() != "false":
        return DO_NOT_DISRUPT
    for key, forbidding in _FOREIGN_PROTECTIONS:
        if (annotations.get(key) or "").strip().lower() == forbidding:
            return f"{key}: {forbidding!r}"
    return None


def disrupt_forbidden(annotations: Mapping[str, str]) -> bool:
    """Some annotation forbids disrupting the object (:func:`disrupt_annotation`)."""
    return disrupt_annotation(annotations) is not None


def protection(pod: Pod, protected_namespaces: Collection[str]) -> str | None:
    """Why ``pod`` may never be disrupted (protected namespace, ``do-not-disrupt``), or
    ``None``."""
    if pod.namespace in protected_namespaces:
        return f"namespace {pod.namespace} is protected"
    if (annotation := disrupt_annotation(pod.annotations)) is not None:
        return f"pod is annotated {annotation}"
    return None


def must_leave(pod: Pod) -> bool:
    """``pod`` holds GPUs on its node (whole cards or MIG slices), so a drain must move it."""
    return pod.holds_gpus and (pod.gpus > 0 or any(pod.mig.values()))


@dataclass(frozen=True, slots=True)
class DrainRule:
    """What a policy says about evicting pods to empty a node."""

    protected_namespaces: frozenset[str]
    training_selector: Mapping[str, str] | None
    """``None``: the policy selects no training, so no GPU pod may be evicted."""
    inference_workloads: frozenset[str]
    """``namespace/name`` of every service's workload."""

    @classmethod
    def of(cls, policy: Policy) -> DrainRule:
        spec = policy.spec
        return cls(
            protected_namespaces=frozenset(spec.protected_namespaces),
            training_selector=spec.training.selector if spec.training is not None else None,
            inference_workloads=frozenset(
                f"{svc.namespace}/{svc.workload or name}" for name, svc in spec.services.items()
            ),
        )

    def refusal(self, pod: Pod) -> str | None:
        """Why ``pod`` may not be evicted to drain its node, or ``None`` when it may."""
        why = protection(pod, self.protected_namespaces)
        if why is not None:
            return why
        if pod.workload is not None and pod.workload in self.inference_workloads:
            return f"pod of inference service workload {pod.workload}"
        selector = self.training_selector
        if selector is None:
            return "the policy selects no training workloads"
        if any(pod.labels.get(k) != v for k, v in selector.items()):
            shown = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            return f"not training (does not match {shown})"
        return None


@dataclass(frozen=True, slots=True)
class DrainPlan:
    """The GPU pods draining a node evicts, and those that block it (with why), by pod key."""

    evict: tuple[Pod, ...]
    blocked: tuple[tuple[Pod, str], ...]

    @property
    def refusal(self) -> str | None:
        """Why the node cannot be drained (its first blocking pod), or ``None``."""
        if not self.blocked:
            return None
        pod, why = self.blocked[0]
        more = f" (and {len(self.blocked) - 1} more)" if len(self.blocked) > 1 else ""
        return f"GPU pod {pod.key} may not be disrupted: {why}{more}"

    @property
    def empty(self) -> bool:
        """No GPU pod on the node: nothing to evict, nothing blocking."""
        return not self.evict and not self.blocked


def plan_drain(rule: DrainRule, pods: Iterable[Pod]) -> DrainPlan:
    """Which of a node's ``pods`` a drain evicts and which block it, each sorted by key."""
    evict: list[Pod] = []
    blocked: list[tuple[Pod, str]] = []
    for pod in sorted(pods, key=lambda p: p.key):
        if not must_leave(pod):
            continue
        why = rule.refusal(pod)
        if why is None:
            evict.append(pod)
        else:
            blocked.append((pod, why))
    return DrainPlan(tuple(evict), tuple(blocked))
