"""The exact Kubernetes permissions the controller uses: the single source of truth.

The Helm chart's ClusterRole and Role are rendered from this list (a test renders the chart and
compares), and the end-to-end tests check every request the controller made against it, so the
list, the code and the chart cannot drift apart. No wildcards: each verb is here because some
code path needs it.

Verbs per resource, and who needs them:

* nodes — get/list/watch (cluster state, MIG flow), patch (cordon, MIG labels, flow annotation);
* pods — get/list/watch (cluster state, drain), patch (the checkpoint handshake's notice on a
  training pod of any kind and its removal when it expired, a Deployment's pod-deletion-cost);
  pods/eviction — create (preemption, drain);
* events — create (an Event for every action and refusal);
* priorityclasses, poddisruptionbudgets — list/watch (victim order, PDB-aware planning);
* horizontalpodautoscalers, KEDA scaledobjects — list/watch (never fight another autoscaler);
* Volcano and coscheduling podgroups — list/watch (gang minimums from ``minMember``);
* resourcequotas — list/watch (namespaces' GPU quotas bound training growth);
* each tracked workload kind (the ``kube.workload_kinds`` setting: Deployments, StatefulSets,
  PyTorchJobs by default; JobSets, RayClusters, Jobs on request) — get/list/watch, and its
  ``/scale`` subresource get/patch, or patch on the object for kinds without ``/scale``
  (RayCluster, Job); JobSets are never resized (JobSet's webhook refuses any change of
  ``replicatedJobs``), so they get no write. Jobs also get/list/patch Kueue ``workloads``
  (preemption through Kueue), and so does any kind when Kueue support is on (``kueue=True``,
  the chart's ``controller.kueue``: a Kueue-admitted JobSet, RayCluster, PyTorchJob,
  Deployment… is stopped through its Workload too), which also needs patch on the object of
  every kind (the preemption's mark). :func:`cluster_rules` derives them from the setting; the
  chart renders the same rules from the same values (``controller.workloadKinds``,
  ``controller.kueue``), and a test renders the chart for many settings and compares;
* leases (in the controller's own namespace only: a Role) — get/create/update (leader election);
* ServiceObjectives, only in the namespaces the ``kube.objective_namespaces`` setting names (the
  chart's ``serviceObjectives.namespaces``: a Role in each, or a ClusterRole for ``*``; nothing
  when it is empty) — list/watch, and patch of their ``/status`` subresource only
  (:data:`OBJECTIVE_RULES`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.kube.objective_crd import GROUP, PLURAL
from controller.kube.state import workload_kinds
from controller.kube.translate import WorkloadKind
from controller.kube.workloads import ADAPTERS, Adapter, kueue
from controller.process.settings import DEFAULT_WORKLOAD_KINDS

__all__ = [
    "CLUSTER_RULES",
    "LEASE_RULES",
    "OBJECTIVE_RULES",
    "Rule",
    "allowed",
    "cluster_rules",
    "kind_rules",
]


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule: API group, resources (``sub/resource`` for subresources), verbs."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]


#: What the controller needs whatever workload kinds it tracks.
_BASE_RULES: tuple[Rule, ...] = (
    Rule("", ("nodes",), ("get", "list", "watch", "patch")),
    Rule("", ("pods",), ("get", "list", "watch", "patch")),
    Rule("", ("pods/eviction",), ("create",)),
    Rule("", ("events",), ("create",)),
    Rule("scheduling.k8s.io", ("priorityclasses",), ("list", "watch")),
    Rule("policy", ("poddisruptionbudgets",), ("list", "watch")),
    Rule("autoscaling", ("horizontalpodautoscalers",), ("list", "watch")),
    Rule("keda.sh", ("scaledobjects",), ("list", "watch")),
    Rule("scheduling.volcano.sh", ("podgroups",), ("list", "watch")),
    Rule("scheduling.x-k8s.io", ("podgroups",), ("list", "watch")),
    Rule("", ("resourcequotas",), ("list", "watch")),
)


def kind_rules(kind: WorkloadKind, *, kueue_support: bool = False) -> tuple[Rule, ...]:
    """What acting on ``kind`` needs: read it, write its size the way its adapter does (the
    ``/scale`` subresource, or a patch of the object for kinds without one; nothing for a kind
    Ebbtide never resizes), and whatever else its owner is reached through (a Job's Kueue
    Workloads). With ``kueue_support`` the object itself is patched too, whatever its kind: a
    Kueue preemption marks the job before it deactivates the Workload, and a resume clears the
    mark."""
    adapter = ADAPTERS.get(kind.kind) or Adapter(kind)
    resizes = adapter.fixed_size is None
    patches_object = kueue_support or (resizes and not adapter.via_scale)
    verbs = ("get", "list", "watch", "patch") if patches_object else ("get", "list", "watch")
    rules: tuple[Rule, ...] = (Rule(kind.group, (kind.plural,), verbs),)
    if resizes and adapter.via_scale:
        rules = (*rules, Rule(kind.group, (f"{kind.plural}/scale",), ("get", "patch")))
    extra = (Rule(group, (resource,), verbs) for group, resource, verbs in adapter.extra_rules)
    return (*rules, *extra)


def cluster_rules(
    kinds: Iterable[WorkloadKind], *, kueue_support: bool = False
) -> tuple[Rule, ...]:
    """The ClusterRole for the tracked workload ``kinds``: the base rules, then each kind's
    rules (:func:`kind_rules`), in the setting's order; with ``kueue_support``, Kueue's
    Workloads last unless a kind already brought them. A kind that always reaches Kueue (Job)
    turns Kueue support on for every kind: what it preempts through Kueue is marked too."""
    kinds = tuple(kinds)
    group, resource, verbs = kueue.RULE
    kueues = Rule(group, (resource,), verbs)
    adapters = [ADAPTERS.get(kind.kind) or Adapter(kind) for kind in kinds]
    on = kueue_support or any(kueue.RULE in a.extra_rules for a in adapters)
    rules = (*_BASE_RULES, *(rule for kind in kinds for rule in kind_rules(kind, kueue_support=on)))
    return (*rules, kueues) if on and kueues not in rules else rules


#: The ClusterRole with the default setting: everything the controller reads and changes.
CLUSTER_RULES: tuple[Rule, ...] = cluster_rules(workload_kinds(DEFAULT_WORKLOAD_KINDS))

#: The Role in the controller's namespace: its leader-election Lease.
LEASE_RULES: tuple[Rule, ...] = (
    Rule("coordination.k8s.io", ("leases",), ("get", "create", "update")),
)


#: In each namespace where ServiceObjectives may be defined: read them, write their status (a
#: team's spec is never written).
OBJECTIVE_RULES: tuple[Rule, ...] = (
    Rule(GROUP, (PLURAL,), ("list", "watch")),
    Rule(GROUP, (f"{PLURAL}/status",), ("patch",)),
)


def allowed(rules: Iterable[Rule], group: str, resource: str, verb: str) -> bool:
    """Whether ``rules`` grant ``verb`` on ``resource`` (``pods/eviction`` form) in ``group``."""
    return any(r.group == group and resource in r.resources and verb in r.verbs for r in rules)
