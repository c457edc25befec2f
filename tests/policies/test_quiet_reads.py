"""The quiet ticks' cheaper reads give the answers of the reads they stand for.

The engine asks the breach response and the scale-down rule whether they can only hold on every
quiet tick that steps a service, so each rule's answer comes in two parts: what the spec alone
decides (``*_quiet_static``, kept on the service) and what must be read from its state
(``*_quiet_read``). These table tests check that the parts give ``breach_quiet_until``'s and
``scale_down_quiet_until``'s answers over specs, replicas, SLO states and windows; that the
latency window's cached reads follow its writes and the clock; that the whole-card pool's
mean, read again only past the readings it can take (``convert_margin``), cannot have fallen
below ``convertBelow`` before then; and that the look one change ahead of a service whose rules
read only its level (``ExceedanceWindow.level_steady_until``) reads as the reads it stands for.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from typing import Any

import pytest
from policy_fixtures import BASE, T0, WHOLE, make_policy

from policies.inventory import Inventory
from policies.model import Policy
from policies.pool_rules import convert_margin, converts_below
from policies.rules import breach_quiet_read, breach_quiet_static, breach_quiet_until
from policies.scaledown import (
    scale_down_quiet_read,
    scale_down_quiet_static,
    scale_down_quiet_until,
)
from policies.servicetrack import ServiceTrack
from policies.slo import ExceedanceWindow, Level, SloState, State
from policies.snapshot import SnapshotBuilder, Workload
from policies.windows import LatencyWindow, UtilizationWindow

INF = math.inf


@functools.cache
def policy(kind: str) -> Policy:
    """chat (replicas 2-8) with ``kind`` of scale section: ``none``, ``up`` (no scale-down),
    ``down``, ``leading`` (scale-down and a request rate) or ``signals`` (scale-down and a
    load signal)."""
    chat: dict[str, Any] = copy.deepcopy(BASE["spec"]["services"]["chat"])
    chat["replicas"] = {"min": 2, "max": 8}
    down = {"below": "60%", "stabilization": "1m", "maxStep": 2}
    scale: dict[str, Any] | None = {
        "none": None,
        "up": {"tolerance": "10%"},
        "down": {"tolerance": "10%", "down": down},
        "leading": {"tolerance": "10%", "down": down, "leading": {"ratePerReplica": 5}},
        "signals": {"tolerance": "10%", "down": down, "signals": {"kvCache": "80%"}},
    }[kind]
    if scale is None:
        chat.pop("scale", None)
    else:
        chat["scale"] = scale
    return make_policy(services={"chat": chat})


def workload(p: Policy, replicas: int | None) -> Workload | None:
    """chat's workload at ``replicas`` (``None``: no workload in the snapshot)."""
    b = SnapshotBuilder()
    b.node("w0", gpus=8, labels=WHOLE)
    if replicas is not None:
        b.workload("serving", "chat", replicas=replicas, nodes=["w0"])
    return Inventory(b.build(), p).service_workload.get("serving/chat")


def latency(ms: float | None) -> LatencyWindow:
    """A 30 s window of 40 requests at about ``ms`` (``None``: empty)."""
    w = LatencyWindow(window_s=30.0, interval_s=1.0)
    if ms is not None:
        w.add_many(T0 - 1, [ms * (1 + i / 400) for i in range(40)])
    return w


# (id, scale kind, replicas, state, level, window's latency, want)
CASES: list[tuple[str, str, int | None, State, Level, float | None, float]] = [
    ("no-scale", "none", 4, "ok", "below", 10.0, INF),
    ("no-scale-down", "up", 4, "ok", "below", 10.0, INF),
    ("no-workload", "down", None, "ok", "below", 10.0, INF),
    ("no-workload-signals", "signals", None, "ok", "below", 10.0, INF),
    ("signals-fast", "signals", 4, "ok", "below", 10.0, -INF),
    ("signals-at-min", "signals", 2, "ok", "below", 10.0, -INF),
    ("signals-breaching", "signals", 4, "breaching", "above", 500.0, -INF),
    ("fast-above-min", "down", 4, "ok", "below", 10.0, -INF),
    ("fast-between", "down", 4, "ok", "between", 10.0, -INF),
    ("fast-at-min", "down", 2, "ok", "below", 10.0, INF),
    ("fast-below-min", "down", 1, "ok", "below", 10.0, INF),
    ("fast-no-verdict", "down", 4, "ok", "none", 10.0, INF),
    ("fast-above", "down", 4, "ok", "above", 10.0, INF),
    ("fast-breaching", "down", 4, "breaching", "below", 10.0, INF),
    ("fast-recovering", "down", 4, "recovering", "below", 10.0, INF),
    ("fast-stale", "down", 4, "stale", "none", 10.0, INF),
    ("empty-window", "down", 4, "ok", "below", None, INF),
    ("in-band", "down", 4, "ok", "between", 70.0, INF),
    ("under-below", "down", 4, "ok", "below", 50.0, -INF),
    ("just-over-below", "down", 8, "ok", "below", 56.0, INF),
    ("two-replicas-off", "down", 8, "ok", "below", 45.0, -INF),
    ("three-replicas-near", "down", 3, "ok", "below", 59.0, INF),
    ("three-replicas-far", "down", 3, "ok", "below", 30.0, -INF),
    ("slow-above-min", "down", 6, "ok", "below", 90.0, INF),
    ("leading-fast", "leading", 4, "ok", "below", 10.0, -INF),
    ("leading-at-min", "leading", 2, "ok", "below", 10.0, INF),
    ("leading-breaching", "leading", 4, "breaching", "above", 500.0, INF),
    ("leading-no-verdict", "leading", 4, "ok", "none", 10.0, INF),
    ("leading-in-band", "leading", 4, "ok", "between", 70.0, -INF),
    ("leading-no-workload", "leading", None, "ok", "below", 10.0, INF),
    ("max-replicas-fast", "down", 8, "ok", "below", 10.0, -INF),
]


@pytest.mark.parametrize(
    ("kind", "replicas", "state", "level", "ms", "want"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_split_answers_as_the_whole(
    kind: str, replicas: int | None, state: State, level: Level, ms: float | None, want: float
) -> None:
    """``scale_down_quiet_until`` gives the expected answer, and so do its two parts: the
    spec's static answer where it has one (kept on the service), else the read."""
    p = policy(kind)
    spec = p.spec.services["chat"]
    wl = workload(p, replicas)
    slo = SloState(state=state, since=T0 - 100, last_level=level)
    win = latency(ms)
    assert scale_down_quiet_until(spec, slo, wl, win, T0) == want
    static = scale_down_quiet_static(spec)
    assert ServiceTrack("chat", spec).down_quiet == static
    if wl is not None:
        split = static if static is not None else scale_down_quiet_read(spec, slo, wl, win, T0)
        assert split == want


# (id, scale kind, replicas, state, want)
BREACH: list[tuple[str, str, int | None, State, float]] = [
    ("ok", "down", 4, "ok", INF),
    ("recovering", "down", 4, "recovering", INF),
    ("stale", "down", 4, "stale", INF),
    ("breaching-room", "down", 4, "breaching", -INF),
    ("breaching-at-max", "down", 8, "breaching", INF),
    ("breaching-no-workload", "down", None, "breaching", -INF),
    ("breaching-at-max-no-scale", "none", 8, "breaching", -INF),
    ("breaching-at-max-up-only", "up", 8, "breaching", INF),
    ("leading-ok", "leading", 4, "ok", -INF),
    ("leading-at-max", "leading", 8, "breaching", -INF),
    ("signals-ok", "signals", 4, "ok", -INF),
    ("signals-no-workload", "signals", None, "ok", -INF),
]


@pytest.mark.parametrize(
    ("kind", "replicas", "state", "want"), [c[1:] for c in BREACH], ids=[c[0] for c in BREACH]
)
def test_the_breach_split_answers_as_the_whole(
    kind: str, replicas: int | None, state: State, want: float
) -> None:
    """``breach_quiet_until`` gives the expected answer, and so do its two parts: the spec's
    static answer where it has one (kept on the service), else the read."""
    p = policy(kind)
    spec = p.spec.services["chat"]
    wl = workload(p, replicas)
    slo = SloState(state=state, since=T0 - 100, last_level="above")
    assert breach_quiet_until(spec, slo, wl) == want
    static = breach_quiet_static(spec)
    assert ServiceTrack("chat", spec).breach_quiet == static
    assert (static if static is not None else breach_quiet_read(spec, slo, wl)) == want


def test_a_cached_read_follows_writes_and_the_clock() -> None:
    """A read repeated between writes gives the same answer; a write to the interval read
    last (same slot, same count) or the interval leaving the window changes it."""
    w = LatencyWindow(window_s=3.0, interval_s=1.0)
    w.add_many(T0, [10.0] * 20)
    assert w.quantile(T0, 0.99) == pytest.approx(10.0, rel=0.01)
    assert w.quantile(T0, 0.99) == w.quantile(T0 + 0.5, 0.99)
    w.add(T0 + 0.5, 100.0)
    assert w.quantile(T0 + 0.5, 1.0) == pytest.approx(100.0, rel=0.01)
    assert w.quantile(T0 + 0.5, 0.5) == pytest.approx(10.0, rel=0.01)
    w.add_many(T0 + 1, [1.0] * 5)
    assert w.quantile(T0 + 1, 0.01) == pytest.approx(1.0, rel=0.01)
    assert w.quantile(T0 + 3, 0.99) == pytest.approx(1.0, rel=0.01)  # T0's interval left
    assert w.quantile(T0 + 4, 0.99) is None


# (id, readings, their utilization, convertBelow %)
MARGINS: list[tuple[str, int, float, float]] = [
    ("busy", 100, 30.0, 20.0),
    ("just-above", 100, 20.5, 20.0),
    ("at-the-limit", 100, 20.0, 20.0),
    ("below", 100, 10.0, 20.0),
    ("one-reading", 1, 90.0, 20.0),
    ("many-readings", 5000, 55.0, 20.0),
    ("idle-pool", 50, 0.0, 5.0),
    ("never-converts", 50, 0.0, 0.0),
    ("no-readings", 0, 0.0, 20.0),
]


@pytest.mark.parametrize(
    ("n", "util", "below"), [c[1:] for c in MARGINS], ids=[c[0] for c in MARGINS]
)
def test_the_pool_mean_stays_up_for_its_margin(n: int, util: float, below: float) -> None:
    """After ``convert_margin`` more readings at 0 % (the most any can pull the mean down) the
    pool still does not convert; a margin of ``-1`` is a pool that converts now."""
    mig = policy("down").spec.mig
    assert mig is not None
    mig = mig.model_copy(update={"convert_below": below / 100.0})
    w = UtilizationWindow(window_s=300.0, interval_s=10.0)
    for i in range(n):
        w.add(T0 + (i % 10), util)
    margin = convert_margin(mig, w, T0 + 9)
    assert (margin < 0) == converts_below(mig, w, T0 + 9)
    assert (margin < 0) == (n > 0 and util < below)
    if margin < 0:
        return
    for _ in range(min(margin, 100_000)):
        w.add(T0 + 9, 0.0)
    assert not converts_below(mig, w, T0 + 9)
    if below > 0 and margin < 100_000:  # a little past the margin, zeros do bring it down
        for _ in range(margin // 100 + 3):
            w.add(T0 + 9, 0.0)
        assert converts_below(mig, w, T0 + 9)


def test_the_epoch_counts_what_takes_readings_out() -> None:
    """A reading in the newest interval leaves the epoch as it is; one that moves the head on,
    or an interval put whole, moves it."""
    w = UtilizationWindow(window_s=30.0, interval_s=10.0)
    w.add(T0, 50.0)
    epoch = w.epoch
    w.add(T0 + 5, 40.0)
    w.add(T0 - 5, 40.0)  # an older interval gains a reading: nothing leaves
    assert w.epoch == epoch
    w.add(T0 + 10, 40.0)
    assert w.epoch == epoch + 1
    w.put_interval(int(T0 // 10), 10.0, 1, 10.0)
    assert w.epoch == epoch + 2


def _steady_reference(w: ExceedanceWindow, now: float) -> float:
    """:meth:`ExceedanceWindow.steady_until` as first written: every cell looked at."""
    interval, length, head = w._interval, w._length, w._head
    last = int(now // interval)
    first = max(last, head) - length + 1
    ats = [
        slot if slot > last else slot + length
        for slot, n in zip(w._slots, w._n, strict=True)
        if n and slot >= first
    ]
    return min(ats) * interval if ats else INF


def _level_steady_reference(
    w: ExceedanceWindow, now: float, q: float, least: int, level: Level, ahead: int
) -> float:
    """:meth:`ExceedanceWindow.level_steady_until` from the reads it stands for: the level
    read at each of the next ``ahead`` changes, and the change after the last."""
    until = _steady_reference(w, now)
    for _ in range(ahead):
        if until == INF or w.level(until, q, least)[0] != level:
            return until
        until = _steady_reference(w, until)
    return until


@pytest.mark.parametrize("seed", range(40))
def test_the_level_look_ahead_reads_as_its_reads(seed: int) -> None:
    """The window's next change (``steady_until``, probing the oldest slots first when nothing
    was written ahead of the read) is the earliest of its cells' leaving or entering; and one
    scan past it gives what level reads at the next changes (one, two, three or all of them:
    a window of five slots has at most nine) and the change after the last give. Over windows
    written at random slots (ahead of the reads too, and with empty slots between), at reads
    before, at and after the newest slot, for every level."""
    rnd = random.Random(seed)
    interval = rnd.choice([1.0, 60.0, 0.1])
    w = ExceedanceWindow(window_s=5 * interval, interval_s=interval, high=100.0, low=60.0)
    t = 1_000 * interval
    for _ in range(rnd.randrange(0, 12)):
        t += rnd.choice([0.0, 0.3, 1.0, 2.0, 7.0]) * interval
        w.add_many(t, [rnd.uniform(20.0, 160.0) for _ in range(rnd.randrange(1, 30))])
    for now in (t - 2.5 * interval, t - 0.5 * interval, t, t + 0.7 * interval, t + 3 * interval):
        assert w.steady_until(now) == _steady_reference(w, now), now
        for q, least in ((0.99, 1), (0.5, 20), (0.9, 3)):
            for level in ("above", "between", "below", "none"):
                # A read at a 0.1 s slot's boundary may floor into the slot before, which the
                # reference's reads then see again: there only the one-change look is compared.
                for ahead in (1, 2, 3, 1 << 30) if interval >= 1.0 else (1,):
                    want = _level_steady_reference(w, now, q, least, level, min(ahead, 9))
                    got = w.level_steady_until(now, q, least, level, ahead=ahead)
                    assert got == want, (now, q, level, ahead)
