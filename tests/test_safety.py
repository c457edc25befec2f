"""The safety gate: table tests of its pure target checks, its ledger and in-flight set, and a
property test that no interleaving of actions can overspend a budget."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.loop.gate import SafetyGate, Target, flight_key, target_refusal
from controller.loop.port import Outcome
from policies.budgets import Ledger
from policies.decisions import Decision, Evict, Explanation, MigConvert, MigRevert, Scale
from policies.model import Policy

TRAINING = {"ebbtide.io/class": "training"}
WHOLE = {"ebbtide.io/pool": "whole"}
MIG = {"ebbtide.io/pool": "mig"}
WHY = Explanation.of("test-rule", "because")


def policy(**spec: Any) -> Policy:
    """A valid policy: pools whole/mig, one scaled service, training, MIG; ``spec`` overrides."""
    body: dict[str, Any] = {
        "protectedNamespaces": ["kube-system"],
        "pools": {
            "whole": {"nodeSelector": dict(WHOLE), "kind": "whole"},
            "mig": {"nodeSelector": dict(MIG), "kind": "mig"},
        },
        "services": {
            "chat": {
                "namespace": "serving",
                "pool": "whole",
                "replicas": {"min": 1, "max": 8},
                "slo": {"percentile": 99, "objectiveMs": 100},
                "scale": {},
            }
        },
        "training": {"selector": dict(TRAINING)},
        "mig": {
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "profiles": {"A100-80GB": "all-1g.10gb"},
            "revertAfter": "2m",
        },
        "budgets": {
            "evictions": {"max": 3, "per": "10m"},
            "scaleSteps": {"max": 5, "per": "10m"},
            "migConversions": {"max": 1, "per": "1h"},
        },
    }
    for key, value in spec.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return Policy.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "t"},
            "spec": body,
        }
    )


def scale(workload: str = "ml/train", *, role: Any = "training", dry_run: bool = False) -> Scale:
    return Scale(0.0, workload, "Deployment", 4, 2, role, WHY, dry_run=dry_run)


def infer(workload: str) -> Scale:
    return Scale(0.0, workload, "Deployment", 2, 4, "inference", WHY)


def evict(pod: str = "ml/train-0", *, dry_run: bool = False) -> Evict:
    return Evict(0.0, pod, "gpu-1", "ml/train", 30.0, WHY, dry_run=dry_run)


def convert(node: str = "gpu-1") -> MigConvert:
    return MigConvert(0.0, node, "all-1g.10gb", "A100-80GB", WHY)


def revert(node: str = "gpu-1") -> MigRevert:
    return MigRevert(0.0, node, "all-1g.10gb", WHY)


def pod(ns: str = "ml", labels: Any = TRAINING, annotations: Any = None) -> Target:
    return Target("Pod", "train-0", ns, dict(labels), dict(annotations or {}))


def workload(
    ns: str = "ml", name: str = "train", labels: Any = TRAINING, annotations: Any = None
) -> Target:
    return Target("Deployment", name, ns, dict(labels), dict(annotations or {}))


def node(labels: Any = WHOLE, annotations: Any = None) -> Target:
    return Target("Node", "gpu-1", None, dict(labels), dict(annotations or {}))


DND_KEY = "ebbtide.io/do-not-disrupt"
DND = {DND_KEY: "true"}
KARPENTER_DND = {"karpenter.sh/do-not-disrupt": "true"}
KARPENTER_OFF = {"karpenter.sh/do-not-disrupt": "false"}

CASES: list[tuple[str, Decision, Target, str | None]] = [
    ("scale-training", scale(), workload(), None),
    ("scale-outside-selector", scale(), workload(labels={"app": "x"}), "training selector"),
    ("scale-protected-ns", scale(), workload(ns="kube-system"), "namespace kube-system"),
    ("scale-do-not-disrupt", scale(), workload(annotations=DND), "do-not-disrupt"),
    ("scale-inference", infer("serving/chat"), workload("serving", "chat", {}), None),
    ("scale-not-a-service", infer("serving/x"), workload("serving", "x", {}), "inference service"),
    ("evict-training", evict(), pod(), None),
    ("evict-outside-selector", evict(), pod(labels={"app": "web"}), "training selector"),
    ("evict-protected-ns", evict(), pod(ns="kube-system"), "namespace kube-system is protected"),
    ("evict-do-not-disrupt", evict(), pod(annotations=DND), "do-not-disrupt"),
    ("evict-do-not-disrupt-false", evict(), pod(annotations={DND_KEY: "False"}), None),
    ("convert-whole-node", convert(), node(), None),
    ("convert-mig-node", convert(), node(MIG), "not in pool whole"),
    ("convert-do-not-disrupt-node", convert(), node(annotations=DND), "do-not-disrupt"),
    ("convert-karpenter-node", convert(), node(annotations=KARPENTER_DND), "karpenter.sh/"),
    ("convert-karpenter-false", convert(), node(annotations=KARPENTER_OFF), None),
    ("revert-mig-node", revert(), node(MIG), None),
    ("revert-whole-node", revert(), node(), "not in pool mig"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "target", "refusal"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_target_refusal_table(decision: Decision, target: Target, refusal: str | None) -> None:
    """Selectors, protected namespaces and do-not-disrupt decide, and the inputs stay unchanged."""
    p = policy()
    before = (copy.deepcopy(dict(target.labels)), copy.deepcopy(dict(target.annotations)))
    got = target_refusal(p, decision, target)
    if refusal is None:
        assert got is None
    else:
        assert got is not None
        assert refusal in got
    assert (dict(target.labels), dict(target.annotations)) == before


@pytest.mark.parametrize(
    ("spec", "decision", "target", "refusal"),
    [
        ({"training": None}, evict(), pod(), "selects no training"),
        ({"mig": None}, convert(), node(), "not enabled"),
    ],
    ids=["no-training-section", "no-mig-section"],
)
def test_missing_policy_sections_refuse(
    spec: dict[str, Any], decision: Decision, target: Target, refusal: str
) -> None:
    """Without a training (or MIG) section nothing is evicted (or converted)."""
    got = target_refusal(policy(**spec), decision, target)
    assert got is not None
    assert refusal in got


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_not_leader_and_kill_switch_refuse_before_anything() -> None:
    """A follower, a process kill switch and a policy kill switch all refuse, leader first."""
    leading = [False]
    gate = SafetyGate(policy(), is_leader=lambda: leading[0], kill_switch=True)
    assert gate.screen(evict()).reason == "not the leader"
    leading[0] = True
    assert gate.screen(evict()).outcome is Outcome.REFUSED
    assert "kill switch" in gate.screen(evict()).reason
    gate.kill_switch = False
    assert gate.screen(evict()).ok
    gate.reconfigure(policy(killSwitch=True))
    assert "killSwitch" in gate.screen(evict()).reason
    assert not gate.check_write().ok


@pytest.mark.parametrize(
    ("process", "spec", "decision", "expected"),
    [
        (False, {}, evict(), False),
        (True, {}, evict(), True),
        (False, {"dryRun": True}, evict(), True),
        (False, {}, evict(dry_run=True), True),
    ],
    ids=["live", "process-flag", "policy-dryRun", "decision-dry_run"],
)
def test_dry_run_sources(
    process: bool, spec: dict[str, Any], decision: Decision, expected: bool
) -> None:
    """Any of the three dry-run sources makes a decision report-only."""
    assert SafetyGate(policy(**spec), dry_run=process).dry_run_for(decision) is expected


def test_in_flight_target_is_never_claimed_twice() -> None:
    """A second hold on the same target is IN_PROGRESS until the first ends; others proceed."""
    gate = SafetyGate(policy())
    with gate.hold(evict()) as first:
        assert first.ok
        with gate.hold(evict()) as again, gate.hold(evict("ml/other")) as other:
            assert again.verdict.outcome is Outcome.IN_PROGRESS
            assert other.ok
        assert gate.in_flight() == {flight_key(evict())}
    assert gate.in_flight() == frozenset()
    with gate.hold(evict()) as later:
        assert later.ok


def test_budget_reserved_while_in_flight_spent_only_when_applied() -> None:
    """Reservations count against the budget; released ones cost nothing; spent ones slide out."""
    clock = Clock()
    gate = SafetyGate(policy(), clock=clock)
    pods = [evict(f"ml/p{i}") for i in range(5)]
    with gate.hold(pods[0]) as a, gate.hold(pods[1]) as b, gate.hold(pods[2]) as c:
        assert [p.reserve().ok for p in (a, b, c)] == [True, True, True]
        with gate.hold(pods[3]) as d:
            assert "evictions budget spent" in d.reserve().reason
        a.spend()
        b.spend()
    assert gate.budgets.evictions.used(clock.now) == 2
    with gate.hold(pods[3]) as d:
        assert d.reserve().ok  # c was released without spending
        d.spend()
    with gate.hold(pods[4]) as e:
        assert not e.reserve().ok
    clock.now += 601
    with gate.hold(pods[4]) as e:
        assert e.reserve().ok


def test_reconfigure_keeps_what_was_spent() -> None:
    """A reloaded policy's lower limit applies to what the old one already spent."""
    clock = Clock()
    gate = SafetyGate(policy(), clock=clock)
    for i in range(2):
        with gate.hold(evict(f"ml/p{i}")) as permit:
            assert permit.reserve().ok
            permit.spend()
    budgets = {"evictions": {"max": 2, "per": "10m"}}
    gate.reconfigure(policy(budgets=budgets))
    with gate.hold(evict("ml/p9")) as permit:
        assert not permit.reserve().ok


# --- property: no interleaving overspends --------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.integers(0, 7)),
        st.tuples(st.just("close"), st.integers(0, 7), st.sampled_from(["applied", "refused"])),
        st.tuples(st.just("tick"), st.floats(0, 400)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, limit=st.integers(0, 4))
def test_budget_never_exceeded_by_any_interleaving(ops: list[Any], limit: int) -> None:
    """However evictions overlap, fail or succeed, applied ones never exceed max per window."""
    clock = Clock()
    gate = SafetyGate(policy(budgets={"evictions": {"max": limit, "per": "10m"}}), clock=clock)
    open_: dict[int, Any] = {}
    applied: list[float] = []
    for op in ops:
        if op[0] == "tick":
            clock.now += op[1]
        elif op[0] == "open" and op[1] not in open_:
            cm = gate.hold(evict(f"ml/p{op[1]}"))
            permit = cm.__enter__()
            if permit.ok and permit.reserve().ok:
                open_[op[1]] = (cm, permit)
            else:
                cm.__exit__(None, None, None)
        elif op[0] == "close" and op[1] in open_:
            cm, permit = open_.pop(op[1])
            if op[2] == "applied":
                permit.spend()
                applied.append(clock.now)
            cm.__exit__(None, None, None)
        in_window = [t for t in applied if t > clock.now - 600]
        assert len(in_window) + len(open_) <= limit
    for t in applied:
        assert sum(1 for u in applied if t - 600 < u <= t) <= limit


def test_the_gate_refuses_to_repeat_a_decision_already_carried_out() -> None:
    """A decision id settled as done is never applied a second time."""
    p = policy()
    ledger = Ledger(p.spec.budgets)
    gate = SafetyGate(p, clock=lambda: 1000.0, ledger=ledger)
    d = MigConvert(1000.0, "w0", "all-1g.10gb", "A100-80GB", WHY)
    with gate.hold(d) as permit:
        assert permit.reserve().ok
        permit.spend()
    with gate.hold(d) as permit:
        verdict = permit.reserve()
    assert verdict.outcome is Outcome.ALREADY_DONE
    assert ledger.budgets.mig_conversions.used(1000.0) == 1
