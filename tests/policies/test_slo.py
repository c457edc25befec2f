"""SLO state machine and exceedance counters: hysteresis, no flapping, exact rank semantics."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.model import SloSpec
from policies.slo import UNBOUNDED, ExceedanceWindow, Level, SloState, classify, step
from policies.windows import LatencyWindow, reads_at_least

SPEC = SloSpec.model_validate(
    {
        "percentile": 99,
        "objectiveMs": 100,
        "breachAfter": "10s",
        "recoverBelow": "80%",
        "recoverAfter": "20s",
    }
)


def drive(levels: list[Level], start: float = 0.0) -> list[SloState]:
    state, out = SloState(), []
    for i, level in enumerate(levels):
        state = step(state, level, start + i, SPEC)
        out.append(state)
    return out


def test_breach_only_after_breach_after() -> None:
    """Above the objective for less than breachAfter is not a breach; exactly breachAfter is."""
    states = drive(["above"] * 12)
    assert [s.state for s in states[:10]] == ["ok"] * 10
    assert states[10].state == "breaching"
    assert states[10].since == 10.0
    assert states[10].breaches == 1


def test_dip_resets_breach_timer() -> None:
    """One tick at or below the objective restarts the breachAfter timer."""
    states = drive(["above"] * 9 + ["between"] + ["above"] * 10)
    assert all(s.state == "ok" for s in states)


def test_recovery_only_after_recover_after() -> None:
    """A breach recovers only after recoverAfter below recoverBelow, not before."""
    states = drive(["above"] * 11 + ["below"] * 25)
    first_ok = next(i for i, s in enumerate(states) if i > 10 and s.state == "ok")
    assert states[11].state == "recovering"
    assert first_ok == 11 + 20


def test_between_in_recovery_returns_to_breach() -> None:
    """Recovering goes back to breaching when the percentile rises above recoverBelow."""
    states = drive(["above"] * 11 + ["below"] * 5 + ["between"])
    assert states[-1].state == "breaching"


@pytest.mark.parametrize("seed", range(5), ids=lambda s: f"seed-{s}")
def test_no_flapping_on_noise_around_objective(seed: int) -> None:
    """P99 jittering ±5% around the objective never flips between ok and breaching repeatedly."""
    rnd = random.Random(seed)
    values = [SPEC.objective_ms * (1 + rnd.uniform(-0.05, 0.05)) for _ in range(600)]
    states = drive([classify(v, SPEC) for v in values])
    transitions = sum(1 for a, b in itertools.pairwise(states) if a.state != b.state)
    assert transitions <= 1  # at most one breach, and never a recovery inside the noise


def test_none_holds_breach() -> None:
    """Missing data never ends a breach."""
    states = drive(["above"] * 11 + ["none"] * 100)
    assert states[-1].state == "breaching"


def test_step_is_pure() -> None:
    """step returns new states and leaves its input unchanged."""
    before = SloState()
    after = step(before, "above", 0.0, SPEC)
    assert before == SloState()
    assert after.pending_since == 0.0


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.floats(min_value=0.0, max_value=1000.0, allow_nan=False), min_size=1, max_size=400
    ),
    q=st.sampled_from([0.5, 0.9, 0.99, 0.999]),
    threshold=st.floats(min_value=1.0, max_value=900.0),
)
def test_exceedance_matches_exact_rank(values: list[float], q: float, threshold: float) -> None:
    """The counters say 'above' exactly when the exact rank-floor(q(n-1)) element exceeds T."""
    w = ExceedanceWindow(window_s=10, interval_s=1, high=threshold, low=threshold / 2)
    for i, v in enumerate(values):
        w.add(100.0 + (i % 10) * 0.5, v)
    level, n = w.level(104.9, q, 1)
    exact = sorted(values)[math.floor(q * (n - 1))]
    assert n == len(values)
    assert (level == "above") == (exact > threshold)


def test_exceedance_slides_like_latency_window() -> None:
    """Counters and the latency window cover exactly the same intervals as time moves on."""
    lw = LatencyWindow(window_s=10, interval_s=1)
    ew = ExceedanceWindow(window_s=10, interval_s=1, high=50, low=40)
    for t in range(30):
        lw.add(float(t), 60.0)
        ew.add(float(t), 60.0)
        for now in (t + 0.5, t + 3.0, t + 12.0):
            assert ew.counts(now)[0] == lw.count(now)


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(min_value=0.0, max_value=400.0, allow_nan=False),
            st.sampled_from([0.0, 99.0, 100.0, 101.0, 101.0101010102, 1e-9]),
        ),
        min_size=1,
        max_size=300,
    ),
    q=st.sampled_from([0.5, 0.9, 0.99, 0.999]),
    batched=st.booleans(),
)
def test_counts_above_the_floor_only_say_what_the_sketch_reads(
    values: list[float], q: float, batched: bool
) -> None:
    """Counted above ``reads_at_least(100)``, the window's exact percentile above it means the
    latency window's sketch reads its percentile at or above 100 (what the scale-down rule
    holds at): a "yes" is never wrong, whatever the values near the boundary; and it is "yes"
    whenever the exact percentile is above it."""
    floor = reads_at_least(100.0)
    ew = ExceedanceWindow(window_s=10, interval_s=1, high=200, low=180, floor=floor)
    lw = LatencyWindow(window_s=10, interval_s=1)
    assert not ew.above_floor(100.0, q)  # the first ask, on an empty ring: counting starts
    now = 100.0 + 10.0  # a full window on: every interval counted
    chunks = [values[i : i + 40] for i in range(0, len(values), 40)] if batched else [values]
    for j, chunk in enumerate(chunks):
        ts = now - 0.5 - (j % 5)
        if batched:
            assert ew.add_many(ts, chunk) >= 0
        else:
            for v in chunk:
                ew.add(ts, v)
        assert lw.add_many(ts, chunk)
    said = ew.above_floor(now, q)
    exact = sorted(values)[math.floor(q * (len(values) - 1))]
    assert said == (exact > floor)
    if said:
        p = lw.quantile(now, q)
        assert p is not None
        assert p >= 100.0


@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0])
def test_the_floor_slack_is_the_most_requests_under_it_the_percentile_stays_above_with(
    q: float,
) -> None:
    """For ``n`` requests, ``above`` of them above the floor: the slack is exactly the most
    requests under the floor that can join them with the element of rank ``floor(q(N - 1))``
    still above it (checked request by request), ``-1`` when it is not above now."""
    rnd = random.Random(7)
    for _ in range(300):
        n = rnd.randint(0, 400)
        above = rnd.randint(0, n)
        ew = ExceedanceWindow(window_s=10, interval_s=1, high=200, low=180, floor=50.0)
        ew.floor_slack(0.0, q)  # counted from here
        if n:
            ew.add_many(0.5, [60.0] * above + [10.0] * (n - above))

        def holds(total: int, above: int = above) -> bool:
            return above >= total - math.floor(q * (total - 1))

        got = ew.floor_slack(0.9, q)
        if n == 0 or not holds(n):
            assert got == -1
        elif q == 1.0:
            assert got == UNBOUNDED
        else:
            assert holds(n + got)
            assert not holds(n + got + 1)
            assert all(holds(n + m) for m in range(0, min(got, 50)))


def test_the_floor_says_nothing_over_intervals_it_did_not_count() -> None:
    """Asked first, moved by a reload, or with an interval put from partials: ``above_floor``
    answers only once the window holds none of the intervals counted otherwise."""
    ew = ExceedanceWindow(window_s=5, interval_s=1, high=200, low=180, floor=50.0)
    for t in range(5):
        ew.add_many(float(t), [80.0] * 10)
    assert not ew.above_floor(4.5, 0.99)  # asked first: counted from slot 5 on
    for t in range(5, 10):
        ew.add_many(float(t), [80.0] * 10)
    assert ew.above_floor(9.5, 0.99)
    ew.refloor(60.0)
    assert not ew.above_floor(9.5, 0.99)  # the new floor counted from slot 10 on
    for t in range(10, 15):
        ew.add_many(float(t), [70.0] * 10)
    assert ew.above_floor(14.5, 0.99)
    ew.refloor(75.0)
    ew.above_floor(14.5, 0.99)
    for t in range(15, 20):
        ew.add_many(float(t), [70.0] * 10)
    assert not ew.above_floor(19.5, 0.99)  # 70 is under 75: counted, and it is no
    for t in range(20, 25):
        ew.add_many(float(t), [90.0] * 10)
    assert ew.above_floor(24.5, 0.99)
    assert ew.put_interval(24, 10, 0, 0)
    assert not ew.above_floor(24.5, 0.99)  # partials carry no floor count
    assert ew.above_floor(29.5 + 5, 0.99) is False  # empty window: nothing to say
    # a histogram whose last bound is under the floor: its overflow may read under it
    ew.add_histogram(30.0, [50.0, 70.0], [1, 1, 5])
    for t in range(31, 40):
        ew.add_many(float(t), [90.0] * 10)
    assert not ew.above_floor(39.5, 0.99)


def step_reference(state: SloState, level: Level, now: float, spec: SloSpec) -> SloState:
    """The state machine as first written (with ``dataclasses.replace``), to compare against,
    with the stale state added the same plain way."""
    if state.state == "stale":
        if level == "none":
            return state
        state = SloState("ok", now, None, state.breaches, "none")
    if state.state in ("breaching", "recovering") and level != "none":
        state = replace(state, quiet_since=None)
    if state.state == "breaching" and level == "none":
        return _reference_quiet(replace(state, last_level=level), now, spec)
    if state.state == "recovering" and level == "none":
        start = state.pending_since if state.pending_since is not None else now
        if now - start >= spec.recover_after:
            return SloState("ok", now, None, state.breaches, level)
        return _reference_quiet(replace(state, last_level=level), now, spec)
    s = replace(state, last_level=level)
    if s.state == "ok":
        if level != "above":
            return replace(s, pending_since=None)
        start = s.pending_since if s.pending_since is not None else now
        if now - start >= spec.breach_after:
            return SloState("breaching", now, None, s.breaches + 1, level)
        return replace(s, pending_since=start)
    if s.state == "breaching":
        if level == "below":
            if spec.recover_after <= 0:
                return SloState("ok", now, None, s.breaches, level)
            return replace(s, state="recovering", since=now, pending_since=now)
        return s
    if level in ("above", "between"):
        return replace(s, state="breaching", since=now, pending_since=None)
    start = s.pending_since if s.pending_since is not None else now
    if now - start >= spec.recover_after:
        return SloState("ok", now, None, s.breaches, level)
    return s


def _reference_quiet(s: SloState, now: float, spec: SloSpec) -> SloState:
    quiet = s.quiet_since if s.quiet_since is not None else now
    if now - quiet >= spec.stale_after:
        return SloState("stale", now, None, s.breaches, "none")
    return replace(s, quiet_since=quiet)


@settings(max_examples=300, deadline=None)
@given(
    levels=st.lists(st.sampled_from(["above", "between", "below", "none"]), max_size=80),
    recover_after=st.sampled_from(["0s", "3s", "20s"]),
    stale_after=st.sampled_from(["1s", "4s", "5m"]),
)
def test_step_matches_reference(levels: list[Level], recover_after: str, stale_after: str) -> None:
    """The allocation-free step gives the same state as the reference at every tick."""
    spec = SloSpec.model_validate(
        {
            "percentile": 99,
            "objectiveMs": 100,
            "breachAfter": "3s",
            "recoverAfter": recover_after,
            "staleAfter": stale_after,
        }
    )
    got = want = SloState()
    for i, level in enumerate(levels):
        got, want = step(got, level, float(i), spec), step_reference(want, level, float(i), spec)
        assert got == want


STALE_SPEC = SPEC.model_copy(update={"stale_after": 5.0})
# Ticks one second apart from 0; ``above * 11`` breaches at 10.
STALE_CASES: dict[str, tuple[list[Level], str, float | None]] = {
    "breaching-silent-for-staleAfter-is-stale": (["above"] * 11 + ["none"] * 6, "stale", 16.0),
    "breaching-silent-less-than-staleAfter-holds": (
        ["above"] * 11 + ["none"] * 5,
        "breaching",
        10.0,
    ),
    "a-verdict-restarts-the-silence": (
        ["above"] * 11 + ["none"] * 4 + ["between"] + ["none"] * 4,
        "breaching",
        10.0,
    ),
    "recovering-silent-keeps-counting-to-ok": (
        ["above"] * 11 + ["below"] * 3 + ["none"] * 30,
        "stale",
        19.0,
    ),
    "stale-holds-without-verdict": (["above"] * 11 + ["none"] * 40, "stale", 16.0),
    "stale-then-below-is-ok": (["above"] * 11 + ["none"] * 6 + ["below"], "ok", 17.0),
    "stale-then-above-is-ok-until-breachAfter": (
        ["above"] * 11 + ["none"] * 6 + ["above"] * 10,
        "ok",
        17.0,
    ),
    "stale-then-above-for-breachAfter-breaches": (
        ["above"] * 11 + ["none"] * 6 + ["above"] * 11,
        "breaching",
        27.0,
    ),
    "ok-silent-stays-ok": (["below"] * 3 + ["none"] * 30, "ok", None),
}


@pytest.mark.parametrize(("levels", "want", "since"), STALE_CASES.values(), ids=STALE_CASES.keys())
def test_stale(levels: list[Level], want: str, since: float | None) -> None:
    """No verdict for staleAfter ends a breach or a recovery as stale; a verdict judges afresh."""
    state = SloState()
    for i, level in enumerate(levels):
        state = step(state, level, float(i), STALE_SPEC)
    assert (state.state, state.since) == (want, since)


def test_recovering_silent_recovers_when_recover_after_is_shorter() -> None:
    """Recovering keeps counting through silence: with recoverAfter under staleAfter it ends ok."""
    spec = SPEC.model_copy(update={"stale_after": 60.0})
    state = SloState()
    for i, level in enumerate(["above"] * 11 + ["below"] * 3 + ["none"] * 30):
        state = step(state, level, float(i), spec)
    assert (state.state, state.since) == ("ok", 31.0)
