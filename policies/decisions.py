"""What the engine decides, and why: four decision types, each carrying its explanation.

Design:

* Decisions are frozen dataclasses in the style of Kueue's preemption targets: the engine only
  decides; actuators (Kubernetes, the simulator, dry-run) carry decisions out. Each names its
  target with plain strings (``namespace/name`` or a node name) so no client type leaks in.
* Every decision has an :class:`Explanation`: the ``rule`` that fired, a one-line ``reason``,
  the ``inputs`` it saw (P99, utilization, counts), the ``thresholds`` it compared them with, and
  the ``alternatives`` it rejected and why (a cheaper victim that was protected, a budget that was
  spent). ``dry_run`` is set from the policy; actuators must write nothing for such decisions.
* :func:`decision_to_dict` is the one JSON shape (``decisions.jsonl``, Kubernetes Events, case
  files and ``policy test`` diffs all use it). An eviction or a shrink names the workload it
  takes a pod from (``disrupts``): read back from the decisions log after a restart, the
  workload's replacement pods are still known as Ebbtide's own doing, not demand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from policies.snapshot import FrozenMap

__all__ = [
    "Action",
    "Alternative",
    "Decision",
    "Evict",
    "Explanation",
    "MigConvert",
    "MigRevert",
    "Role",
    "Scalar",
    "Scale",
    "decision_id",
    "decision_to_dict",
]

Scalar = str | int | float | bool | None
Action = Literal["scale", "evict", "mig_convert", "mig_revert"]
Role = Literal["inference", "training"]

_NOTHING: Final[Mapping[str, Scalar]] = FrozenMap()


@dataclass(frozen=True, slots=True)
class Alternative:
    """An option the engine considered and did not take."""

    option: str
    why_not: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a decision was taken: enough to answer "why did it do that?" from a log line."""

    rule: str
    reason: str
    inputs: Mapping[str, Scalar] = field(default_factory=lambda: _NOTHING)
    thresholds: Mapping[str, Scalar] = field(default_factory=lambda: _NOTHING)
    alternatives: tuple[Alternative, ...] = ()

    @staticmethod
    def of(
        rule: str,
        reason: str,
        *,
        inputs: Mapping[str, Scalar] | None = None,
        thresholds: Mapping[str, Scalar] | None = None,
        alternatives: tuple[Alternative, ...] = (),
    ) -> Explanation:
        """An explanation whose mappings are read-only copies."""
        return Explanation(
            rule,
            reason,
            FrozenMap(inputs or {}),
            FrozenMap(thresholds or {}),
            alternatives,
        )


@dataclass(frozen=True, slots=True)
class Scale:
    """Set ``workload``'s replicas from ``from_replicas`` to ``to_replicas`` via ``/scale``."""

    at: float
    workload: str
    """``namespace/name``."""
    kind: str
    from_replicas: int
    to_replicas: int
    role: Role
    explanation: Explanation
    cause: str | None = None
    """The service (``namespace/name``) this was done for, if any."""
    dry_run: bool = False
    id: str = ""
    """Identity in the decisions log; derived from action, target and time when not given."""
    remove: tuple[str, ...] = ()
    """Pods (``namespace/name``) a scale-down removes, chosen so whole nodes empty; empty: the
    owner's controller picks (a StatefulSet always removes its highest ordinals)."""
    pool: str | None = None
    """For a training grow: the pool whose idle GPUs it takes. Its grow cooldown runs from the
    decision, in a replica that reads the decision back from the decisions log too."""

    action: Literal["scale"] = field(default="scale", init=False)

    def __post_init__(self) -> None:
        _identify(self)

    @property
    def target(self) -> str:
        return self.workload

    @property
    def disrupts(self) -> str | None:
        """The workload a shrink takes pods from (its replacements are no demand)."""
        return self.workload if self.to_replicas < self.from_replicas else None


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict ``pod`` through the Eviction API (PDBs hold) with ``grace_s`` to terminate."""

    at: float
    pod: str
    """``namespace/name``."""
    node: str | None
    workload: str | None
    grace_s: float
    explanation: Explanation
    cause: str | None = None
    dry_run: bool = False
    id: str = ""

    action: Literal["evict"] = field(default="evict", init=False)

    def __post_init__(self) -> None:
        _identify(self)

    @property
    def target(self) -> str:
        return self.pod

    @property
    def disrupts(self) -> str | None:
        """The workload whose pod is evicted (it recreates one: no demand)."""
        return self.workload


@dataclass(frozen=True, slots=True)
class MigConvert:
    """Partition every GPU of ``node`` with MIG ``profile`` (``nvidia.com/mig.config``)."""

    at: float
    node: str
    profile: str
    gpu_model: str
    explanation: Explanation
    dry_run: bool = False
    id: str = ""

    action: Literal["mig_convert"] = field(default="mig_convert", init=False)

    def __post_init__(self) -> None:
        _identify(self)

    @property
    def target(self) -> str:
        return self.node

    @property
    def cause(self) -> str | None:
        return None

    @property
    def disrupts(self) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class MigRevert:
    """Return ``node`` from MIG ``profile`` to whole cards (``all-disabled``)."""

    at: float
    node: str
    profile: str
    explanation: Explanation
    dry_run: bool = False
    id: str = ""

    action: Literal["mig_revert"] = field(default="mig_revert", init=False)

    def __post_init__(self) -> None:
        _identify(self)

    @property
    def target(self) -> str:
        return self.node

    @property
    def cause(self) -> str | None:
        return None

    @property
    def disrupts(self) -> str | None:
        return None


Decision = Scale | Evict | MigConvert | MigRevert


def decision_id(action: str, target: str, at: float) -> str:
    """A decision's identity: its action, target and time (to the millisecond). One round
    never takes two actions on one target, so this names exactly one decision; and records
    written before decisions carried an ``id`` get the same identity when read back."""
    return f"{action}:{target}@{at:.3f}"


def _identify(decision: Decision) -> None:
    if not decision.id:
        object.__setattr__(
            decision, "id", decision_id(decision.action, decision.target, decision.at)
        )


def decision_to_dict(decision: Decision) -> dict[str, object]:
    """The JSON shape of a decision: ``ts, action, target, rule, reason, inputs, thresholds,
    alternatives, dry_run`` plus the action's own fields (``cause``, ``disrupts`` and a grow's
    ``pool`` when set); ``id`` names it in the decisions log."""
    exp = decision.explanation
    out: dict[str, object] = {
        "id": decision.id,
        "ts": decision.at,
        "action": decision.action,
        "target": decision.target,
        "rule": exp.rule,
        "reason": exp.reason,
    }
    if isinstance(decision, Scale):
        out.update(
            kind=decision.kind,
            role=decision.role,
            **{"from": decision.from_replicas, "to": decision.to_replicas},
        )
        if decision.remove:
            out["remove"] = list(decision.remove)
        if decision.pool is not None:
            out["pool"] = decision.pool
    elif isinstance(decision, Evict):
        out.update(node=decision.node, workload=decision.workload, grace_s=decision.grace_s)
    elif isinstance(decision, MigConvert):
        out.update(profile=decision.profile, gpu_model=decision.gpu_model)
    else:
        out.update(profile=decision.profile)
    if decision.cause is not None:
        out["cause"] = decision.cause
    if decision.disrupts is not None:
        out["disrupts"] = decision.disrupts
    out["inputs"] = dict(exp.inputs)
    out["thresholds"] = dict(exp.thresholds)
    out["alternatives"] = [{"option": a.option, "why_not": a.why_not} for a in exp.alternatives]
    out["dry_run"] = decision.dry_run
    return out
