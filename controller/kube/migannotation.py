"""The record of a MIG flow on its node, and what the flow reads off nodes and pods.

A MIG flow (:mod:`controller.kube.migflow`) keeps its whole state in one JSON annotation on the
node, ``ebbtide.io/mig-flow``: a :class:`FlowRecord` with the direction, the phase, the target
and previous ``nvidia.com/mig.config``, the pool labels to write at the end and their previous
values, whether the node was cordoned before the flow, its start time and the current phase's
deadline, and the rule and reason of the decision (so Events after a restart still name them);
the GPU resources the device plugin must advertise at the target (``expect``) and advertised
before (``previous_resources``), whether a reported reboot already extended the deadline
(``rebooted``), the taints the pool move writes (``taints``), and the values the autoscaler
annotations had before the flow set them (``held_annotations``).
The record is the flow's only memory: a restarted controller rebuilds the decision from it
(:meth:`FlowRecord.decision`) and carries on.

The helpers read plain JSON objects (``dict``) as the API returns them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, Final, Literal

from policies.decisions import Explanation, MigConvert, MigRevert, Scalar
from policies.miglayout import (
    CONFIG_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    cards_of,
    single_mig_profile,
)

__all__ = [
    "AUTOSCALER_HOLD",
    "CONFIG_LABEL",
    "FLOW_ANNOTATION",
    "STATE_LABEL",
    "Direction",
    "FlowRecord",
    "MigDecision",
    "Phase",
    "advertised",
    "annotations_of",
    "gpu_count",
    "gpu_resources",
    "is_cordoned",
    "labels_of",
    "pod_key",
    "record_of",
    "uses_gpus",
]

STATE_LABEL: Final = "nvidia.com/mig.config.state"
FLOW_ANNOTATION: Final = "ebbtide.io/mig-flow"
#: Set to ``"true"`` while a flow runs, so Karpenter does not consolidate the node and the
#: cluster-autoscaler does not scale it down (an empty, cordoned node looks like a candidate).
AUTOSCALER_HOLD: Final = (
    "karpenter.sh/do-not-disrupt",
    "cluster-autoscaler.kubernetes.io/scale-down-disabled",
)

Direction = Literal["convert", "revert"]
Phase = Literal["draining", "reconfiguring", "advertising", "restoring"]
MigDecision = MigConvert | MigRevert
Obj = dict[str, Any]
_KNOWN: Final = {
    (d, p)
    for d in ("convert", "revert")
    for p in ("draining", "reconfiguring", "advertising", "restoring")
}


@dataclass(frozen=True, slots=True)
class FlowRecord:
    """The flow's state, kept as JSON in the node's ``ebbtide.io/mig-flow`` annotation."""

    direction: Direction
    phase: Phase
    target: str
    """``nvidia.com/mig.config`` to reach."""
    previous: str | None
    """``nvidia.com/mig.config`` before the flow (``None``: no label)."""
    pool: Mapping[str, str | None]
    """Labels to write when done (``None`` deletes): the destination pool's selector."""
    previous_pool: Mapping[str, str | None]
    """Those labels' values before the flow."""
    was_cordoned: bool
    started: float
    deadline: float
    profile: str
    rule: str
    reason: str
    decision_id: str = ""
    """The id of the decision the flow carries out: its outcome, however many ticks later, is
    recorded under it, so the ledger counts one conversion once. Empty in older records."""
    gpu_model: str = ""
    inputs: Mapping[str, Scalar] = field(default_factory=dict)
    thresholds: Mapping[str, Scalar] = field(default_factory=dict)
    expect: Mapping[str, int] = field(default_factory=dict)
    """GPU resources (``nvidia.com/mig-<profile>``, ``nvidia.com/gpu``) the node's allocatable
    must show at the target before it is uncordoned; 0: present, count unknown."""
    previous_resources: Mapping[str, int] = field(default_factory=dict)
    """GPU resources the node advertised before the flow: what a restore waits for."""
    rebooted: bool = False
    """The MIG manager reported ``rebooting`` and the deadline was extended (once per phase)."""
    taints: Mapping[str, str | None] = field(default_factory=dict)
    """Taints to write when done, by ``key:effect``: a value adds it, ``None`` removes it."""
    held_annotations: Mapping[str, str | None] = field(default_factory=dict)
    """:data:`AUTOSCALER_HOLD` annotations before the flow (``None``: absent): put back at the
    end. Empty in older records, which did not set them."""

    @staticmethod
    def for_decision(decision: MigDecision, **state: Any) -> FlowRecord:
        """A new flow's record, carrying everything needed to rebuild ``decision``."""
        exp = decision.explanation
        return FlowRecord(
            **state,
            profile=decision.profile,
            rule=exp.rule,
            reason=exp.reason,
            decision_id=decision.id,
            gpu_model=decision.gpu_model if isinstance(decision, MigConvert) else "",
            inputs=dict(exp.inputs),
            thresholds=dict(exp.thresholds),
        )

    def to_json(self) -> str:
        return json.dumps({"v": 1, **asdict(self)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> FlowRecord:
        """Parse the annotation; ``ValueError`` when it is not one of ours."""
        try:
            raw = json.loads(text)
            record = FlowRecord(
                **{f.name: raw[f.name] for f in fields(FlowRecord) if f.name in raw or _required(f)}
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed {FLOW_ANNOTATION}: {exc!r}") from exc
        if (record.direction, record.phase) not in _KNOWN:
            raise ValueError(f"unknown MIG flow {record.direction!r}/{record.phase!r}")
        return record

    def decision(self, node: str) -> MigDecision:
        """The decision this flow carries out, rebuilt after a restart or on a later tick:
        the same id, explanation and GPU model, so its outcome joins its intent."""
        exp = Explanation.of(
            self.rule or "mig-flow",
            self.reason or f"resume MIG {self.direction}",
            inputs=self.inputs,
            thresholds=self.thresholds,
        )
        if self.direction == "convert":
            return MigConvert(
                self.started, node, self.profile, self.gpu_model, exp, id=self.decision_id
            )
        return MigRevert(self.started, node, self.profile, exp, id=self.decision_id)


def _required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def labels_of(obj: Obj) -> dict[str, str]:
    """A copy of the object's labels."""
    return dict((obj.get("metadata") or {}).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    """A copy of the object's annotations."""
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def is_cordoned(node: Obj) -> bool:
    """``spec.unschedulable`` is set."""
    return bool((node.get("spec") or {}).get("unschedulable"))


def record_of(node: Obj) -> FlowRecord | None:
    """The node's flow record, ``None`` without one; ``ValueError`` when unreadable."""
    text = annotations_of(node).get(FLOW_ANNOTATION)
    return None if text is None else FlowRecord.from_json(text)


def uses_gpus(pod: Obj) -> bool:
    """The pod requests whole GPUs (``nvidia.com/gpu``) or MIG slices (``nvidia.com/mig-*``)."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for key in resources.get(section) or {}:
                if key == "nvidia.com/gpu" or key.startswith("nvidia.com/mig-"):
                    return True
    return False


def pod_key(pod: Obj) -> str:
    """``namespace/name``."""
    meta = pod["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}"


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_resources(node: Obj) -> dict[str, int]:
    """The node's allocatable ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` resources above 0."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out = {
        k: n
        for k, v in allocatable.items()
        if (k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX)) and (n := _count(v)) > 0
    }
    return dict(sorted(out.items()))


def gpu_count(node: Obj, configs: Mapping[str, Mapping[str, int]] | None = None) -> int:
    """Physical GPUs: by GPU feature discovery's labels (:func:`policies.miglayout.cards_of`:
    ``nvidia.com/gpu.count``, which counts instances on a ``single``-strategy MIG node), else
    the whole GPUs allocatable; 0 when neither says. A ``single``-strategy MIG node's allocatable
    ``nvidia.com/gpu`` are instances, so it is never read there."""
    labels = labels_of(node)
    cards = cards_of(labels, configs)
    if cards or single_mig_profile(labels) is not None:
        return cards
    return gpu_resources(node).get(GPU_RESOURCE, 0)


def advertised(node: Obj, expect: Mapping[str, int]) -> bool:
    """The device plugin advertises exactly ``expect`` (a 0 there: any count) and no other GPU
    resource: the MIG manager reports ``success`` before the plugin has restarted, and a node
    uncordoned in between would take pods for resources it does not have yet."""
    have = gpu_resources(node)
    if set(have) != set(expect) and expect:
        return False
    return all(have.get(k, 0) == n or (n == 0 and have.get(k, 0) > 0) for k, n in expect.items())
