"""Scale-down (slo-scale-down) and stale SLOs, end to end through the engine: the replicas a
quiet service gives back, when, by how much, and what a silent breach no longer blocks."""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from policy_fixtures import T0, WHOLE, feed_latency, make_policy, policy_dict, to_yaml, training

from policies.decisions import Decision, Scale
from policies.engine import Engine
from policies.loader import PolicyLoadError, load_policy_text
from policies.model import CrowdSpec, Policy
from policies.scaledown import Recommendations, step_limit
from policies.snapshot import Snapshot, SnapshotBuilder
from support.engine_probes import cooldown_remaining

DOWN = {"stabilization": "60s", "below": "50%", "maxStep": 1, "cooldown": "30s"}


def down_policy(*, down: dict[str, Any] | None = DOWN, min_replicas: int = 2, **slo: Any) -> Policy:
    """The base test policy (objective 100ms, window 30s, recoverAfter 20s, cooldown 30s) with
    chat's ``scale.down`` set to ``down`` (absent when ``None``)."""
    data = policy_dict()
    chat = data["spec"]["services"]["chat"]
    chat["replicas"] = {"min": min_replicas, "max": 10}
    chat["slo"].update(slo)
    if down is not None:
        chat["scale"]["down"] = copy.deepcopy(down)
    return load_policy_text(to_yaml(data), "test.yaml")


def chat_cluster(replicas: int) -> Snapshot:
    """Two whole nodes; chat with ``replicas`` on w0; elastic training (4, up to 8) on w1."""
    b = SnapshotBuilder()
    for name in ("w0", "w1"):
        b.node(name, gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=replicas, nodes=["w0"])
    training(b, "elastic", replicas=4, nodes=["w1"], min_replicas=1, max_replicas=8)
    return b.build()


@dataclass
class Trace:
    """What a drive saw: every decision with its offset, and chat's SLO state per tick."""

    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    states: list[tuple[float, str, float | None]] = field(default_factory=list)

    def downs(self) -> list[tuple[float, int, int]]:
        return [
            (t, d.from_replicas, d.to_replicas)
            for t, d in self.decisions
            if isinstance(d, Scale) and d.explanation.rule == "slo-scale-down"
        ]

    def rules(self) -> list[str]:
        return [d.explanation.rule for _, d in self.decisions]


def drive(
    engine: Engine, replicas: int, phases: list[tuple[float, float | None]], *, end: float
) -> Trace:
    """Phases of (seconds, latency ms or ``None`` for silence) at 20 requests/s, evaluated every
    second until ``end`` (offsets from T0); chat's replicas follow its scale decisions, as a
    cluster would."""
    trace = Trace()
    t, plan = 0.0, []
    for length, ms in phases:
        plan.append((t, t + length, ms))
        t += length
    for second in range(int(end)):
        for start, stop, ms in plan:
            if ms is not None and start <= second < stop:
                feed_latency(engine, T0 + second, T0 + second + 1, ms)
        now = T0 + second + 1
        for d in engine.evaluate(now, chat_cluster(replicas)):
            trace.decisions.append((now - T0, d))
            if isinstance(d, Scale) and d.workload == "serving/chat":
                replicas = d.to_replicas
        slo = engine.slo_state("serving/chat")
        trace.states.append((now - T0, slo.state, slo.since))
    return trace


@dataclass(frozen=True)
class DownCase:
    replicas: int
    phases: list[tuple[float, float | None]]
    end: float
    want: list[tuple[float, int, int]]
    down: dict[str, Any] | None = field(default_factory=lambda: dict(DOWN))
    min_replicas: int = 2


DOWN_CASES = {
    # 20ms is 20% of the objective: desired ceil(6 * 0.2) = 2. The window covers 60s at T0+61;
    # then one replica per 30s cooldown, down to replicas.min.
    "steady-low-latency-steps-down-to-min": DownCase(
        replicas=6,
        phases=[(400, 20.0)],
        end=400,
        want=[(61, 6, 5), (91, 5, 4), (121, 4, 3), (151, 3, 2)],
    ),
    "percent-step-removes-half": DownCase(
        replicas=8,
        phases=[(90, 20.0)],
        end=90,
        want=[(61, 8, 4)],
        down={**DOWN, "maxStep": "50%"},
    ),
    "percent-step-removes-at-least-one": DownCase(
        replicas=3,
        phases=[(70, 20.0)],
        end=70,
        want=[(61, 3, 2)],
        down={**DOWN, "maxStep": "10%"},
    ),
    # 60ms is above below (50ms): hold. A 45s dip to 20ms drops the 30s-window P99 below 50ms
    # from T0+119 (the window all dip) to T0+135; the highest recommendation over 60s is
    # still 6.
    "brief-dip-holds-through-stabilization": DownCase(
        replicas=6, phases=[(90, 60.0), (45, 20.0), (120, 60.0)], end=255, want=[]
    ),
    # The same dip without stabilization scales down: the dip did recommend fewer replicas.
    "same-dip-without-stabilization-scales-down": DownCase(
        replicas=6,
        phases=[(90, 60.0), (45, 20.0), (120, 60.0)],
        end=255,
        want=[(119, 6, 5)],
        down={**DOWN, "stabilization": "0s"},
    ),
    "at-min-replicas-nothing": DownCase(replicas=2, phases=[(200, 20.0)], end=200, want=[]),
    "no-down-block-never-scales-down": DownCase(
        replicas=6, phases=[(200, 20.0)], end=200, want=[], down=None
    ),
    # Silence gives no verdict: nothing is recommended, whatever the replicas.
    "silence-holds-replicas": DownCase(
        replicas=6, phases=[(30, 20.0), (600, None)], end=630, want=[]
    ),
}


@pytest.mark.parametrize("case", DOWN_CASES.values(), ids=DOWN_CASES.keys())
def test_scale_down(case: DownCase) -> None:
    """Scale-downs come when, and as far as, stabilization, steps and bounds allow."""
    engine = Engine(down_policy(down=case.down, min_replicas=case.min_replicas))
    trace = drive(engine, case.replicas, case.phases, end=case.end)
    assert trace.downs() == case.want


def test_ratchet_regression_replicas_come_back_down_after_a_breach() -> None:
    """Regression (the ratchet): a breach scales chat up; once it is fast again for long enough
    it gives the replicas back, one step per cooldown, to replicas.min."""
    engine = Engine(down_policy())
    trace = drive(engine, 2, [(20, 500.0), (600, 20.0)], end=620)
    ups = [
        (t, d.from_replicas, d.to_replicas)
        for t, d in trace.decisions
        if isinstance(d, Scale) and d.explanation.rule == "slo-breach-scale-up"
    ]
    assert ups
    assert ups[0][2] > 2
    downs = trace.downs()
    assert downs, "replicas never came back down"
    assert downs[-1][2] == 2
    assert all(b - a >= 30 for (a, _, _), (b, _, _) in itertools.pairwise(downs))


def test_no_scale_down_while_breaching_recovering_or_within_recover_after() -> None:
    """Every scale-down comes in ok, at least recoverAfter after entering it and a whole
    stabilization window after the last tick that was not ok."""
    engine = Engine(down_policy())
    trace = drive(engine, 6, [(20, 500.0), (600, 20.0)], end=620)
    state_at = {t: (s, since) for t, s, since in trace.states}
    last_not_ok = max(t for t, s, _ in trace.states if s != "ok")
    downs = trace.downs()
    assert downs
    for t, _, _ in downs:
        state, since = state_at[t]
        assert state == "ok"
        assert since is not None
        assert t - (since - T0) >= 20
        assert t - last_not_ok >= 60  # stabilization


def test_scale_down_explains_itself() -> None:
    """The decision names its rule, the service as cause, inputs and thresholds, and the
    options the stabilization window and step limit rejected."""
    engine = Engine(down_policy())
    trace = drive(engine, 6, [(70, 20.0)], end=70)
    ((_, d),) = [(t, d) for t, d in trace.decisions if d.target == "serving/chat"]
    assert isinstance(d, Scale)
    assert (d.role, d.cause, d.from_replicas, d.to_replicas) == (
        "inference",
        "serving/chat",
        6,
        5,
    )
    exp = d.explanation
    assert exp.rule == "slo-scale-down"
    assert exp.inputs["replicas"] == 6
    assert exp.inputs["desired"] == 2
    assert exp.inputs["stabilized"] == 2
    assert exp.thresholds["below"] == "50%"
    assert exp.thresholds["stabilization"] == "1m"
    assert exp.thresholds["min_replicas"] == 2
    assert [a.option for a in exp.alternatives] == ["scale to 2"]
    assert "maxStep 1" in exp.alternatives[0].why_not


def test_scale_down_spends_a_scale_step() -> None:
    """A scale-down is budgeted like any scale decision; none when the budget is spent."""
    data = policy_dict(budgets={"scaleSteps": {"max": 1, "per": "1h"}})
    data["spec"]["services"]["chat"]["replicas"] = {"min": 2, "max": 10}
    data["spec"]["services"]["chat"]["scale"]["down"] = dict(DOWN)
    engine = Engine(load_policy_text(to_yaml(data), "test.yaml"))
    trace = drive(engine, 6, [(200, 20.0)], end=200)
    assert trace.downs() == [(61, 6, 5)]


def test_scale_down_waits_a_window_after_the_kill_switch() -> None:
    """With the kill switch on nothing is recommended; lifted, the window starts again."""
    data = policy_dict(killSwitch=True)
    data["spec"]["services"]["chat"]["replicas"] = {"min": 2, "max": 10}
    data["spec"]["services"]["chat"]["scale"]["down"] = dict(DOWN)
    killed = load_policy_text(to_yaml(data), "test.yaml")
    engine = Engine(killed)
    drive(engine, 6, [(120, 20.0)], end=120)
    engine.reload(down_policy())
    downs = []
    for t in range(121, 200):
        feed_latency(engine, T0 + t - 1, T0 + t, 20.0)
        rules = [d.explanation.rule for d in engine.evaluate(T0 + t, chat_cluster(6))]
        downs += [t] * rules.count("slo-scale-down")
    assert downs[0] == 181


RECS = {
    "highest-in-window": ([(0, 3), (10, 5), (20, 2)], 25, 30, 5),
    "older-than-window-forgotten": ([(0, 9), (10, 5), (20, 2)], 35, 30, 5),
    "latest-only": ([(0, 9), (10, 5), (20, 2)], 45, 30, 2),
    "equal-values-keep-the-newest": ([(0, 4), (10, 4)], 35, 30, 4),
}


@pytest.mark.parametrize(("adds", "now", "window", "want"), RECS.values(), ids=RECS.keys())
def test_recommendations_highest(
    adds: list[tuple[float, int]], now: float, window: float, want: int
) -> None:
    """The sliding maximum is the highest recommendation made within the window."""
    recs = Recommendations()
    for t, v in adds:
        recs.add(t, v, window_s=100)
    assert recs.highest(now, window) == want


STEPS = {
    "replicas": (2, 10, 2),
    "percent": (0.25, 10, 2),
    "percent-at-least-one": (0.1, 3, 1),
    "whole": (1.0, 7, 7),
}


@pytest.mark.parametrize(("max_step", "replicas", "want"), STEPS.values(), ids=STEPS.keys())
def test_step_limit(max_step: int | float, replicas: int, want: int) -> None:
    """maxStep is a number of replicas, or a percentage of the current ones (at least one)."""
    assert step_limit(max_step, replicas) == want


# -- stale: no verdict is not a breach ------------------------------------------------------


def test_stale_breach_regression_training_grows_back() -> None:
    """Regression: a breaching service whose traffic stops becomes stale after staleAfter
    (default 5m) and no longer blocks training growth in its pool."""
    engine = Engine(make_policy())
    trace = drive(engine, 1, [(20, 500.0)], end=500)
    states = {t: s for t, s, _ in trace.states}
    assert states[15] == "breaching"
    stale_at = next(t for t, s, _ in trace.states if s == "stale")
    # the last requests (second 19) leave the 30s window at T0+49; 5m without a verdict
    assert stale_at == 49 + 300
    grows = [t for t, d in trace.decisions if d.explanation.rule == "grow-training"]
    assert grows, "training never grew back"
    assert grows[0] == stale_at + 60  # growAfter 60s from the first tick not blocked


def test_stale_service_triggers_no_scale_up_or_down() -> None:
    """A stale service is neither scaled up nor down (it has replicas above min to give)."""
    engine = Engine(down_policy())
    trace = drive(engine, 6, [(20, 500.0)], end=500)
    assert any(d.explanation.rule == "slo-breach-scale-up" for _, d in trace.decisions)
    stale_at = next(t for t, s, _ in trace.states if s == "stale")
    late = [d for t, d in trace.decisions if t >= stale_at and d.target == "serving/chat"]
    assert late == []


def test_stale_breaches_again_only_after_breach_after() -> None:
    """Traffic back after a stale spell is judged afresh: slow again, it breaches after
    breachAfter (10s), not at once."""
    engine = Engine(make_policy())
    trace = drive(engine, 1, [(20, 500.0), (340, None), (40, 500.0)], end=400)
    after = [(t, s) for t, s, _ in trace.states if t > 360]
    assert after[0][1] == "ok"
    first_breach = next(t for t, s in after if s == "breaching")
    assert first_breach == 361 + 10


def test_scale_down_starts_the_service_cooldown() -> None:
    """A scale-down starts the service's cooldown, as reading its record back would."""
    engine = Engine(down_policy())
    drive(engine, 6, [(61, 20.0)], end=61)
    assert cooldown_remaining(engine, "serving/chat", T0 + 61) == 30.0


STEP_TEXT = {
    "replicas": (2, 2),
    "percent": ("25%", 0.25),
    "all": ("100%", 1.0),
    "zero-replicas": (0, "at least 1 replica"),
    "zero-percent": ("0%", "above 0% and at most 100%"),
    "over-100-percent": ("150%", "at most 100%; got 150%"),
    "bare-fraction": (0.5, "a number of replicas (e.g. 1) or a percentage"),
    "bool": (True, "a number of replicas (e.g. 1) or a percentage"),
}


@pytest.mark.parametrize(("value", "want"), STEP_TEXT.values(), ids=STEP_TEXT.keys())
def test_down_max_step_is_replicas_or_percent(value: object, want: object) -> None:
    """scale.down.maxStep takes a replica count or a percentage, and says so when it is neither."""
    data = policy_dict()
    data["spec"]["services"]["chat"]["scale"]["down"] = {"maxStep": value}
    if isinstance(want, str):
        with pytest.raises(PolicyLoadError, match=re.escape(want)):
            load_policy_text(to_yaml(data), "test.yaml")
        return
    policy = load_policy_text(to_yaml(data), "test.yaml")
    down = policy.spec.services["chat"].scale.down  # type: ignore[union-attr]
    assert down is not None
    assert down.max_step == want
    assert type(down.max_step) is type(want)


# -- crowds: a flash crowd's replicas go back soon after it -----------------------------------

CROWD = {**DOWN, "crowd": {"after": "10s", "memory": "10m"}}
#: 150s fast at 2 replicas (two windows of history), a 20s breach, then fast again
CROWD_PHASES: list[tuple[float, float | None]] = [(150, 20.0), (20, 500.0), (400, 20.0)]


def test_a_crowds_replicas_go_back_at_once_after_crowd_after() -> None:
    """The breach takes chat from 2 to 10, a level it had not needed: 10s after its last
    recommendation of 10 (and recoverAfter after it is ok) all eight go back in one step,
    where the plain stabilization gives one back a minute after the breach, then one a
    cooldown. Fails without ``down.crowd``."""
    plain = drive(Engine(down_policy()), 2, CROWD_PHASES, end=570)
    crowd = drive(Engine(down_policy(down=CROWD)), 2, CROWD_PHASES, end=570)
    last_not_ok = max(t for t, s, _ in crowd.states if s != "ok")
    assert plain.downs()[0] == (279, 10, 9)
    assert len(plain.downs()) == 8
    ((at, frm, to),) = crowd.downs()
    assert (frm, to) == (10, 2)
    assert last_not_ok + 20 <= at < 279


def test_a_crowd_explains_the_step_it_skipped() -> None:
    """The give-back says the crowd's level was held only crowd.after, and names the paced
    step it did not take."""
    trace = drive(Engine(down_policy(down=CROWD)), 2, CROWD_PHASES, end=570)
    ((_, d),) = [(t, d) for t, d in trace.decisions if d.explanation.rule == "slo-scale-down"]
    exp = d.explanation
    assert "a crowd's replicas go at once" in exp.reason
    assert exp.inputs["needed_before"] == 2
    assert any(a.option == "scale to 9" and "not a crowd's" in a.why_not for a in exp.alternatives)


def _recs(crowd: CrowdSpec, feed: list[tuple[int, int, int]]) -> Recommendations:
    """Recommendations fed every second: ``(from, to, replicas)`` spans, ``to`` excluded."""
    recs = Recommendations()
    for start, stop, replicas in feed:
        for t in range(start, stop):
            recs.add(float(t), replicas, window_s=60.0, crowd=crowd)
    return recs


SPEC = CrowdSpec.model_validate({"after": "10s", "memory": "10m"})


def test_a_crowd_level_is_held_only_crowd_after() -> None:
    """A level above every one of the minutes before the window (6 after 2s) leaves the
    stabilized count 10s after its last recommendation; without a crowd spec the whole
    window holds it."""
    recs = _recs(SPEC, [(0, 200, 2), (200, 220, 6), (220, 236, 2)])
    assert recs.highest(228.0, 60.0, SPEC) == 6
    assert recs.highest(235.0, 60.0, SPEC) == 2
    assert (recs.crowd(235.0, 60.0), recs.before(), recs.needed(235.0, 60.0)) == (6, 2, 2)
    plain = Recommendations()
    for t, replicas in [(t, 2) for t in range(200)] + [(t, 6) for t in range(200, 220)]:
        plain.add(float(t), replicas, window_s=60.0)
    assert plain.highest(235.0, 60.0) == 6


def test_a_level_needed_before_holds_the_whole_window() -> None:
    """6 again at 400s, within memory of the crowd at 200s and more than a window after it:
    a level needed before, held for the whole window."""
    recs = _recs(SPEC, [(0, 200, 2), (200, 220, 6), (220, 400, 2), (400, 410, 6), (410, 441, 2)])
    assert recs.highest(440.0, 60.0, SPEC) == 6
    assert recs.crowd(440.0, 60.0) is None


def test_too_little_history_calls_nothing_new() -> None:
    """With less than two windows of recommendations no level is a crowd's."""
    recs = _recs(SPEC, [(0, 60, 2), (60, 70, 6), (70, 101, 2)])
    assert recs.highest(100.0, 60.0, SPEC) == 6
    assert recs.crowd(100.0, 60.0) is None


def test_a_crowd_longer_than_the_window_becomes_a_level_needed_before() -> None:
    """Once its first minute is a window old, the crowd's level is one needed before."""
    recs = _recs(SPEC, [(0, 200, 2), (200, 301, 6), (301, 331, 2)])
    assert recs.highest(330.0, 60.0, SPEC) == 6


def test_memory_forgets_a_level() -> None:
    """A level needed more than ``memory`` ago is new again."""
    short = CrowdSpec.model_validate({"after": "10s", "memory": "3m"})
    recs = _recs(short, [(0, 200, 2), (200, 220, 6), (220, 600, 2), (600, 610, 6), (610, 641, 2)])
    assert recs.highest(640.0, 60.0, short) == 2


def test_a_hold_records_what_ticks_would() -> None:
    """An engine that skipped quiet ticks and calls :meth:`Recommendations.hold` ends where
    one that recorded every tick does: same counts, same levels needed before, no restart of
    the history (a hold is ticks all along)."""
    ticked = _recs(SPEC, [(0, 200, 2), (200, 500, 3)])
    held = _recs(SPEC, [(0, 200, 2), (200, 201, 3)])
    held.hold(499.0, window_s=60.0, crowd=SPEC)
    for t, replicas in [(500, 6), (501, 2)]:
        for r in (ticked, held):
            r.add(float(t), replicas, window_s=60.0, crowd=SPEC)
    for now in (505.0, 515.0, 540.0):
        assert held.highest(now, 60.0, SPEC) == ticked.highest(now, 60.0, SPEC)
        assert held.crowd(now, 60.0) == ticked.crowd(now, 60.0) == 6
        assert held.before() == ticked.before() == 3


def test_crowd_must_fit_the_stabilization() -> None:
    """crowd.after shorter than the stabilization; memory longer than two windows."""
    with pytest.raises(PolicyLoadError, match=r"crowd\.after must be shorter"):
        down_policy(down={**DOWN, "crowd": {"after": "60s"}})
    with pytest.raises(PolicyLoadError, match=r"crowd\.memory must be longer"):
        down_policy(down={**DOWN, "crowd": {"after": "10s", "memory": "2m"}})


# -- training takes what a scale-down gave back -----------------------------------------------


def test_training_grows_into_a_scaled_down_replicas_gpu_at_once() -> None:
    """One full node: chat 6, training 2. Chat's stabilized scale-down at 61s frees a GPU; the
    training grows into it on the next evaluation, not growAfter (60s) later: the
    stabilization already waited longer. Fails when growAfter applies to it."""
    engine = Engine(down_policy())
    chat, train, grows = 6, 2, []
    for second in range(90):
        feed_latency(engine, T0 + second, T0 + second + 1, 20.0)
        b = SnapshotBuilder()
        b.node("w0", gpus=8, labels=WHOLE)
        b.workload("serving", "chat", replicas=chat, nodes=["w0"])
        training(b, "elastic", replicas=train, nodes=["w0"], min_replicas=1, max_replicas=8)
        now = T0 + second + 1
        for d in engine.evaluate(now, b.build()):
            if isinstance(d, Scale) and d.workload == "serving/chat":
                chat = d.to_replicas
            elif isinstance(d, Scale) and d.explanation.rule == "grow-training":
                train = d.to_replicas
                grows.append((now - T0, d))
    assert chat == 5
    ((at, grow),) = grows
    assert at == 62
    assert "given back by a service's scale-down" in grow.explanation.reason
    assert grow.explanation.inputs["given_back_s"] == 1.0


def test_a_scale_down_not_carried_out_gave_nothing_back() -> None:
    """A scale-down refused by the cluster freed no GPU: its mark is taken back, so GPUs that
    go free for another reason wait growAfter. Fails when not_done keeps the mark."""
    engine = Engine(down_policy())
    trace = drive(engine, 6, [(70, 20.0)], end=70)
    ((_, down),) = [(t, d) for t, d in trace.decisions if d.target == "serving/chat"]
    assert engine._decide.cooldowns.last("gave-back:whole") == down.at
    engine.not_done(down, reason="the API server refused it")
    assert engine._decide.cooldowns.last("gave-back:whole") is None


def test_a_reload_that_turns_crowds_on_waits_two_windows_of_levels() -> None:
    """Kept across a reload without the crowd spec, the history has no levels: nothing is a
    crowd's until two windows of them are kept (else every level would be new)."""
    recs = Recommendations()
    for t in range(300):
        recs.add(float(t), 2, window_s=60.0)
    for t in range(300, 330):
        recs.add(float(t), 6 if t < 310 else 2, window_s=60.0, crowd=SPEC)
    assert recs.crowd(330.0, 60.0) is None
    assert recs.highest(330.0, 60.0, SPEC) == 6


def test_a_reload_that_turns_crowds_off_counts_a_crowds_level_again() -> None:
    """Without the crowd spec every recommendation counts for the whole window, the crowd's
    kept beside the others included."""
    recs = _recs(SPEC, [(0, 200, 2), (200, 220, 6), (220, 236, 2)])
    assert recs.highest(235.0, 60.0, SPEC) == 2
    recs.add(236.0, 2, window_s=60.0)
    assert recs.highest(236.0, 60.0) == 6
    assert recs.highest(281.0, 60.0) == 2
