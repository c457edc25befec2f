"""Scenario files: the starting cluster of a simulation, as validated YAML.

A scenario is ``apiVersion: ebbtide.io/v1alpha1``, ``kind: Scenario``, ``metadata`` and a
``spec`` holding the seed, the :class:`~controller.simcluster.simulator.SimDelays`, pools, priority
classes, nodes (or node groups with a ``count``, with taints), workloads and standalone pods
(with tolerations and a node selector), namespaces' GPU quotas and the cluster's MIG strategy
(``migStrategy``, written on every node as GPU feature discovery does). See
``docs/scenarios.md`` for the format with a complete example.

Design:

* The vocabulary is the one of policy case files (:class:`~policies.casetest.SnapshotSpec`):
  :class:`ScenarioNode`, :class:`ScenarioWorkload` and :class:`ScenarioPod` extend its node,
  workload and pod models with what a simulation needs (node groups, pools and node selectors,
  MIG requests, elastic bounds written as the annotations the engine reads). One shape, two uses.
* Validation is the policies' (:func:`~policies.loader.validate_document`): unknown keys are
  errors, durations and percentages need units, and every problem is reported together as
  ``FILE:LINE:COL: path: message``. Cross references (undefined pools, priority classes and
  nodes, duplicate names) are checked in a model validator that raises errors at the exact
  path, so they are placed in the file like schema errors.
* Times in the file are offsets from the simulation's start (``created: 90s``); the cluster is
  built by :func:`build_cluster`, which a :class:`~policies.model.Policy` may complete with its
  pools, training selector, elastic annotation names and MIG pools.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from controller.controller_errors import ControllerError
from controller.simcluster.simulator import SimCluster
from controller.simcluster.values import EPOCH, PodTemplate, SimDelays
from policies.casetest import NodeSpec, PodSpec, WorkloadSpec
from policies.drain import DrainRule
from policies.loader import PolicyError, Source, validate_document
from policies.miglayout import STRATEGY_LABEL
from policies.model import API_VERSION, Duration, Loc, Metadata, Percent, PoolSpec, _Model
from policies.nodeaffinity import NodeAffinity, Operator
from policies.snapshot import FrozenMap, Placement, Snapshot, SnapshotBuilder, Taint, Toleration

if TYPE_CHECKING:
    from policies.model import Policy

__all__ = [
    "KIND",
    "DelaysSpec",
    "ElasticBounds",
    "QuotaSpec",
    "Scenario",
    "ScenarioLoadError",
    "ScenarioNode",
    "ScenarioPod",
    "ScenarioSpec",
    "ScenarioWorkload",
    "TaintSpec",
    "TolerationSpec",
    "build_cluster",
    "check_scenario",
    "load_scenario",
    "load_scenario_text",
]

KIND: Final = "Scenario"
_MIN: Final = "ebbtide.io/min-replicas"
_MAX: Final = "ebbtide.io/max-replicas"
_GANG: Final = "ebbtide.io/gang-minimum"
_Count = Annotated[int, Field(ge=0)]


class DelaysSpec(_Model):
    """How long the simulated cluster takes to do things."""

    eviction_grace: Duration = 30.0
    """Grace of terminations the cluster starts itself (scale-down, MIG drain)."""
    pod_startup: Duration = 10.0
    """From a pod's binding to Running."""
    mig_reconfigure: Duration = 180.0
    """From setting the MIG layout on a drained node to success or failure."""
    mig_failure_probability: Percent = 0.0
    """Chance a MIG reconfiguration fails and rolls back, e.g. 5%."""
    scale_up_create: Duration = 2.0
    """From replicas going up to the new pod existing."""
    replace_create: Duration = 0.0
    """From a workload's pod starting to terminate (evicted, preempted, drained) to its
    replacement existing: at once, as a ReplicaSet recreates it."""

    def to_delays(self) -> SimDelays:
        return SimDelays(
            eviction_grace_s=self.eviction_grace,
            pod_startup_s=self.pod_startup,
            mig_reconfigure_s=self.mig_reconfigure,
            mig_failure_probability=self.mig_failure_probability,
            scale_up_create_s=self.scale_up_create,
            replace_create_s=self.replace_create,
        )


_Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class TaintSpec(_Model):
    """A node taint (``spec.taints[]``); ``NoSchedule`` and ``NoExecute`` keep pods off."""

    key: Annotated[str, Field(min_length=1)]
    value: str = ""
    effect: _Effect = "NoSchedule"

    def to_taint(self) -> Taint:
        return Taint(self.key, self.value, self.effect)


class TolerationSpec(_Model):
    """A pod toleration, matched as Kubernetes does (:class:`~policies.snapshot.Toleration`)."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: _Effect | Literal[""] = ""

    @model_validator(mode="after")
    def _valid(self) -> TolerationSpec:
        # the API server's own rules: an empty key matches every taint only with Exists
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("an Exists toleration takes no value")
        return self

    def to_toleration(self) -> Toleration:
        return Toleration(self.key, self.operator, self.value, self.effect)


class QuotaSpec(_Model):
    """A namespace's ``requests.nvidia.com/gpu`` ResourceQuota; its use is the live pods'."""

    hard: _Count


class ScenarioNode(NodeSpec):
    """A node, or ``count`` identical nodes whose ``name`` contains ``{i}`` (0, 1, …)."""

    gpus: _Count = 8
    count: Annotated[int, Field(ge=1)] | None = None
    """Make this many nodes, numbering ``{i}`` in the name from 0."""
    taints: list[TaintSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _group(self) -> ScenarioNode:
        if self.count is not None and "{i}" not in self.name:
            raise ValueError("a node group (count) needs {i} in its name")
        if self.count is None and "{i}" in self.name:
            raise ValueError("{i} in a name needs a count")
        return self

    def names(self) -> list[str]:
        if self.count is None:
            return [self.name]
        return [self.name.replace("{i}", str(i)) for i in range(self.count)]


class RequirementSpec(_Model):
    """One ``matchExpressions`` (or ``matchFields``) entry, as in Kubernetes."""

    key: Annotated[str, Field(min_length=1)]
    operator: Operator
    values: list[str] = Field(default_factory=list)


class NodeSelectorTermSpec(_Model):
    """One ``nodeSelectorTerms`` entry: its requirements are ANDed."""

    match_expressions: list[RequirementSpec] = Field(default_factory=list)
    match_fields: list[RequirementSpec] = Field(default_factory=list)


class NodeAffinitySpec(_Model):
    """``requiredDuringSchedulingIgnoredDuringExecution`` node affinity, matched as
    kube-scheduler does (:mod:`policies.nodeaffinity`); the terms are ORed."""

    node_selector_terms: Annotated[list[NodeSelectorTermSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _parses(self) -> NodeAffinitySpec:
        self.to_affinity()  # what the apiserver would refuse (In without values, ...) is an error
        return self

    def to_affinity(self) -> NodeAffinity:
        return NodeAffinity.parse(self.model_dump(by_alias=True), where="nodeAffinity")


class ElasticBounds(_Model):
    """Elastic training bounds, written as the annotations the engine reads."""

    min: _Count
    """Fewest replicas (``ebbtide.io/min-replicas``)."""
    max: Annotated[int, Field(ge=1)]
    """Most replicas (``ebbtide.io/max-replicas``)."""
    gang_minimum: Annotated[int, Field(ge=1)] | None = None
    """Fewest pods the job can run with (``ebbtide.io/gang-minimum``)."""

    @model_validator(mode="after")
    def _ordered(self) -> ElasticBounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class ScenarioWorkload(WorkloadSpec):
    """A workload: its pods are created (and re-created) by the simulated cluster."""

    replicas: _Count = 1
    gpus_per_replica: _Count = 1
    pool: str | None = None
    """Run the pods only on nodes of this pool (its nodeSelector)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """More labels the pods' nodes must carry."""
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    """Taints the pods tolerate."""
    node_affinity: NodeAffinitySpec | None = None
    """Required node affinity of the pods."""
    mig: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    """MIG instances per replica by profile (``1g.10gb: 1``); replaces gpusPerReplica."""
    elastic: ElasticBounds | None = None
    """Elastic bounds (training)."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the workload's pods."""
    startup: Duration | None = None
    """From binding to Running for this workload's pods (an LLM server pulls its image and
    loads its weights: minutes); default ``spec.delays.podStartup``."""
    checkpoint_interval: Duration = 1800.0
    """Training: the job checkpoints this often from when it (re)starts training; a membership
    change loses the work since the last checkpoint (goodput, ``ebbtide simulate``,
    :mod:`controller.offline.experiment.goodput`)."""
    restart_time: Duration = 120.0
    """Training (DDP/elastic, not a ``Job``'s tasks): how long every worker of the job does no
    work after a membership change (rendezvous, reload from the checkpoint)."""
    shrink_loss: Duration = 60.0
    """Elastic training, the optimistic goodput figure only: the most work a replica removed
    by a shrink loses there (the survivors carry on from their state)."""


class ScenarioPod(PodSpec):
    """A standalone pod (gone for good once evicted)."""

    gpus: _Count = 0
    pool: str | None = None
    """Run the pod only on nodes of this pool."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    node_affinity: NodeAffinitySpec | None = None


class ScenarioSpec(_Model):
    seed: int = 0
    """Seed of the simulation's random choices (MIG failures)."""
    delays: DelaysSpec = DelaysSpec()
    """Effect delays."""
    pools: dict[str, PoolSpec] = Field(default_factory=dict)
    """Node pools by name, as in a policy (workloads name them; MIG moves relabel with them)."""
    training_selector: dict[str, str] = Field(
        default_factory=lambda: {"ebbtide.io/class": "training"}
    )
    """Labels marking training pods in reports when no policy is given."""
    priority_classes: dict[str, int] = Field(default_factory=dict)
    nodes: list[ScenarioNode] = Field(default_factory=list)
    workloads: list[ScenarioWorkload] = Field(default_factory=list)
    pods: list[ScenarioPod] = Field(default_factory=list)
    quotas: dict[str, QuotaSpec] = Field(default_factory=dict)
    """GPU quotas by namespace: the simulated cluster admits no pod past ``hard``."""
    mig_strategy: Literal["single", "mixed"] = "mixed"
    """The GPU operator's ``mig.strategy``, written on every node as GPU feature discovery
    does (``nvidia.com/mig.strategy``; a node's own label wins). Under ``single`` a node takes
    only one-profile layouts. ``mixed`` by default: the simulator counts instances the same
    either way, so the strategy only decides whether a policy's layouts of several profiles
    (``mig.configs``, e.g. ``all-balanced``) can be applied, and a scenario written before the
    field existed keeps applying them."""

    @model_validator(mode="after")
    def _references(self) -> ScenarioSpec:
        errors: list[InitErrorDetails] = []

        def bad(loc: Loc, value: object, message: str) -> None:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("reference", message), loc=loc, input=value
                )
            )

        nodes: set[str] = set()
        for i, node in enumerate(self.nodes):
            for name in node.names():
                if name in nodes:
                    bad(("nodes", i, "name"), node.name, f"duplicate node name {name!r}")
                nodes.add(name)
        pools = ", ".join(sorted(self.pools)) or "none"
        entries: list[tuple[str, int, ScenarioWorkload | ScenarioPod]] = [
            *(("workloads", i, w) for i, w in enumerate(self.workloads)),
            *(("pods", i, p) for i, p in enumerate(self.pods)),
        ]
        seen: set[str] = set()
        for section, i, item in entries:
            key = f"{item.namespace}/{item.name}"
            if key in seen:
                bad((section, i, "name"), item.name, f"duplicate {key}")
            seen.add(key)
            if item.pool is not None and item.pool not in self.pools:
                bad((section, i, "pool"), item.pool, f"undefined pool {item.pool!r} ({pools})")
            cls = item.priority_class
            if cls is not None and cls not in self.priority_classes:
                bad((section, i, "priorityClass"), cls, f"undefined priority class {cls!r}")
            targets = item.nodes if isinstance(item, ScenarioWorkload) else [item.node]
            for j, target in enumerate(targets):
                if target is not None and target not in nodes:
                    loc: Loc = (section, i, "nodes", j) if section == "workloads" else (
                        section, i, "node")  # fmt: skip
                    bad(loc, target, f"undefined node {target!r}")
        if errors:
            raise ValidationError.from_exception_data("ScenarioSpec", errors)
        return self


class Scenario(_Model):
    api_version: Literal["ebbtide.io/v1alpha1"]
    """Always ebbtide.io/v1alpha1."""
    kind: Literal["Scenario"]
    """Always Scenario."""
    metadata: Metadata
    spec: ScenarioSpec

    def with_startup(self, workloads: Iterable[str], seconds: float) -> Scenario:
        """This scenario with ``startup`` set to ``seconds`` on ``workloads`` (keys) that have
        none of their own (``ebbtide simulate --serving-startup``)."""
        keys = set(workloads)
        changed = [
            w.model_copy(update={"startup": seconds})
            if w.startup is None and f"{w.namespace}/{w.name}" in keys
            else w
            for w in self.spec.workloads
        ]
        spec = self.spec.model_copy(update={"workloads": changed})
        return self.model_copy(update={"spec": spec})

    def to_snapshot(self, *, start: float = EPOCH, policy: Policy | None = None) -> Snapshot:
        """The cluster at the start: pods placed by the simulator's scheduler, Running."""
        return build_cluster(self, start=start, policy=policy).snapshot()


class ScenarioLoadError(ControllerError, ValueError):
    """A scenario was refused; ``errors`` holds every problem, placed in the file."""

    def __init__(self, errors: list[PolicyError]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def check_scenario(source: Source) -> tuple[Scenario | None, list[PolicyError]]:
    """The scenario (when valid) and every problem as ``FILE:LINE:COL`` errors."""
    return validate_document(Scenario, source)


def load_scenario_text(text: str, name: str = "<scenario>") -> Scenario:
    """A scenario from YAML text; :class:`ScenarioLoadError` with every problem."""
    scenario, errors = check_scenario(Source(name, text))
    if errors or scenario is None:
        raise ScenarioLoadError(errors)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """A scenario from a file; :class:`ScenarioLoadError` with every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioLoadError([PolicyError(str(path), 1, 1, "", f"cannot read: {exc}")]) from exc
    return load_scenario_text(text, str(path))


def build_cluster(
    scenario: Scenario, *, start: float = EPOCH, policy: Policy | None = None
) -> SimCluster:
    """The :class:`SimCluster` of ``scenario`` at ``start``; ``policy`` (optional) adds its pools
    (its own win on a name clash), training selector, elastic annotation names and MIG pools."""
    spec = scenario.spec
    pools = dict(spec.pools)
    selector: dict[str, str] = dict(spec.training_selector)
    names = (_MIN, _MAX, _GANG)
    convert_to = revert_to = None
    if policy is not None:
        pools.update(policy.spec.pools)
        training = policy.spec.training
        if training is not None:
            selector = dict(training.selector)
            elastic = training.elastic
            names = (
                elastic.min_replicas_annotation,
                elastic.max_replicas_annotation,
                training.gang_minimum_annotation,
            )
        if policy.spec.mig is not None:
            convert_to, revert_to = policy.spec.mig.to_pool, policy.spec.mig.from_pool

    def node_selector(pool: str | None, extra: dict[str, str]) -> FrozenMap[str]:
        labels = dict(pools[pool].node_selector) if pool in pools else {}
        return FrozenMap({**labels, **extra})

    b = SnapshotBuilder()
    for cls, value in sorted(spec.priority_classes.items()):
        b.priority_class(cls, value)
    for n in spec.nodes:
        for name in n.names():
            b.node(
                name,
                gpus=n.gpus,
                model=n.model,
                labels={STRATEGY_LABEL: spec.mig_strategy, **n.labels},
                annotations=n.annotations,
                cordoned=n.cordoned,
                mig_config=n.mig_config,
                mig_state=n.mig_state,
                taints=[t.to_taint() for t in n.taints],
            )
    templates: dict[str, PodTemplate] = {}
    for w in spec.workloads:
        annotations = dict(w.annotations)
        if w.elastic is not None:
            annotations[names[0]] = str(w.elastic.min)
            annotations[names[1]] = str(w.elastic.max)
            if w.elastic.gang_minimum is not None:
                annotations[names[2]] = str(w.elastic.gang_minimum)
        key = f"{w.namespace}/{w.name}"
        where = _placement(w)
        tpl = PodTemplate(
            FrozenMap(w.mig),
            node_selector(w.pool, w.node_selector),
            FrozenMap(w.pod_annotations),
            w.startup,
        )
        templates[key] = tpl
        common: dict[str, Any] = {
            "labels": w.labels,
            "priority": w.priority,
            "priority_class": w.priority_class,
            "created": start + w.created,
            "placement": where,
        }
        b.workload(
            w.namespace,
            w.name,
            kind=w.kind,
            replicas=w.replicas,
            gpus_per_replica=w.gpus_per_replica,
            annotations=annotations,
            **common,
        )
        for i in range(w.replicas if w.nodes else 0):
            b.pod(
                w.namespace,
                f"{w.name}-{i}",
                node=w.nodes[i % len(w.nodes)],
                gpus=0 if w.mig else w.gpus_per_replica,
                mig=w.mig,
                workload=key,
                annotations=w.pod_annotations,
                **common,
            )
    selectors: dict[str, FrozenMap[str]] = {}
    for p in spec.pods:
        p.add_to(b, start=start, placement=_placement(p))
        selectors[f"{p.namespace}/{p.name}"] = node_selector(p.pool, p.node_selector)
    for ns, q in sorted(spec.quotas.items()):
        b.quota(ns, hard=q.hard)
    return SimCluster(
        b.build(),
        delays=spec.delays.to_delays(),
        seed=spec.seed,
        start=start,
        pools=pools,
        training_selector=selector,
        templates=templates,
        pod_selectors=selectors,
        convert_to=convert_to,
        revert_to=revert_to,
        drain=DrainRule.of(policy) if policy is not None else None,
        mig_configs=policy.spec.mig.configs if policy is not None and policy.spec.mig else None,
    )


def _placement(item: ScenarioWorkload | ScenarioPod) -> Placement:
    """Where the engine sees the pods may run: the item's own selector, tolerations and node
    affinity (its pool's selector stays the simulator's, as a MIG move relabels nodes between
    pools)."""
    affinity = item.node_affinity.to_affinity() if item.node_affinity is not None else None
    return Placement(
        item.node_selector, tuple(t.to_toleration() for t in item.tolerations), affinity
    )


_ = API_VERSION  # the same apiVersion as policies (kept importable from here)
