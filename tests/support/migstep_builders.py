"""Builders of MIG flow inputs for the table tests of :func:`controller.kube.migstep.next_step`
(``tests/kube/test_migstep.py``): a record, a node as the API returns it, GPU pods, and the steps
wanted, patches included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.kube.migannotation import (
    AUTOSCALER_HOLD,
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    FlowRecord,
)
from controller.kube.migstep import GpuPods, Step, Switches, Write
from controller.loop.port import Outcome
from policies.drain import DrainRule
from policies.snapshot import Pod

NOW = 50.0
LATE = 100.0  # the default record's deadline
TARGET = "all-1g.10gb"
MIG56 = {"nvidia.com/mig-1g.10gb": 56}
WHOLE8 = {"nvidia.com/gpu": 8}
RULE = DrainRule(
    protected_namespaces=frozenset({"kube-system"}),
    training_selector={"role": "training"},
    inference_workloads=frozenset(),
)
CLOSE: dict[str, str | None] = {FLOW_ANNOTATION: None, **dict.fromkeys(AUTOSCALER_HOLD)}
"""The annotations of a flow's last patch when it set both autoscaler holds itself."""
NOT_LEADER = Switches(leader=False)
KILL = Switches(halted="kill")
DRY = Switches(dry_run=True)
KEPT = "kept cordoned until the MIG manager reports the old layout back"
RESTORED = f"{CONFIG_LABEL} restored to all-disabled"


def rec(**changes: Any) -> FlowRecord:
    """A convert flow to ``all-1g.10gb`` started at 0, due at 100, with ``changes``."""
    base: dict[str, Any] = {
        "direction": "convert",
        "phase": "draining",
        "target": TARGET,
        "previous": "all-disabled",
        "pool": {"pool": "mig"},
        "previous_pool": {"pool": "whole"},
        "was_cordoned": False,
        "started": 0.0,
        "deadline": LATE,
        "profile": "1g.10gb",
        "rule": "grow-mig",
        "reason": "queue",
        "expect": MIG56,
        "previous_resources": WHOLE8,
        "held_annotations": dict.fromkeys(AUTOSCALER_HOLD),
    }
    return FlowRecord(**(base | changes))


def node(
    *,
    config: str | None = "all-disabled",
    state: str | None = None,
    alloc: dict[str, int] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Node ``n1`` (cordoned by its flow) at MIG ``config`` with the manager's ``state``."""
    labels = {"pool": "whole"}
    if config is not None:
        labels[CONFIG_LABEL] = config
    if state is not None:
        labels[STATE_LABEL] = state
    spec: dict[str, Any] = {"unschedulable": True}
    if taints is not None:
        spec["taints"] = taints
    allocatable = {k: str(n) for k, n in (alloc or {}).items()}
    return {
        "metadata": {"name": "n1", "resourceVersion": "7", "labels": labels},
        "spec": spec,
        "status": {"allocatable": allocatable},
    }


def pod(name: str, *, training: bool = True) -> Pod:
    """A running pod on ``n1`` holding one GPU, a training pod unless told otherwise."""
    labels = {"role": "training"} if training else {}
    return Pod("ml", name, node="n1", gpus=1, labels=labels)


def record_patch(record: FlowRecord) -> dict[str, Any]:
    return {"metadata": {"annotations": {FLOW_ANNOTATION: record.to_json()}}}


def failed(detail: str, *, labels: dict[str, str | None] | None = None) -> Write:
    """A rollback that uncordons the node and deletes the record."""
    patch = {
        "metadata": {"labels": labels or {}, "annotations": CLOSE},
        "spec": {"unschedulable": None},
    }
    return Write(patch, Outcome.FAILED, detail, recorded=True)


def restoring(detail: str, *, now: float = NOW) -> Write:
    """A rollback at ``now`` that puts the previous layout back and keeps the node cordoned."""
    patch = {
        "metadata": {
            "labels": {CONFIG_LABEL: "all-disabled", STATE_LABEL: None},
            "annotations": {FLOW_ANNOTATION: rec(phase="restoring", deadline=now + 900).to_json()},
        }
    }
    return Write(patch, Outcome.FAILED, f"{detail}; {RESTORED}; {KEPT}", recorded=True)


FINISH = Write(
    {
        "metadata": {"labels": {"pool": "mig"}, "annotations": CLOSE},
        "spec": {"unschedulable": None},
    },
    Outcome.APPLIED,
    f"n1 is at {TARGET}, moved to pool pool=mig, uncordoned",
    recorded=True,
)
RECONFIGURE = Write(
    {
        "metadata": {
            "labels": {CONFIG_LABEL: TARGET, STATE_LABEL: None},
            "annotations": {
                FLOW_ANNOTATION: rec(phase="reconfiguring", deadline=NOW + 900).to_json()
            },
        }
    },
    Outcome.IN_PROGRESS,
    f"drained; set {CONFIG_LABEL}={TARGET}, waiting for the MIG manager",
    recorded=True,
    reason=("EbbtideMigReconfiguring", "Normal"),
    count=False,
)
AWAITING_PLUGIN = (
    "MIG manager reported success; waiting for the device plugin "
    "(nvidia.com/gpu=8 → nvidia.com/mig-1g.10gb=56)"
)


def restore_end(detail: str, *, cordon: bool, reason: tuple[str, str]) -> Write:
    """The last step of a restore: the record goes, the node is left as ``cordon`` says."""
    patch = {
        "metadata": {"annotations": CLOSE},
        "spec": {"unschedulable": True if cordon else None},
    }
    return Write(patch, Outcome.IN_PROGRESS, detail, recorded=True, reason=reason, count=False)


@dataclass(frozen=True)
class Case:
    id: str
    record: FlowRecord
    node: dict[str, Any]
    want: Step
    now: float = NOW
    switches: Switches = field(default_factory=Switches)
    pods: GpuPods | None = None
    drained: bool = False
