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
from policies.slo import ExceedanceWindow, Level, SloState, classify, step
from policies.windows import LatencyWindow

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
