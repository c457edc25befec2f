"""Table tests of :func:`controller.kube.migstep.next_step`: every phase of a MIG flow and every
outcome, decided on plain inputs with no API server (Kueue tests ``GetTargets`` the same way).

Each case builds a record (``rec``), a node (``node``) and optionally the GPU pods and the safety
switches (builders in ``support.migstep_builders``), and states the whole step wanted, patches
included. The flow's behaviour against a real API server stays covered by ``test_migflow*.py``.
"""

from __future__ import annotations

import copy
from typing import get_args

import pytest

from controller.kube.migannotation import CONFIG_LABEL, STATE_LABEL, Phase
from controller.kube.migstep import (
    Drained,
    EvictPods,
    GpuPods,
    ListPods,
    MigFlowSettings,
    Switches,
    Wait,
    Write,
    next_step,
)
from controller.loop.port import Outcome
from support.migstep_builders import (
    AWAITING_PLUGIN,
    CLOSE,
    DRY,
    FINISH,
    KILL,
    LATE,
    MIG56,
    NOT_LEADER,
    NOW,
    RECONFIGURE,
    RULE,
    TARGET,
    WHOLE8,
    Case,
    failed,
    node,
    pod,
    rec,
    record_patch,
    restore_end,
    restoring,
)

REBOOT = "the MIG manager is rebooting n1; waiting up to 1800s more"

CASES = [
    # --- draining ---------------------------------------------------------------------------
    Case("draining/pods-not-read/lists-them", rec(), node(), ListPods()),
    Case(
        "draining/training-pods/evicts-them-by-key",
        rec(),
        node(),
        EvictPods(("ml/a", "ml/b")),
        pods=GpuPods(2, (pod("b"), pod("a"))),
    ),
    Case(
        "draining/a-pod-not-training/rolls-back-before-evicting",
        rec(),
        node(),
        failed(
            "rolled back: GPU pod ml/svc may not be disrupted: not training "
            "(does not match role=training); uncordoned"
        ),
        pods=GpuPods(2, (pod("a"), pod("svc", training=False))),
    ),
    Case(
        "draining/only-terminating-pods/waits",
        rec(),
        node(),
        Wait("draining n1: 2 GPU pods left"),
        pods=GpuPods(2, ()),
    ),
    Case("draining/no-gpu-pod/drained", rec(), node(), Drained(), pods=GpuPods(0, ())),
    Case(
        "draining/past-deadline/rolls-back-without-listing-pods",
        rec(),
        node(),
        failed("rolled back: GPU pods not drained within 600s; uncordoned"),
        now=LATE,
    ),
    Case(
        "draining/past-deadline-was-cordoned/stays-cordoned",
        rec(was_cordoned=True),
        node(),
        Write(
            {"metadata": {"labels": {}, "annotations": CLOSE}, "spec": {"unschedulable": True}},
            Outcome.FAILED,
            "rolled back: GPU pods not drained within 600s; left cordoned as it was before",
            recorded=True,
        ),
        now=LATE,
    ),
    Case(
        "draining/past-deadline-not-leader/waits",
        rec(),
        node(),
        Wait(
            "GPU pods not drained within 600s; "
            "paused (not the leader (leadership lost before the write))"
        ),
        now=LATE,
        switches=NOT_LEADER,
    ),
    Case(
        "draining/dry-run/releases-the-node",
        rec(),
        node(),
        failed("released: dry-run turned on mid-flow; uncordoned"),
        switches=DRY,
    ),
    Case(
        "draining/kill-switch/releases-the-node",
        rec(),
        node(),
        failed("released: kill turned on mid-flow; uncordoned"),
        switches=KILL,
    ),
    Case(
        "draining/kill-switch-not-leader/waits",
        rec(),
        node(),
        Wait("kill turned on mid-flow; paused (not the leader)"),
        switches=Switches(leader=False, halted="kill"),
    ),
    # --- drained (the node read again after the drain) ----------------------------------------
    Case("drained/sets-the-config-label", rec(), node(), RECONFIGURE, drained=True),
    Case(
        "drained/kill-switch/releases-the-node",
        rec(),
        node(),
        failed("released: kill turned on mid-flow; uncordoned"),
        switches=KILL,
        drained=True,
    ),
    Case(
        "drained/dry-run/releases-the-node-without-a-label-change",
        rec(),
        node(),
        failed("released: dry-run turned on mid-flow; uncordoned"),
        switches=DRY,
        drained=True,
    ),
    Case(
        "drained/already-at-target-and-advertised/finishes",
        rec(),
        node(config=TARGET, state="success", alloc=MIG56),
        FINISH,
        drained=True,
    ),
    # --- reconfiguring ------------------------------------------------------------------------
    Case(
        "reconfiguring/pending/waits",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="pending"),
        Wait("waiting for the MIG manager (state pending)"),
    ),
    Case(
        "reconfiguring/success-advertised/finishes",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="success", alloc=MIG56),
        FINISH,
    ),
    Case(
        "reconfiguring/success-not-advertised/records-advertising",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="success", alloc=WHOLE8),
        Write(
            record_patch(rec(phase="advertising", deadline=NOW + 300)),
            Outcome.IN_PROGRESS,
            AWAITING_PLUGIN,
        ),
    ),
    Case(
        "reconfiguring/success-not-advertised-not-leader/waits",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="success", alloc=WHOLE8),
        Wait("paused (not the leader (leadership lost before the write))"),
        switches=NOT_LEADER,
    ),
    Case(
        "reconfiguring/failed/restores-the-previous-layout",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="failed"),
        restoring("rolled back: the MIG manager reported failed"),
    ),
    Case(
        "reconfiguring/failed-no-previous-label/removes-it-and-uncordons",
        rec(phase="reconfiguring", previous=None),
        node(config=TARGET, state="failed"),
        failed(
            f"rolled back: the MIG manager reported failed; {CONFIG_LABEL} restored to (none); "
            "uncordoned",
            labels={CONFIG_LABEL: None, STATE_LABEL: None},
        ),
    ),
    Case(
        "reconfiguring/label-changed-under-us/rolls-back-leaving-it",
        rec(phase="reconfiguring"),
        node(config="all-2g.20gb", state="success"),
        failed(f"rolled back: {CONFIG_LABEL} changed under us to 'all-2g.20gb'; uncordoned"),
    ),
    Case(
        "reconfiguring/rebooting/extends-the-deadline",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="rebooting"),
        Write(
            record_patch(rec(phase="reconfiguring", rebooted=True, deadline=NOW + 1800)),
            Outcome.IN_PROGRESS,
            REBOOT,
        ),
    ),
    Case(
        "reconfiguring/rebooting-not-leader/waits",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="rebooting"),
        Wait("paused (not the leader (leadership lost before the write))"),
        switches=NOT_LEADER,
    ),
    Case(
        "reconfiguring/rebooting-after-extension/waits",
        rec(phase="reconfiguring", rebooted=True),
        node(config=TARGET, state="rebooting"),
        Wait("waiting for the MIG manager (state rebooting)"),
    ),
    Case(
        "reconfiguring/rebooting-past-extended-deadline/rolls-back",
        rec(phase="reconfiguring", rebooted=True),
        node(config=TARGET, state="rebooting"),
        restoring(
            "rolled back: the node was still rebooting 1800s after the MIG manager reported it",
            now=LATE,
        ),
        now=LATE,
    ),
    Case(
        "reconfiguring/silent-past-deadline/rolls-back",
        rec(phase="reconfiguring"),
        node(config=TARGET),
        restoring(
            "rolled back: the MIG manager did not report success within 900s (state unset)",
            now=LATE,
        ),
        now=LATE,
    ),
    Case(
        "reconfiguring/kill-switch/paused",
        rec(phase="reconfiguring"),
        node(config=TARGET, state="failed"),
        Wait("paused (kill)"),
        switches=KILL,
    ),
    # --- advertising --------------------------------------------------------------------------
    Case(
        "advertising/advertised/finishes",
        rec(phase="advertising"),
        node(config=TARGET, state="success", alloc=MIG56),
        FINISH,
    ),
    Case(
        "advertising/advertised-not-leader/waits",
        rec(phase="advertising"),
        node(config=TARGET, state="success", alloc=MIG56),
        Wait("paused (not the leader (leadership lost before the write))"),
        switches=NOT_LEADER,
    ),
    Case(
        "advertising/old-resources/waits",
        rec(phase="advertising"),
        node(config=TARGET, state="success", alloc=WHOLE8),
        Wait(AWAITING_PLUGIN),
    ),
    Case(
        "advertising/past-deadline/rolls-back",
        rec(phase="advertising"),
        node(config=TARGET, state="success"),
        restoring(
            "rolled back: the device plugin did not advertise nvidia.com/mig-1g.10gb=56 within "
            "300s of success (allocatable: none)",
            now=LATE,
        ),
        now=LATE,
    ),
    Case(
        "advertising/dry-run/paused",
        rec(phase="advertising"),
        node(config=TARGET, state="success", alloc=MIG56),
        Wait("paused (dry-run)"),
        switches=DRY,
    ),
    # --- restoring ----------------------------------------------------------------------------
    Case(
        "restoring/pending/waits",
        rec(phase="restoring"),
        node(state="pending"),
        Wait("rolled back; waiting for the MIG manager to restore all-disabled (state pending)"),
    ),
    Case(
        "restoring/success-before-the-plugin/waits",
        rec(phase="restoring"),
        node(state="success"),
        Wait("rolled back; waiting for the MIG manager to restore all-disabled (state success)"),
    ),
    Case(
        "restoring/restored/uncordons",
        rec(phase="restoring"),
        node(state="success", alloc=WHOLE8),
        restore_end(
            "n1 is back at all-disabled; uncordoned",
            cordon=False,
            reason=("EbbtideMigRestored", "Normal"),
        ),
    ),
    Case(
        "restoring/restored-was-cordoned/stays-cordoned",
        rec(phase="restoring", was_cordoned=True),
        node(state="success", alloc=WHOLE8),
        restore_end(
            "n1 is back at all-disabled; left cordoned as it was before",
            cordon=True,
            reason=("EbbtideMigRestored", "Normal"),
        ),
    ),
    Case(
        "restoring/restored-under-kill-switch/waits",
        rec(phase="restoring"),
        node(state="success", alloc=WHOLE8),
        Wait("paused (kill)"),
        switches=KILL,
    ),
    Case(
        "restoring/failed/left-cordoned-for-an-operator",
        rec(phase="restoring"),
        node(state="failed"),
        restore_end(
            "the MIG manager did not restore all-disabled (reported failed); "
            "n1 left cordoned: check its GPUs, then uncordon it",
            cordon=True,
            reason=("EbbtideMigRestoreFailed", "Warning"),
        ),
    ),
    Case(
        "restoring/silent-past-deadline/left-cordoned-for-an-operator",
        rec(phase="restoring"),
        node(state="pending"),
        restore_end(
            "the MIG manager did not restore all-disabled (no success before the deadline); "
            "n1 left cordoned: check its GPUs, then uncordon it",
            cordon=True,
            reason=("EbbtideMigRestoreFailed", "Warning"),
        ),
        now=LATE,
    ),
    Case(
        "restoring/rebooting/extends-the-deadline",
        rec(phase="restoring"),
        node(state="rebooting"),
        Write(
            record_patch(rec(phase="restoring", rebooted=True, deadline=NOW + 1800)),
            Outcome.IN_PROGRESS,
            REBOOT,
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_next_step(case: Case) -> None:
    """The flow takes exactly the wanted step, and leaves its inputs as they were."""
    record, observed = copy.deepcopy(case.record), copy.deepcopy(case.node)
    got = next_step(
        record,
        observed,
        now=case.now,
        settings=MigFlowSettings(),
        switches=case.switches,
        drain_rule=RULE,
        pods=case.pods,
        drained=case.drained,
    )
    assert got == case.want
    assert (record, observed) == (case.record, case.node)


def test_the_table_covers_every_phase() -> None:
    """Every phase a record can hold has cases, so a new phase cannot go untested."""
    assert {c.id.split("/")[0] for c in CASES} >= set(get_args(Phase))
