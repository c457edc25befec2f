"""Each rule's "until when can I only hold?" answer holds against the rule itself.

The incremental schedule (:mod:`policies.scheduling`) skips a rule while the rule says it can
only hold (``breach_quiet_until``, ``scale_down_quiet_until``, ``grow_quiet_until``,
``mig_quiet_until``). These tests run the rule in exactly those situations, over random
specs, SLO states, snapshots and timers, with cooldowns and budgets as permissive as they
come, and check that it decides nothing: a rule changed without its answer fails here, not
silently in a sparse replay.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from dataclasses import dataclass
from typing import Any

import pytest
from policy_fixtures import BASE, MIG, T0, WHOLE, make_policy, training

from policies.budgets import Budgets, Cooldowns
from policies.inventory import Inventory
from policies.mig import IdleTracker, MigFlights
from policies.model import MigSpec, Policy
from policies.pool_rules import grow_quiet_until, grow_training, mig_quiet_until, run_mig
from policies.rules import Round, breach_quiet_until, respond_to_breach
from policies.scaledown import Recommendations, scale_down, scale_down_quiet_until
from policies.slo import STATES, Level, SloState
from policies.snapshot import Snapshot, SnapshotBuilder
from policies.windows import LatencyWindow, UtilizationWindow

LEVELS: tuple[Level, ...] = ("above", "between", "below", "none")


@functools.cache
def chat_policy(lo: int, spread: int, scale: bool, down: bool, lead: int, step: bool) -> Policy:
    """The base policy with chat's replica bounds and scale section as given (``lead``: its
    request rate per replica, 0 for no leading indicator)."""
    chat: dict[str, Any] = copy.deepcopy(BASE["spec"]["services"]["chat"])
    chat["replicas"] = {"min": lo, "max": lo + spread}
    chat.pop("scale", None)
    if scale:
        chat["scale"] = {"tolerance": "10%"}
        if down:
            chat["scale"]["down"] = {"below": "60%", "stabilization": "1m", "maxStep": 2}
        if lead:
            chat["scale"]["leading"] = {"ratePerReplica": lead}
        if step:
            chat["scale"]["maxStep"] = 1
    return make_policy(services={"chat": chat})


def random_chat_policy(rnd: random.Random) -> Policy:
    return chat_policy(
        rnd.randint(1, 4),
        rnd.randint(0, 6),
        rnd.random() < 0.7,
        rnd.random() < 0.6,
        rnd.choice([0, 0, 1, 5, 50]),
        rnd.random() < 0.3,
    )


def chat_cluster(replicas: int | None, pending: int) -> Snapshot:
    """chat with ``replicas`` on w0 (or no workload), elastic training on w1, ``pending``
    pods of chat waiting for a GPU."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.node("w1", gpus=8, labels=WHOLE)
    if replicas is not None:
        b.workload("serving", "chat", replicas=replicas, nodes=["w0"])
    for i in range(pending):
        b.pod("serving", f"chat-pending-{i}", gpus=1, workload="serving/chat")
    training(b, "elastic", replicas=6, nodes=["w1"], min_replicas=1, max_replicas=8)
    return b.build()


def window(rnd: random.Random, now: float) -> tuple[LatencyWindow, int]:
    """A 30s window of fast or slow requests (or none), and how many it holds."""
    w = LatencyWindow(window_s=30.0, interval_s=1.0)
    ms = rnd.choice([5.0, 50.0, 95.0, 500.0])
    n = rnd.choice([0, 5, 40, 400])
    for k in range(n):
        w.add(now - 29 + (k % 29), ms * rnd.uniform(0.9, 1.1))
    return w, n


def fresh_round(now: float, p: Policy, inv: Inventory) -> Round:
    """A round with no cooldown running and every budget whole: the most a rule may do."""
    return Round(now=now, policy=p, inv=inv, budgets=Budgets(p.spec.budgets), cooldowns=Cooldowns())


@pytest.mark.parametrize("seed", range(3))
def test_a_service_rule_that_says_it_can_only_hold_decides_nothing(seed: int) -> None:
    """Random specs (scale or not, scale-down, a leading indicator, bounds), SLO states and
    levels, workloads (or none, pending pods) and windows: wherever
    ``breach_quiet_until``/``scale_down_quiet_until`` answer ``inf``, the rule decides
    nothing at any later time, and scale-down recommends the current replicas."""
    rnd = random.Random(seed)
    quiet_seen = {"breach": 0, "down": 0}
    for _ in range(200):
        p = random_chat_policy(rnd)
        spec = p.spec.services["chat"]
        replicas = rnd.choice([None, 1, 2, 4, 8])
        inv = Inventory(chat_cluster(replicas, rnd.choice([0, 0, 2])), p)
        workload = inv.service_workload.get("serving/chat")
        slo = SloState(
            state=rnd.choice(STATES),
            since=T0 - rnd.choice([0.0, 5.0, 100.0]),
            last_level=rnd.choice(LEVELS),
        )
        for later in (0.0, 1.0, 31.0, 3600.0):
            now = T0 + later
            win, n = window(rnd, now)
            if breach_quiet_until(spec, slo, workload) == math.inf:
                quiet_seen["breach"] += 1
                rnd_ = fresh_round(now, p, inv)
                respond_to_breach(rnd_, "serving/chat", spec, slo, win, requests=n)
                assert rnd_.decisions == [], (spec, slo, workload)
            if scale_down_quiet_until(spec, slo, workload, win, now) == math.inf:
                quiet_seen["down"] += 1
                history = Recommendations()
                rnd_ = fresh_round(now, p, inv)
                assert scale_down(rnd_, "serving/chat", spec, slo, win, history, samples=n)
                assert rnd_.decisions == [], (spec, slo, workload)
                if workload is not None and spec.scale is not None and spec.scale.down:
                    stab = spec.scale.down.stabilization
                    assert history.highest(now, stab) == workload.replicas
    assert min(quiet_seen.values()) > 100


def grow_cluster(rnd: random.Random) -> Snapshot:
    """Two whole nodes: chat on w0, elastic training on w1 with room to grow (or not), some
    GPUs free, maybe a pending whole-card pod."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    b.node("w1", gpus=8, labels=WHOLE)
    b.workload("serving", "chat", replicas=rnd.randint(1, 6), nodes=["w0"])
    replicas = rnd.randint(2, 8)
    training(b, "elastic", replicas=replicas, nodes=["w1"], min_replicas=1, max_replicas=10)
    if rnd.random() < 0.2:
        b.pod("ml", "whole-job", gpus=rnd.choice([1, 8]), labels={"ebbtide.io/class": "training"})
    return b.build()


@pytest.mark.parametrize("seed", range(4))
def test_training_growth_decides_nothing_until_its_quiet_until(seed: int) -> None:
    """After a round where growth decided nothing, with the same snapshot and busy pools, it
    decides nothing again at any time before ``grow_quiet_until``: growAfter from when the GPUs
    went free, the pool's cooldown and the scale-step budget are its only timers."""
    rnd = random.Random(seed)
    checked = 0
    p = make_policy(mig=None)
    for _ in range(200):
        inv = Inventory(grow_cluster(rnd), p)
        budgets, cooldowns = Budgets(p.spec.budgets), Cooldowns()
        now = T0 + 1000.0
        if rnd.random() < 0.5:
            cooldowns.mark("pool:whole", now - rnd.uniform(0, 90))
        for k in range(rnd.choice([0, 0, 20])):  # the scale-step budget spent, lately
            budgets.scale_steps.spend(now - rnd.uniform(500, 600), key=f"spent-{k}")
        free_since: dict[str, float] = {}
        if rnd.random() < 0.7:
            free_since["whole"] = now - rnd.uniform(0, 120)
        busy = rnd.choice([set(), {"whole"}])
        first = Round(now=now, policy=p, inv=inv, budgets=budgets, cooldowns=cooldowns)
        grow_training(first, busy_pools=busy, free_since=free_since)
        if first.decisions:
            continue
        until = grow_quiet_until(
            now, p, budgets=budgets, cooldowns=cooldowns, free_since=free_since
        )
        for t in sorted(rnd.uniform(now, min(until, now + 7200)) for _ in range(5)):
            if t >= until:
                continue
            again = Round(now=t, policy=p, inv=inv, budgets=budgets, cooldowns=cooldowns)
            grow_training(again, busy_pools=busy, free_since=dict(free_since))
            assert again.decisions == [], (now, t, until, free_since)
            checked += 1
    assert checked > 100


def mig_cluster(rnd: random.Random) -> Snapshot:
    """Three whole nodes (chat on w0, elastic training on w1, w2 idle) and a MIG node or not,
    maybe pending whole-card pods."""
    b = SnapshotBuilder()
    for name in ("w0", "w1", "w2"):
        b.node(name, gpus=8, labels=WHOLE)
    if rnd.random() < 0.5:
        b.node("m0", gpus=8, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=2, nodes=["w0"])
    training(
        b, "elastic", replicas=rnd.choice([4, 8]), nodes=["w1"], min_replicas=1, max_replicas=8
    )
    for i in range(rnd.choice([0, 0, 1, 2])):  # two want more than w2 has free
        b.pod("ml", f"whole-job-{i}", gpus=8, labels={"ebbtide.io/class": "training"})
    return b.build()


@dataclass(frozen=True)
class MigCase:
    """One MIG situation: the policy, snapshot, budgets, readings and busy pools."""

    policy: Policy
    mig: MigSpec
    inv: Inventory
    budgets: Budgets
    pool_window: UtilizationWindow
    idle: IdleTracker
    breaching: bool

    def run(self, t: float, flights: MigFlights, demand: list[float | None]) -> Round:
        """``run_mig`` at ``t`` on its own round, the readings untouched."""
        r = Round(
            now=t, policy=self.policy, inv=self.inv, budgets=self.budgets, cooldowns=Cooldowns()
        )
        run_mig(
            r,
            mig=self.mig,
            pool_window=self.pool_window,
            idle=copy.deepcopy(self.idle),
            flights=flights,
            demand_since=demand,
            stale_s=60.0,
            breaching=self.breaching,
        )
        return r


@pytest.mark.parametrize("seed", range(4))
def test_mig_decides_nothing_until_its_quiet_until(seed: int) -> None:
    """After a round where MIG decided nothing, with the same snapshot and no new readings, it
    decides nothing again at any time before ``mig_quiet_until``: revertAfter of unmet demand,
    the utilization window's next slot, a node's hold, are its only timers."""
    rnd = random.Random(seed)
    checked = 0
    p = make_policy(training=None)
    mig = p.spec.mig
    assert mig is not None
    for _ in range(80):
        inv = Inventory(mig_cluster(rnd), p)
        now = T0 + 3600.0
        pool_window = UtilizationWindow(window_s=mig.convert_after, interval_s=20.0)
        idle = IdleTracker(mig.node_idle_below * 100.0)
        busy_pct = rnd.choice([1.0, 10.0, 60.0])
        start = now - rnd.uniform(500, 700)  # idle for about convertAfter (10m)
        for k in range(int((now - start) // 5) + 1):
            ts = now - 5 * k
            for node, base in (("w0", busy_pct), ("w1", busy_pct), ("w2", 0.5)):
                for g in range(8):
                    u = base + rnd.random()
                    pool_window.add(ts, u)
                    idle.add(node, str(g), ts, u)
        demand_since: list[float | None] = [rnd.choice([None, now - rnd.uniform(0, 300)])]
        held_until = rnd.choice([-math.inf, now + rnd.uniform(0, 600)])
        breaching = rnd.random() < 0.2
        flights = MigFlights()
        budgets = Budgets(p.spec.budgets)

        case = MigCase(p, mig, inv, budgets, pool_window, idle, breaching)
        if case.run(now, flights, demand_since).decisions:
            continue
        until, _ = mig_quiet_until(
            now,
            mig=mig,
            inv=inv,
            flights=flights,
            demand_since=demand_since,
            pool_window=pool_window,
            breaching=breaching,
            held_until=held_until,
        )
        for t in [now + d for d in (0.5, 1.0, 5.0, 10.0, 19.0, 30.0, 59.0, 90.0, 300.0)]:
            if t >= until:
                break
            again = case.run(t, copy.deepcopy(flights), list(demand_since))
            assert again.decisions == [], (now, t, until)
            checked += 1
    assert checked > 50
