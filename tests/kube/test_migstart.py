"""Table tests of :func:`controller.kube.migstart.first_step`: how a MIG flow starts (or does not)
on a node as read, with no API server: a flow already there, an unknown or unadvertisable layout,
a node already where the decision wants it, and the record and patch that start a new flow."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from controller.kube.migannotation import (
    AUTOSCALER_HOLD,
    CONFIG_LABEL,
    FLOW_ANNOTATION,
    STATE_LABEL,
    MigDecision,
)
from controller.kube.migstart import Begin, Finish, Resume, Start, first_step
from controller.kube.migstep import MigFlowSettings, Wait
from controller.loop.port import Outcome
from policies.decisions import Explanation, MigConvert, MigRevert
from policies.model import Policy
from support.migstep_builders import MIG56, NOW, TARGET, WHOLE8, rec

WHY = Explanation.of("mig-convert-idle", "whole pool idle")
CONVERT = MigConvert(1.0, "gpu-1", TARGET, "A100-80GB", WHY, id="d1")
REVERT = MigRevert(1.0, "gpu-1", "1g.10gb", WHY, id="d2")
WHOLE = {"ebbtide.io/pool": "whole"}
MIG = {"ebbtide.io/pool": "mig"}
HOLDS = dict.fromkeys(AUTOSCALER_HOLD, "true")


def policy(*, mig_taint: bool = False) -> Policy:
    """Pools ``whole`` → ``mig`` (``all-1g.10gb`` for A100-80GB); the MIG pool tainted if told."""
    taints = [{"key": "nvidia.com/mig", "value": "true"}] if mig_taint else []
    spec = {
        "pools": {
            "whole": {"nodeSelector": WHOLE},
            "mig": {"nodeSelector": MIG, "kind": "mig", "taints": taints},
        },
        "mig": {
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "profiles": {"A100-80GB": [TARGET, "all-balanced"]},
            "configs": {"all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
            "revertAfter": "2m",
        },
    }
    return Policy.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "t"},
            "spec": spec,
        }
    )


def node(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    alloc: dict[str, int] | None = None,
    cordoned: bool = False,
) -> dict[str, Any]:
    """Node ``gpu-1`` of the whole pool with 8 whole GPUs unless told otherwise."""
    return {
        "metadata": {
            "name": "gpu-1",
            "resourceVersion": "3",
            "labels": WHOLE | (labels or {}),
            "annotations": annotations or {},
        },
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": {k: str(n) for k, n in (alloc or WHOLE8).items()}},
    }


MIG_NODE = {**MIG, CONFIG_LABEL: TARGET, STATE_LABEL: "success", "nvidia.com/gpu.count": "8"}


@dataclass(frozen=True)
class Case:
    id: str
    decision: MigDecision
    node: dict[str, Any]
    want: Start
    tainted: bool = False
    """The MIG pool carries a taint."""


def begin(case_record: dict[str, Any], *, hold: dict[str, str] = HOLDS) -> Begin:
    """The start wanted: a draining record with ``case_record``'s fields, cordon and holds."""
    fields: dict[str, Any] = {
        "decision_id": "d1",
        "profile": TARGET,
        "rule": WHY.rule,
        "reason": WHY.reason,
        "gpu_model": "A100-80GB",
        "previous": None,
        "pool": MIG,
        "previous_pool": WHOLE,
        "started": NOW,
        "deadline": NOW + 600,
    }
    record = rec(**(fields | case_record))
    patch = {
        "metadata": {"annotations": {FLOW_ANNOTATION: record.to_json(), **hold}},
        "spec": {"unschedulable": True},
    }
    target = record.target
    return Begin(record, patch, f"cordon gpu-1, drain its GPU pods, set {CONFIG_LABEL}={target}")


CASES = [
    Case("whole-node/begins", CONVERT, node(), begin({})),
    Case(
        "cordoned-node/begins-and-remembers-the-cordon",
        CONVERT,
        node(cordoned=True),
        begin({"was_cordoned": True}),
    ),
    Case(
        "autoscaler-hold-set-by-someone/remembered",
        CONVERT,
        node(annotations={"karpenter.sh/do-not-disrupt": "true"}),
        begin(
            {
                "held_annotations": {
                    "karpenter.sh/do-not-disrupt": "true",
                    "cluster-autoscaler.kubernetes.io/scale-down-disabled": None,
                }
            }
        ),
    ),
    Case(
        "tainted-mig-pool/the-taint-moves-with-the-node",
        CONVERT,
        node(),
        begin({"taints": {"nvidia.com/mig:NoSchedule": "true"}}),
        tainted=True,
    ),
    Case(
        "revert/begins-towards-whole-cards",
        REVERT,
        node(labels=MIG_NODE, alloc=MIG56),
        begin(
            {
                "direction": "revert",
                "target": "all-disabled",
                "previous": TARGET,
                "pool": WHOLE,
                "previous_pool": MIG,
                "profile": "1g.10gb",
                "decision_id": "d2",
                "gpu_model": "",
                "expect": WHOLE8,
                "previous_resources": MIG56,
                "taints": {},
            }
        ),
    ),
    Case(
        "already-converted/already-done",
        CONVERT,
        node(labels=MIG_NODE, alloc=MIG56),
        Finish(Outcome.ALREADY_DONE, f"gpu-1 is at {TARGET}"),
    ),
    Case(
        "converted-but-cordoned/begins",
        CONVERT,
        node(labels=MIG_NODE, alloc=MIG56, cordoned=True),
        begin(
            {
                "previous": TARGET,
                "previous_pool": MIG,
                "was_cordoned": True,
                "previous_resources": MIG56,
            }
        ),
    ),
    Case(
        "this-flow-running/resumes",
        CONVERT,
        node(annotations={FLOW_ANNOTATION: rec().to_json()}),
        Resume(),
    ),
    Case(
        "another-flow-running/waits",
        CONVERT,
        node(annotations={FLOW_ANNOTATION: rec(direction="revert", target="all-x").to_json()}),
        Wait("another MIG flow (revert to all-x) is in progress"),
    ),
    Case(
        "unreadable-record/fails",
        CONVERT,
        node(annotations={FLOW_ANNOTATION: '{"v": 1}'}),
        Finish(Outcome.FAILED, f"malformed {FLOW_ANNOTATION}: KeyError('direction')"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_first_step(case: Case) -> None:
    """Starting a flow takes exactly the wanted step, and leaves the node as it was read."""
    observed = copy.deepcopy(case.node)
    got = first_step(
        case.decision,
        observed,
        now=NOW,
        settings=MigFlowSettings(),
        policy=policy(mig_taint=case.tainted),
    )
    assert got == case.want
    assert observed == case.node


@pytest.mark.parametrize(
    ("profile", "labels", "why"),
    [
        ("custom-layout", {}, "unknown MIG config 'custom-layout'"),
        ("all-balanced", {"nvidia.com/mig.strategy": "single"}, "single"),
    ],
    ids=["unknown-layout", "mixed-layout-on-a-single-strategy-node"],
)
def test_a_layout_the_node_cannot_show_fails_before_anything(
    profile: str, labels: dict[str, str], why: str
) -> None:
    """A target config naming no layout, or one the node's MIG strategy cannot advertise, fails."""
    decision = MigConvert(1.0, "gpu-1", profile, "A100-80GB", WHY)
    got = first_step(
        decision, node(labels=labels), now=NOW, settings=MigFlowSettings(), policy=policy()
    )
    assert isinstance(got, Finish)
    assert got.outcome is Outcome.FAILED
    assert why in got.detail
