"""The incremental tick decides exactly what ticking everything decides.

``Engine(policy)`` ticks only the services and pool rules that changed or whose timers ran out;
``Engine(policy, incremental=False)`` ticks everything, every time (the engine before issue 16).
Each test drives both in lockstep with the same events, snapshots, feedback and reloads and
compares every tick's decisions and every SLO state; the targeted tests also check that the
time-driven transition they name fires on a quiet tick (no event since the tick before).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from policy_fixtures import BASE, T0, TRAINING, WHOLE, latency, make_policy, training, util

from controller.offline.replay import replayer as runner
from controller.offline.replay.replayer import DECISIONS_FILE, ReplaySettings, replay
from controller.simcluster import SimCluster
from policies.decisions import Decision, decision_to_dict
from policies.engine import Engine
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder
from policies.windows import LatencyWindow
from replay.replay_builders import write_recording
from streams.events import Event, InferenceLatency
from support.engine_probes import last_stepped

MIG = {"ebbtide.io/pool": "mig"}


def services() -> dict[str, Any]:
    """Three services: chat (scales up and down), search (short window, down), embed (no
    scale target: frees its pending pods' GPUs)."""
    chat = dict(BASE["spec"]["services"]["chat"])
    chat["slo"] = dict(chat["slo"], staleAfter="90s")
    chat["scale"] = {
        "tolerance": "10%",
        "maxStep": 2,
        "down": {"below": "50%", "stabilization": "2m", "maxStep": 1, "cooldown": "40s"},
    }
    search = {
        "namespace": "serving",
        "pool": "whole",
        "replicas": {"min": 1, "max": 6},
        "slo": {
            "percentile": 95,
            "objectiveMs": 80,
            "window": "1m",
            "resolution": "5s",
            "breachAfter": "15s",
            "recoverAfter": "30s",
            "staleAfter": "2m",
            "minSamples": 5,
        },
        "scale": {"down": {"below": "60%", "stabilization": "3m"}},
    }
    embed = {
        "namespace": "serving",
        "pool": "whole",
        "slo": {"percentile": 99, "objectiveMs": 150, "window": "2m", "resolution": "10s"},
    }
    return {"chat": chat, "search": search, "embed": embed}


def policy(**overrides: Any) -> Policy:
    return make_policy(services=services(), **overrides)


def snapshot(variant: int) -> Snapshot:
    """Four whole nodes and a MIG node: chat, search and embed serving; elastic training on w1;
    w2 and w3 idle (MIG converts them, training grows into them). Variants move replicas and
    pending pods about."""
    b = SnapshotBuilder()
    for i in range(4):
        b.node(f"w{i}", gpus=8, labels=WHOLE)
    b.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=(3, 2, 4, 3)[variant], nodes=["w0"])
    b.workload("serving", "search", replicas=(2, 3, 2, 1)[variant], nodes=["w0"])
    training(
        b,
        "elastic",
        replicas=(6, 4, 6, 8)[variant],
        nodes=["w1"],
        min_replicas=2,
        max_replicas=8,
        priority=50,
    )
    if variant == 3:
        b.pod("serving", "embed-0", gpus=1, workload="serving/embed")
        b.pod("ml", "whole-job", gpus=8, labels=TRAINING)
    return b.build()


class Lockstep:
    """An incremental engine and a full one fed the same inputs; every output compared."""

    def __init__(self, p: Policy) -> None:
        self.inc = Engine(p)
        self.full = Engine(p, incremental=False)
        self.keys = [f"serving/{name}" for name in sorted(p.spec.services)]
        self.quiet_since_tick = True
        self.decided: list[tuple[float, bool, list[dict[str, Any]]]] = []

    def observe(self, events: Sequence[Event]) -> None:
        for e in events:
            assert self.inc.observe(e) == self.full.observe(e)
        if events:
            self.quiet_since_tick = False

    def evaluate(self, now: float, snap: Snapshot) -> list[Decision]:
        got = self.inc.evaluate(now, snap)
        want = self.full.evaluate(now, snap)
        assert [decision_to_dict(d) for d in got] == [decision_to_dict(d) for d in want], now
        for key in self.keys:
            assert self.inc.slo_state(key) == self.full.slo_state(key), (now, key)
        if got:
            self.decided.append((now, self.quiet_since_tick, [decision_to_dict(d) for d in got]))
        self.quiet_since_tick = True
        return got

    def reload(self, p: Policy) -> None:
        assert self.inc.reload(p).accepted
        assert self.full.reload(p).accepted

    def not_done(self, d: Decision, **kw: Any) -> None:
        self.inc.not_done(d, **kw)
        self.full.not_done(d, **kw)

    def first(self, rule: str) -> tuple[float, bool]:
        """When a decision of ``rule`` was first taken, and whether on a quiet tick."""
        for now, quiet, ds in self.decided:
            if any(d["rule"] == rule for d in ds):
                return now, quiet
        raise AssertionError(f"no {rule} decision in {self.decided}")


def samples(rnd: random.Random, ts: float, service: str, mean: float) -> InferenceLatency:
    values = [max(0.0, rnd.gauss(mean, mean / 5)) for _ in range(rnd.randint(1, 12))]
    return InferenceLatency(ts=ts, service=service, namespace="serving", samples_ms=values)


def leading_services(
    rate: float | str = 2.0, cooldown: str = "10s", *, headroom: bool = False
) -> dict[str, Any]:
    """:func:`services` with chat scaling on its request rate too (``rate`` requests/s a
    replica, or ``learn``), one replica a step, with a ``cooldown`` shorter than its 30s window,
    so the rate is still read when the cooldown ends."""
    out = services()
    chat = dict(out["chat"])
    lead: dict[str, Any] = {"learn": True} if rate == "learn" else {"ratePerReplica": rate}
    lead["headroom"] = headroom
    chat["scale"] = dict(chat["scale"], maxStep=1, leading=lead)
    chat["cooldown"] = cooldown
    out["chat"] = chat
    return out


@pytest.mark.parametrize(
    ("seed", "leading"),
    [(1, None), (2, None), (3, None), (7, 2.0), (8, 2.0), (9, "learn"), (10, "learn")],
)
def test_random_stream_with_quiet_stretches_decides_as_ticking_everything(
    seed: int, leading: float | str | None
) -> None:
    """Three hours of regimes (silence, one event a minute, steady, slow, fast) per service,
    utilization with silent nodes, snapshot changes (and equal rebuilds), refused decisions,
    irregular tick gaps, a kill switch and reloads: the same decisions, tick by tick. With
    ``leading``, chat also scales on its request rate (a rule that may act at any tick), at a
    set rate per replica or a learned one with headroom (learned from the windows it ticks)."""
    rnd = random.Random(seed)
    extra = (
        {"services": leading_services(leading, headroom=leading == "learn")}
        if leading is not None
        else {}
    )

    def policy(**overrides: Any) -> Policy:
        return make_policy(**{"services": services(), **extra, **overrides})

    p = policy()
    both = Lockstep(p)
    objective = {"chat": 100.0, "search": 80.0, "embed": 150.0}
    regimes = ("silent", "sparse", "steady", "slow", "fast", "fast")
    regime = {name: "steady" for name in objective}
    variant, snap = 0, snapshot(0)
    now = T0
    end = T0 + 3 * 3600
    killed_at = T0 + rnd.uniform(3600, 7200)
    while now < end:
        step = rnd.choice([1.0] * 60 + [3.0, 7.0, 45.0, 200.0])
        for t in [now + k for k in range(int(step))]:
            events: list[Event] = []
            for name in objective:
                if rnd.random() < 1 / 300:
                    regime[name] = rnd.choice(regimes)
                r = regime[name]
                if r == "silent" or (r == "sparse" and int(t) % 60 != 0):
                    continue
                mean = {"slow": 3.0, "fast": 0.2}.get(r, 0.6) * objective[name]
                events.append(samples(rnd, t + rnd.random(), name, mean))
            if int(t) % 30 == 0:
                for n, base in (("w0", 15.0), ("w1", 25.0), ("w2", 1.0), ("w3", 2.0)):
                    if n == "w3" and (t - T0) % 5400 > 4000:
                        continue  # w3 goes silent for a while: not idle, unknown
                    events.extend(util(t + 0.5, n, g, base + rnd.random()) for g in range(8))
            rnd.shuffle(events)
            both.observe(events)
        now += step
        if rnd.random() < 1 / 400:
            variant = rnd.randrange(4)
            snap = snapshot(variant)
        elif rnd.random() < 1 / 200:
            snap = snapshot(variant)  # rebuilt, equal
        if killed_at <= now < killed_at + 300 and not both.inc.policy.spec.kill_switch:
            both.reload(policy(killSwitch=True))
        elif now >= killed_at + 300 and both.inc.policy.spec.kill_switch:
            both.reload(policy())
        for d in both.evaluate(now, snap):
            if rnd.random() < 0.25:
                both.not_done(
                    d,
                    reason="refused",
                    retry_at=now + rnd.choice([0.0, 20.0]),
                    hold_until=rnd.choice([None, now + 120.0]),
                )
    rules = {d["rule"] for _, _, ds in both.decided for d in ds}
    assert {"slo-breach-scale-up", "mig-convert"} <= rules
    assert ("leading-scale-up" if isinstance(leading, float) else "slo-scale-down") in rules


def quiet_run(
    p: Policy,
    snap: Snapshot,
    feed: Callable[[float], list[Event]],
    seconds: int,
) -> Lockstep:
    """Tick once a second for ``seconds``, feeding what ``feed(t)`` returns before tick ``t``."""
    both = Lockstep(p)
    for k in range(1, seconds + 1):
        both.observe(feed(T0 + k - 0.5))
        both.evaluate(T0 + k, snap)
    return both


def burst(until: float, ms: float, service: str = "chat") -> Callable[[float], list[Event]]:
    """20 requests of ``ms`` each second before ``until``, then nothing."""
    return lambda t: [latency(t, ms, service)] * 20 if t < until else []


def test_breach_after_fires_on_a_quiet_tick() -> None:
    """A service above its objective, then silent: breachAfter (10s) runs out without events
    and the breach response comes at once."""
    both = quiet_run(policy(), snapshot(0), burst(T0 + 3, 500.0), 20)
    assert both.first("slo-breach-scale-up") == (T0 + 11, True)


def test_window_expiry_ends_a_breach_and_stale_after_expires_it() -> None:
    """The slow requests leave the 30s window on a quiet tick (no verdict: breach held), and
    staleAfter (90s) later the breach expires, both exactly when ticking everything says."""
    both = quiet_run(policy(), snapshot(0), burst(T0 + 15, 500.0), 200)
    assert both.inc.slo_state("serving/chat").state == "stale"
    # the last slow requests (at +14.5) leave the window at +44; stale 90s later
    assert both.inc.slo_state("serving/chat").since == T0 + 44 + 90


def test_recover_after_fires_on_a_quiet_tick() -> None:
    """Breaching, then a minute of fast requests, then silence: recovering turns ok after
    recoverAfter (20s) on a quiet tick, as when ticking everything."""

    def feed(t: float) -> list[Event]:
        if t < T0 + 15:
            return [latency(t, 500.0)] * 20
        if t < T0 + 50:
            return [latency(t, 10.0)] * 400
        return []

    both = quiet_run(policy(), snapshot(0), feed, 120)
    states = both.inc.slo_state("serving/chat")
    assert states.state == "ok"
    assert states.since is not None
    assert states.since > T0 + 50


def test_cooldown_end_repeats_the_breach_response_without_events() -> None:
    """A breach held by a 1m window of slow requests: the second scale-up comes when the 30s
    cooldown ends, on a quiet tick."""
    p = policy()
    both = quiet_run(p, snapshot(0), burst(T0 + 20, 900.0), 50)
    ups = [now for now, quiet, ds in both.decided if ds[-1]["rule"] == "slo-breach-scale-up"]
    assert len(ups) == 2
    assert ups[1] == ups[0] + 30
    assert (ups[1], True) in [(now, quiet) for now, quiet, _ in both.decided]


def test_scale_down_after_stabilization_on_a_quiet_tick() -> None:
    """Fast requests, a batch every 25s: chat (3 replicas) scales down once stabilization
    (2m) has passed, on a tick without events."""
    both = quiet_run(
        policy(), snapshot(0), lambda t: [latency(t, 5.0)] * 20 if int(t) % 25 == 7 else [], 200
    )
    # recommendations start at +1 (hold at 3 until the first batch at +7.5): 3 leaves the 2m
    # stabilization window at +128
    assert both.first("slo-scale-down") == (T0 + 128, True)


def test_grow_after_grows_training_on_a_quiet_tick() -> None:
    """No event at all: training grows into the idle GPUs when growAfter (60s) has passed."""
    both = quiet_run(policy(mig=None), snapshot(1), lambda t: [], 90)
    assert both.first("grow-training") == (T0 + 61, True)


def test_a_grow_held_until_its_restart_pays_back_comes_on_a_quiet_tick() -> None:
    """Restart-aware: a DDP job's grow refused because 30m of 4 more GPUs would not repay its
    restart (its work since the estimated checkpoint) is held until that checkpoint, and
    comes on the quiet tick the work at stake drops to nothing, as ticking everything does."""
    train = dict(
        BASE["spec"]["training"],
        elastic={"growAfter": "60s", "growTo": "idle"},
        restarts={"payback": "30m"},
    )
    both = quiet_run(policy(mig=None, training=train), snapshot(1), lambda t: [], 200)
    # created at epoch 0, restarted 2m later, checkpoints every 30m from then: at T0+61
    # (growAfter) 29m at stake, refused; the next checkpoint is at T0+120
    assert both.first("grow-training") == (T0 + 120, True)
    assert both.decided[0][2][0]["to"] == 8


def test_convert_after_converts_an_idle_node_on_a_quiet_tick() -> None:
    """Whole-card pool below 20% (only w2/w3 report, idle), readings every 35s: the first node
    converts once convertAfter (10m) of idleness is covered, on a quiet tick."""

    def feed(t: float) -> list[Event]:
        if int(t) % 35 != 7:
            return []
        return [util(t, n, g, 1.0) for n in ("w2", "w3") for g in range(8)]

    both = quiet_run(policy(training=None), snapshot(0), feed, 700)
    # first reading at +7.5: idle for 10m at +607.5
    assert both.first("mig-convert") == (T0 + 608, True)


def full_pool(*, mig_node: bool) -> Snapshot:
    """One whole node full (chat 2, elastic training 6 of at most 10: it wants 4 more whole
    GPUs), and a MIG node or not."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    if mig_node:
        b.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=2, nodes=["w0"])
    training(b, "elastic", replicas=6, nodes=["w0"], min_replicas=2, max_replicas=10)
    return b.build()


def busy_gpus(t: float) -> list[Event]:
    """w0's GPUs reporting busy every second (the pool's mean moves every tick)."""
    return [util(t, "w0", g, 60.0 + (t % 7)) for g in range(8)]


@pytest.mark.parametrize("mig_node", [False, True])
def test_unmet_whole_card_demand_reverts_after_revert_after_on_a_quiet_tick(
    mig_node: bool,
) -> None:
    """Training wants whole GPUs the pool has not got: nothing converts whatever the mean, and
    a MIG node reverts once revertAfter (2m) of unmet demand has passed, on a tick without a
    latency event, as ticking everything decides; without a MIG node nothing is decided. The
    incremental engine skips the pool rules meanwhile."""
    both = quiet_run(make_policy(services={}), full_pool(mig_node=mig_node), busy_gpus, 200)
    if mig_node:
        assert both.first("mig-revert") == (T0 + 121, False)
    else:
        assert both.decided == []


def test_a_breach_at_replicas_max_is_settled() -> None:
    """chat breaching at its maximum (4) decides nothing, scales at once when a new snapshot
    lowers its replicas, and again when its cooldown ends on a quiet tick (unsettled below
    the maximum), as ticking everything decides."""
    svcs = services()
    svcs["chat"] = dict(svcs["chat"], replicas={"min": 1, "max": 4})
    both = Lockstep(make_policy(services=svcs))
    at_max, below = snapshot(2), snapshot(1)  # chat at 4 (its max), then at 2
    for k in range(1, 121):
        both.observe([latency(T0 + k - 0.5, 900.0)] * 20 if k % 10 == 3 else [])
        both.evaluate(T0 + k, at_max if k < 60 else below)
    ups = [
        (now, quiet)
        for now, quiet, ds in both.decided
        if any(d["rule"] == "slo-breach-scale-up" for d in ds)
    ]
    # none at the maximum; at 2 replicas again at once, and when the 30s cooldown ends
    assert ups[:2] == [(T0 + 60, True), (T0 + 90, True)]


def test_a_settled_service_above_its_minimum_recommends_on_every_step() -> None:
    """chat (3 replicas, minimum 1) settles at 70ms (below recoverBelow, not below 50%), then
    its requests speed up: its SLO state stays the same object at every step, yet its rules
    run (the percentile moves its recommendation), so it scales down once the 70ms
    recommendations leave the 2m stabilization window, as ticking everything decides."""

    def feed(t: float) -> list[Event]:
        return [latency(t, 70.0 if t < T0 + 40 else 10.0)] * 20

    both = quiet_run(policy(), snapshot(0), feed, 220)
    assert T0 + 180 < both.first("slo-scale-down")[0] < T0 + 200


def test_replay_of_a_sparse_recording_is_the_same_as_ticking_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hours, each service and GPU reporting once a minute (chat bursting slow twice),
    replayed through the simulated cluster: the same decisions.jsonl, summary and report
    series as with an engine that ticks everything (and the runner accounting every tick)."""
    rnd = random.Random(16)
    events: list[Event] = []
    for minute in range(120):
        t = T0 + minute * 60
        for i, name in enumerate(("chat", "search", "embed")):
            slow = name == "chat" and minute % 50 < 8
            events.append(samples(rnd, t + 7 * i, name, 400.0 if slow else 30.0))
        for n, base in (("w0", 15.0), ("w1", 25.0), ("w2", 1.0), ("w3", 2.0)):
            events.extend(util(t + 30 + g, n, g, base + rnd.random()) for g in range(8))
    path = write_recording(tmp_path / "sparse.jsonl", events)
    incremental, full = replayed_both_ways(path, policy(), tmp_path, monkeypatch)
    assert incremental == full
    assert incremental[1]["actions"]["total"] > 0


Outputs = tuple[bytes, dict[str, Any], dict[str, list[float | None]]]


def replayed_both_ways(
    path: Path,
    p: Policy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: ReplaySettings | None = None,
) -> tuple[Outputs, Outputs]:
    """``decisions.jsonl``, the summary and the report's series of replaying ``path`` through
    the simulated cluster (from ``snapshot(0)``), then the same with an engine that ticks
    everything."""

    def outputs(out: Path) -> Outputs:
        def cluster(start: float) -> SimCluster:
            return SimCluster(snapshot(0), start=start, pools=p.spec.pools)

        result = replay(path, policy=p, cluster=cluster, out_dir=out, settings=settings)
        return (
            (out / DECISIONS_FILE).read_bytes(),
            result.summary.to_dict(),
            result.timeline.series(),
        )

    incremental = outputs(tmp_path / "inc")
    monkeypatch.setattr(runner, "Engine", functools.partial(Engine, incremental=False))
    return incremental, outputs(tmp_path / "full")


class IdleLockstep(Lockstep):
    """As the replay runs the engine: each tick first asks :meth:`Engine.idle` and evaluates
    only when it says no; a tick it calls idle must be one where ticking everything decides
    nothing and leaves every SLO state as it was."""

    def __init__(self, p: Policy) -> None:
        super().__init__(p)
        self.idle_ticks = 0
        #: Idle ticks after events (for a service: stepped by ``idle``, as evaluate would).
        self.idle_after_events = 0

    def evaluate(self, now: float, snap: Snapshot) -> list[Decision]:
        if not self.inc.idle(now, snap):
            return super().evaluate(now, snap)
        assert self.full.evaluate(now, snap) == [], now
        self.idle_after_events += not self.quiet_since_tick
        for key in self.keys:
            assert self.inc.slo_state(key) == self.full.slo_state(key), (now, key)
        self.idle_ticks += 1
        self.quiet_since_tick = True
        return []


@pytest.mark.parametrize("seed", [4, 5])
def test_runs_of_idle_ticks_decide_as_ticking_everything(seed: int) -> None:
    """Two hours ticked every second through ``idle`` first: services switching between
    silence, one event a minute and steady traffic, GPUs reporting in bursts then falling
    silent (the pool's mean moves as readings leave its window), refused decisions, snapshot
    changes and a reload, all inside runs of idle ticks. Every tick decides what ticking
    everything decides."""
    rnd = random.Random(seed)
    both = IdleLockstep(policy(training=None))
    variant, snap = 0, snapshot(0)
    regime = {"chat": "sparse", "search": "silent", "embed": "sparse"}
    objective = {"chat": 100.0, "search": 80.0, "embed": 150.0}
    busy_until = T0 + 900.0
    for k in range(1, 2 * 3600 + 1):
        now = T0 + k
        events: list[Event] = []
        for name in regime:
            if rnd.random() < 1 / 600:
                regime[name] = rnd.choice(("silent", "sparse", "sparse", "steady", "slow"))
            r = regime[name]
            if r == "silent" or (r == "sparse" and k % 60 != 17):
                continue
            mean = objective[name] * (4.0 if r == "slow" else 0.75)  # else nothing to scale down
            events.append(samples(rnd, now - 0.5, name, mean))
        if k % 45 == 3:
            busy = now < busy_until
            if not busy and rnd.random() < 1 / 20:
                busy_until = now + rnd.uniform(300, 1200)
            for n in ("w0", "w1", "w2", "w3"):
                base = 60.0 if busy and n in ("w0", "w1") else 1.0
                events.extend(util(now - 0.5, n, g, base + rnd.random()) for g in range(8))
        both.observe(events)
        if rnd.random() < 1 / 1500:
            variant = rnd.randrange(4)
            snap = snapshot(variant)
        if k == 5000:
            both.reload(policy(training=None, cooldowns={"service": "45s", "trainingGrow": "90s"}))
        for d in both.evaluate(now, snap):
            if rnd.random() < 0.3:
                both.not_done(d, reason="refused", retry_at=now + rnd.choice([0.0, 20.0]))
    assert both.idle_ticks > 500
    rules = {d["rule"] for _, _, ds in both.decided for d in ds}
    assert "mig-convert" in rules


def mean_pulled_down(t: float) -> list[Event]:
    """GPU readings at ``t``: w0 busy at 60%, w2 and w3 idle, every 50s, and at +900 a burst of
    idle readings that pulls the whole-card pool's mean below convertBelow."""
    k = int(t - T0)
    repeat = 6 if k == 900 else 1
    events: list[Event] = [util(t, "w0", g, 60.0) for g in range(8)] if k % 50 == 7 else []
    if k % 50 == 7 or k == 900:
        events += [util(t, n, g, 1.0) for n in ("w2", "w3") for g in range(8)] * repeat
    return events


@pytest.mark.parametrize("search", [False, True])
def test_readings_that_pull_the_pool_mean_down_inside_a_run_of_idle_ticks_convert_at_once(
    search: bool,
) -> None:
    """w0 busy at 60%, w2 and w3 idle, every 50s: the whole-card pool's mean (20.7%) stays just
    above convertBelow, so ticks are idle. Then a burst of idle readings pulls it to ~16% on a
    tick with no other change: the node idle for longer than convertAfter converts on that
    very tick, as ticking everything decides, not when the window next moves. With ``search``,
    search's events (within its objective: its rules would hold) every 5s, one of them on the
    burst's tick: after an idle tick the next ones keep what it found and only step the
    services events made due, but the pool's mean is read on those too."""

    def feed(t: float) -> list[Event]:
        due = [latency(t, 60.0, "search")] if search and int(t - T0) % 5 == 0 else []
        return mean_pulled_down(t) + due

    both = IdleLockstep(policy(training=None))
    snap = snapshot(0)
    for k in range(1, 960):
        both.observe(feed(T0 + k - 0.5))
        both.evaluate(T0 + k, snap)
    assert both.first("mig-convert") == (T0 + 901, False)  # the burst came at +900.5
    assert both.idle_ticks > 800
    assert both.idle_after_events > (100 if search else 0)  # search's, stepped on idle ticks


def test_replay_advances_the_simulated_cluster_on_quiet_ticks_when_something_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chat (at most 4 replicas) breaches on a once-a-minute stream and scales to its maximum
    at once, so the ticks after are quiet: the new pod's creation (2s later) and start-up (10s
    more) fall due on quiet ticks, and the replay, which skips the simulated cluster's
    ``advance`` on quiet ticks only until its next due time, accounts them on those very
    ticks: the same outputs as ticking everything. (The first event, which sets the ticks'
    origin, is offset from the others so the pod's creation misses the sample ticks.)"""
    svcs = services()
    svcs["chat"] = dict(svcs["chat"], replicas={"min": 1, "max": 4})
    p = make_policy(services=svcs, training=None, mig=None)
    rnd = random.Random(7)
    events: list[Event] = [
        samples(
            rnd,
            T0 + minute * 60 + (9.25 if minute else 0.25),
            "chat",
            400.0 if 3 <= minute < 6 else 30.0,
        )
        for minute in range(20)
    ]
    path = write_recording(tmp_path / "quiet.jsonl", events)
    # 20 points: few sample ticks (each a full one), so the pod's steps land on quiet ones
    settings = ReplaySettings(points=20)
    incremental, full = replayed_both_ways(path, p, tmp_path, monkeypatch, settings)
    assert incremental == full
    assert b"slo-breach-scale-up" in incremental[0]


def test_an_idle_tick_steps_a_due_service_only_when_its_rules_would_hold() -> None:
    """Ticks asked ``idle`` first, the pool rules quiet (no training, no MIG): search's events
    (at its minimum, within its objective) are stepped on idle ticks, but chat's (3 replicas,
    minimum 1, settled at 70ms, then faster) are not, since its rules recommend by the
    percentile at each step: it scales down once the 70ms recommendations leave the 2m
    stabilization window, exactly when ticking everything says."""

    def feed(t: float) -> list[Event]:
        if int(t) % 5 == 2:
            return [latency(t, 70.0 if t < T0 + 40 else 10.0)] * 100
        return [latency(t, 60.0, "search")] * 10 if int(t) % 5 == 0 else []

    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(3)  # search at its minimum (1 replica)
    for k in range(1, 220):
        both.observe(feed(T0 + k - 0.5))
        both.evaluate(T0 + k, snap)
    assert T0 + 180 < both.first("slo-scale-down")[0] < T0 + 200
    assert both.idle_after_events > 10  # search's events, stepped on idle ticks


def test_a_leading_scale_up_held_by_its_cooldown_comes_when_the_cooldown_ends() -> None:
    """200 fast requests in one second, then silence: the request rate scales chat up at
    once, and again the moment the 10s cooldown ends (the rate, over the span that holds
    data, still wants more), on a quiet tick, as ticking everything does: the breach rule may
    act at any tick while it has a leading indicator, so it is never settled."""
    both = quiet_run(
        make_policy(services=leading_services()),
        snapshot(0),
        lambda t: [latency(t, 20.0)] * 200 if t < T0 + 2 else [],
        40,
    )
    ups = [(now, quiet) for now, quiet, ds in both.decided if ds[-1]["rule"] == "leading-scale-up"]
    assert ups[:2] == [(T0 + 1, False), (T0 + 11, True)]


def test_a_breach_held_by_its_cooldown_is_idle_until_the_cooldown_ends() -> None:
    """A breach held by a 1m window of slow requests, ticks asked ``idle`` first: while the
    30s cooldown after the first scale-up runs and nothing is due, the ticks are idle (the
    breach response says it holds until the cooldown ends), and the second scale-up comes the
    moment it ends, as ticking everything decides."""
    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(0)
    feed = burst(T0 + 20, 900.0)
    idle_in_cooldown = 0
    for k in range(1, 51):
        both.observe(feed(T0 + k - 0.5))
        before = both.idle_ticks
        both.evaluate(T0 + k, snap)
        idle_in_cooldown += both.idle_ticks - before if 11 < k < 41 else 0
    ups = [now for now, _, ds in both.decided if ds[-1]["rule"] == "slo-breach-scale-up"]
    assert ups == [T0 + 11, T0 + 41]
    assert idle_in_cooldown >= 5  # the ticks after the events stop, before intervals leave


def test_feedback_that_gives_a_cooldown_back_runs_a_waiting_breach_response() -> None:
    """The first scale-up refused with a retry 5s later: the cooldown it started is taken back,
    so the breach response, waiting for that cooldown to end with no event or interval to
    step chat meanwhile, tries again at the retry time, as ticking everything does."""
    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(0)
    feed = burst(T0 + 10, 900.0)
    for k in range(1, 30):
        both.observe(feed(T0 + k - 0.5))
        for d in both.evaluate(T0 + k, snap):
            if k == 11:
                both.not_done(d, reason="refused", retry_at=T0 + k + 5)
    ups = [now for now, _, ds in both.decided if ds[-1]["rule"] == "slo-breach-scale-up"]
    assert ups[:2] == [T0 + 11, T0 + 16]


def test_a_service_whose_rules_read_only_its_level_is_stepped_when_the_level_may_change() -> None:
    """search at its minimum (its rules read no percentile) gets 60ms requests every 5s for
    30s, then none: its intervals leave its 1m window one by one from +60s and its level
    stays "below" until the last has gone. Ticked through ``idle``, it is stepped when its
    level may change (a few window changes looked past at a time), not at each interval
    leaving, and every tick decides what ticking everything decides."""
    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(3)  # search at its minimum (1 replica)
    steps = set()
    for k in range(1, 120):
        events = [latency(T0 + k - 0.5, 60.0, "search")] * 10 if k % 5 == 0 and k <= 30 else []
        both.observe(events)
        both.evaluate(T0 + k, snap)
        steps.add(last_stepped(both.inc, "serving/search"))
    assert both.inc.slo_state("serving/search").last_level == "none"
    after_events = sorted(t for t in steps if t > T0 + 31)
    assert 1 <= len(after_events) <= 3, after_events  # not one per interval leaving (6)


@pytest.mark.parametrize(("ms", "stepped_each_second"), [(60.0, False), (75.0, True)])
def test_requests_below_the_recovery_threshold_do_not_step_a_service_held_below(
    ms: float, stepped_each_second: bool
) -> None:
    """search at its minimum (its rules read only its level), settled below its recovery
    threshold (72ms: 90 % of 80ms): a request each second at ``ms`` for two minutes, ticked
    through ``idle``. Below the threshold (60ms) a request only adds to what keeps the level
    "below", so search is stepped at the wakes its window's changes call for, not after
    every event; between the threshold and the objective (75ms) the level may change with
    each, so each one steps it. Then slow requests: the breach comes exactly when ticking
    everything says, on both."""
    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(3)  # search at its minimum (1 replica)
    steps = set()
    for k in range(1, 200):
        value = 60.0 if k <= 20 else ms if k <= 140 else 500.0
        both.observe([latency(T0 + k - 0.5, value, "search")] * 5)
        both.evaluate(T0 + k, snap)
        if 40 < k <= 140:
            steps.add(last_stepped(both.inc, "serving/search"))
    assert (len(steps) == 100) is stepped_each_second, len(steps)
    assert T0 + 140 < both.first("slo-breach-scale-up")[0] < T0 + 170


@pytest.mark.parametrize(("ms", "proven"), [(60.0, True), (50.2, False)])
def test_a_scale_down_hold_is_told_from_counts_above_its_floor(
    ms: float, proven: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chat at 3 replicas (minimum 1), its scale-down rule reading the percentile (below 50 %
    of 100ms): ten requests a second at ``ms``, ticked through ``idle``. At 60ms the counters
    (counting above 50ms, plus the sketch's 1 % accuracy, from the first quiet step that asks)
    show the percentile at or above 50ms once the 30s window holds only counted intervals, so
    the quiet steps read no percentile; at 50.2ms the counts cannot tell what the sketch reads,
    so each step reads it. Every tick decides what ticking everything decides."""
    both = IdleLockstep(policy(training=None, mig=None))
    track = both.inc._services["serving/chat"]
    reads: list[float] = []
    quantile = LatencyWindow.quantile

    def counted(self: LatencyWindow, now: float, q: float) -> float | None:
        if self is track.latency:
            reads.append(now)
        return quantile(self, now, q)

    monkeypatch.setattr(LatencyWindow, "quantile", counted)
    snap = snapshot(0)  # chat at 3 replicas
    for k in range(1, 120):
        both.observe([latency(T0 + k - 0.5, ms)] * 10)
        both.evaluate(T0 + k, snap)
    assert (both.idle_after_events > 60) is proven  # else the rules run: they may scale down
    late = [t for t in reads if t > T0 + 80]
    assert (late == []) is proven, len(late)


@pytest.mark.parametrize(("ms", "at_events"), [(60.0, False), (85.0, True)])
def test_requests_within_the_floor_slack_do_not_step_a_service_held_by_its_percentile(
    ms: float, at_events: bool
) -> None:
    """chat at 3 replicas, its scale-down rule holding by its percentile (at or above 50ms),
    ten requests at ``ms`` every 5s, ticked through ``idle``; its 1s intervals leave its 30s
    window one second before each event's. At 60ms (below the 80ms recovery threshold, well
    above the floor) an event only adds to what keeps the level "below" and the percentile
    over the floor, as the counters' slack says: chat is stepped as its intervals leave, not
    at each event too. At 85ms its level is "between": each event steps it. Every tick
    decides what ticking everything decides."""
    both = IdleLockstep(policy(training=None, mig=None))
    snap = snapshot(0)  # chat at 3 replicas
    steps = set()
    for k in range(1, 160):
        events = [latency(T0 + k - 0.5, ms)] * 10 if k % 5 == 2 else []
        both.observe(events)
        both.evaluate(T0 + k, snap)
        if 80 < k <= 140:
            steps.add(last_stepped(both.inc, "serving/chat"))
    at = {round(t - T0) % 5 for t in steps}
    assert 1 in at  # an interval leaving
    assert (2 in at) is at_events, sorted(steps)
