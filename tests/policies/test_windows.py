"""Sliding windows: quantile accuracy per latency form, sliding and lateness, bounded memory,
read caching, and windowed GPU/pool utilization."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from ddsketch import LogCollapsingLowestDenseDDSketch
from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import CollapsingLowestDenseStore
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.windows import LatencyWindow, UtilizationWindow
from streams.events import InferenceLatency, LatencyHistogram

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a whole number of seconds
ALPHA = 0.01
EPS = 1e-12  # float rounding on top of the sketch's bound
QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0)

# -- builders ----------------------------------------------------------------------------------


def allocated_bins(w: LatencyWindow) -> int:
    """Sketch bins the window holds in its ring and read caches: at most
    ``(intervals + 2) * bin_limit``, whatever was observed (the running sum holds at most
    ``bin_limit`` bins and the merge caches are dropped while it is in use, and the other way
    round). Reads private state on purpose: the bound is on that state."""
    cache = w._cold[0].length() + w._full_store.length() + len(w._agg)
    return sum(c.store.length() for c in w._cells) + cache


def latency(ts: float, **form: Any) -> InferenceLatency:
    """An event carrying one latency form: ``latency_ms=``, ``samples_ms=`` or ``histogram=``."""
    return InferenceLatency(ts=ts, service="chat", **form)


def hist(bounds: Sequence[float], counts: Sequence[int]) -> LatencyHistogram:
    return LatencyHistogram(bounds_ms=list(bounds), counts=list(counts))


def window(**overrides: Any) -> LatencyWindow:
    """A 60 s window of 1 s intervals unless told otherwise."""
    return LatencyWindow(**({"window_s": 60.0, "interval_s": 1.0} | overrides))


def exact(values: Sequence[float], q: float) -> float:
    """The element DDSketch targets: rank floor(q * (n - 1)) of the sorted values."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def rel_err(got: float, want: float) -> float:
    return abs(got - want) / want if want else abs(got)


Dataset = Callable[[random.Random, int], list[float]]
DATASETS: dict[str, Dataset] = {
    "uniform": lambda rng, n: [rng.uniform(1.0, 1000.0) for _ in range(n)],
    "lognormal": lambda rng, n: [rng.lognormvariate(math.log(50.0), 1.0) for _ in range(n)],
    # Shape 1.2: infinite variance, P99 ~ 46x the scale.
    "pareto": lambda rng, n: [10.0 * rng.paretovariate(1.2) for _ in range(n)],
}

#: Histogram bounds 10% apart from 0.1 ms to ~2 minutes: a resolution of 10%.
RESOLUTION = 0.10
BOUNDS = [0.1 * (1 + RESOLUTION) ** i for i in range(int(math.log(1.2e6) / math.log(1.1)) + 1)]


def bucketed(values: Sequence[float], bounds: Sequence[float]) -> list[int]:
    """Counts per bucket as a producer computes them: value <= bounds[i], overflow last."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    return counts


def upper_bound(x: float, bounds: Sequence[float]) -> float:
    """The value the window records for ``x`` seen through the histogram."""
    return bounds[min(bisect.bisect_left(bounds, x), len(bounds) - 1)]


def feed(w: LatencyWindow, form: str, values: list[float], rng: random.Random) -> None:
    """Feed ``values`` in the given form, out of order over the 60 s window starting at T0."""
    if form == "single":
        for v in values:
            assert w.observe(latency(T0 + rng.uniform(0, 60), latency_ms=v))
    elif form == "batch":
        for i in range(0, len(values), 100):
            assert w.observe(latency(T0 + rng.uniform(0, 60), samples_ms=values[i : i + 100]))
    else:
        for i in range(0, len(values), 500):
            counts = bucketed(values[i : i + 500], BOUNDS)
            assert w.observe(latency(T0 + rng.uniform(0, 60), histogram=hist(BOUNDS, counts)))


# -- accuracy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["single", "batch"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_quantiles_within_relative_accuracy(dataset: str, form: str) -> None:
    """P50 and P99 merged over 60 intervals are within the sketch's relative accuracy."""
    rng = random.Random(7)
    values = DATASETS[dataset](rng, 20_000)
    w = window()
    feed(w, form, values, rng)
    now = T0 + 59.9
    assert w.count(now) == len(values)
    for q in (0.5, 0.99):
        got = w.quantile(now, q)
        assert got is not None
        assert rel_err(got, exact(values, q)) <= ALPHA + EPS, (q, got, exact(values, q))


@pytest.mark.parametrize("dataset", DATASETS)
def test_histogram_quantiles_within_bucket_resolution(dataset: str) -> None:
    """Histogram quantiles are the bucket's upper bound (within alpha) and so err high by at most
    the bucket resolution."""
    rng = random.Random(11)
    values = DATASETS[dataset](rng, 20_000)
    w = window()
    feed(w, "histogram", values, rng)
    now = T0 + 59.9
    assert w.count(now) == len(values)
    for q in (0.5, 0.99):
        got, want = w.quantile(now, q), exact(values, q)
        assert got is not None
        assert rel_err(got, upper_bound(want, BOUNDS)) <= ALPHA + EPS
        assert -ALPHA - EPS <= (got - want) / want <= (1 + RESOLUTION) * (1 + ALPHA) - 1 + EPS


def test_histogram_bucket_representation() -> None:
    """A bucket counts at its upper bound, the overflow just above the last bound (a floor,
    :meth:`above_bound` says so), a zero bound as 0."""
    w = window()
    w.add_histogram(T0, [10.0, 20.0, 50.0], [0, 2, 0, 3])
    assert w.quantile(T0, 0.0) == pytest.approx(20.0, rel=ALPHA)
    for q in (0.5, 1.0):
        over = w.quantile(T0, q)
        assert over is not None
        assert 50.0 < over <= 50.0 * (1 + 2 * ALPHA) ** 2
        assert w.above_bound(T0, q) == 50.0
    assert w.above_bound(T0, 0.0) is None
    z = window()
    z.add_histogram(T0, [0.0, 10.0], [3, 1, 0])
    assert z.quantile(T0, 0.5) == 0.0
    assert z.quantile(T0, 1.0) == pytest.approx(10.0, rel=ALPHA)
    assert z.count(T0) == 4


def test_histogram_bounds_change_between_events() -> None:
    """A producer switching bounds gets its new buckets, not the cached keys of the old ones."""
    w = window()
    w.add_histogram(T0, [10.0, 100.0], [0, 4, 0])
    w.add_histogram(T0, [1000.0, 2000.0], [0, 4, 0])
    assert w.quantile(T0, 0.0) == pytest.approx(100.0, rel=ALPHA)
    assert w.quantile(T0, 1.0) == pytest.approx(2000.0, rel=ALPHA)


LATENCIES = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=3.6e6))


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.floats(min_value=0.0, max_value=3.6e6), min_size=1, max_size=200),
    batch=st.booleans(),
)
def test_fast_path_matches_ddsketch_add(values: list[float], batch: bool) -> None:
    """The inlined write path gives exactly the quantiles of ``DDSketch.add``, tiny values and
    collapsing included."""
    w = window(bin_limit=64)
    ref = LogCollapsingLowestDenseDDSketch(ALPHA, 64)
    if batch:
        w.add_many(T0, values)
    else:
        for v in values:
            w.add(T0, v)
    for v in values:
        ref.add(v)
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
        want = ref.get_quantile_value(q)
        assert w.quantile(T0, q) == (None if want is None else float(want))


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.floats(min_value=0.0, max_value=299.99), LATENCIES), min_size=1)
)
def test_tail_read_across_few_intervals_matches_one_sketch(
    events: list[tuple[float, float]],
) -> None:
    """A window of five 1-minute intervals (a tail percentile read by walking keys across
    them) gives what one sketch of all its values gives, at both tails."""
    w = window(window_s=300.0, interval_s=60.0)
    ref = LogCollapsingLowestDenseDDSketch(ALPHA, 2048)
    for dt, v in events:
        assert w.add(T0 + dt, v)
        ref.add(v)
    for q in (0.0, 0.01, 0.1, 0.9, 0.95, 0.99, 0.999, 1.0):
        want = ref.get_quantile_value(q)
        assert w.quantile(T0 + 299.99, q) == (None if want is None else float(want)), q


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.tuples(st.floats(min_value=0.0, max_value=59.99), LATENCIES), min_size=1))
def test_merged_intervals_match_one_sketch(events: list[tuple[float, float]]) -> None:
    """Merging per-interval stores on read gives what one sketch of all values gives."""
    w = window()
    ref = LogCollapsingLowestDenseDDSketch(ALPHA, 2048)
    for dt, v in events:
        assert w.add(T0 + dt, v)
        ref.add(v)
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        want = ref.get_quantile_value(q)
        assert w.quantile(T0 + 59.99, q) == (None if want is None else float(want))


# -- sliding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "counted"),
    [
        pytest.param(T0 + 0.5, True, id="same-interval"),
        pytest.param(T0 + 9.99, True, id="last-interval-of-window"),
        pytest.param(T0 + 10.0, False, id="interval-expired"),
        pytest.param(T0 + 500.0, False, id="long-after"),
        pytest.param(T0 - 0.01, False, id="before-the-event"),
    ],
)
def test_expiry_by_read_time(now: float, counted: bool) -> None:
    """A read covers the intervals starting within (now - window, now], with no write needed."""
    w = window(window_s=10.0)
    w.add(T0 + 0.5, 42.0)
    assert w.count(now) == (1 if counted else 0)
    assert (w.quantile(now, 0.5) is not None) is counted
    assert (w.oldest(now) == T0) is counted


def test_late_events_rejected_and_counted() -> None:
    """Events older than the ring's head minus the window are refused and counted, per event."""
    w = window(window_s=10.0)
    assert w.observe(latency(T0 + 100.0, latency_ms=1.0))
    assert not w.observe(latency(T0 + 90.0, latency_ms=1.0))
    assert not w.observe(latency(T0 + 80.0, samples_ms=[1.0, 2.0, 3.0]))
    assert not w.observe(latency(T0 + 5.0, histogram=hist([10.0], [1, 1])))
    assert w.late == 3
    assert w.observe(latency(T0 + 91.0, latency_ms=1.0))
    assert w.count(T0 + 100.0) == 2


def test_out_of_order_within_window_accepted() -> None:
    """An event behind the head but inside the ring lands in its own interval."""
    w = window(window_s=10.0)
    w.add(T0 + 9.0, 100.0)
    assert w.add(T0 + 2.0, 1.0)
    assert w.late == 0
    assert w.oldest(T0 + 9.0) == T0 + 2.0
    assert w.quantile(T0 + 9.0, 0.0) == pytest.approx(1.0, rel=ALPHA)
    assert w.count(T0 + 12.5) == 1  # T0+2's interval has left a read at T0+12.5


def test_a_window_trusts_event_time() -> None:
    """A newer event moves the head however far ahead: what it leaves behind is gone and later
    arrivals are late. That is why the engine bounds event time by its clock (see
    ``test_engine_inputs.py::test_a_fast_clock_cannot_blind_a_window``)."""
    w = window(window_s=10.0)
    w.add(T0, 5.0)
    w.add(T0 + 1000.0, 7.0)
    assert w.count(T0 + 5.0) == 0
    assert not w.add(T0 + 1.0, 5.0)
    assert w.quantile(T0 + 1000.0, 0.5) == pytest.approx(7.0, rel=ALPHA)


def test_reads_see_every_write() -> None:
    """The read cache is invalidated by writes to the newest and to older intervals."""
    w = window()
    w.add(T0 + 10.0, 10.0)
    now = T0 + 10.5
    assert w.quantile(now, 1.0) == pytest.approx(10.0, rel=ALPHA)
    w.add(T0 + 10.2, 20.0)  # newest interval
    assert w.quantile(now, 1.0) == pytest.approx(20.0, rel=ALPHA)
    w.add(T0 + 1.0, 30.0)  # an older interval: the cached merge of older ones is stale
    assert w.quantile(now, 1.0) == pytest.approx(30.0, rel=ALPHA)
    w.add(T0 + 2.0, 0.0)
    assert w.quantile(now, 0.0) == 0.0
    assert w.count(now) == 4
    assert w.quantile(T0 + 61.5, 1.0) == pytest.approx(20.0, rel=ALPHA)  # T0+1 has expired


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.floats(0.0, 60.0), LATENCIES),
            st.tuples(st.just("read"), st.floats(0.0, 60.0), st.just(0.0)),
        ),
        max_size=60,
    )
)
def test_sliding_matches_reference_model(ops: list[tuple[str, float, float]]) -> None:
    """Against a model of the spec: lateness, count, oldest and quantiles after any sequence."""
    w = window(window_s=5.0)
    kept: list[tuple[int, float]] = []  # (slot, value) of accepted writes
    head, late = None, 0
    for op, dt, value in ops:
        slot = math.floor(T0 + dt)
        if op == "add":
            accepted = head is None or slot > head - 5
            assert w.add(T0 + dt, value) is accepted
            if accepted:
                head = slot if head is None else max(head, slot)
                kept.append((slot, value))
            else:
                late += 1
            continue
        seen = [
            (s, v) for s, v in kept if slot - 5 < s <= slot and head is not None and s > head - 5
        ]
        assert w.count(T0 + dt) == len(seen)
        assert w.oldest(T0 + dt) == (min(s for s, _ in seen) if seen else None)
        ref = LogCollapsingLowestDenseDDSketch(ALPHA, 2048)
        for _, v in seen:
            ref.add(v)
        want = ref.get_quantile_value(0.5)
        assert w.quantile(T0 + dt, 0.5) == (None if want is None else float(want))
    assert w.late == late


def merged_reference(
    per_slot: dict[int, tuple[Any, int]], first: int, last: int, bin_limit: int
) -> BaseDDSketch:
    """What merging the covered intervals' stores oldest first gives (the defining read)."""
    store = CollapsingLowestDenseStore(bin_limit)
    zeros = 0
    for slot in sorted(per_slot):
        if first <= slot <= last:
            sketch, z = per_slot[slot]
            store.merge(sketch._store)
            zeros += z
    return BaseDDSketch(
        mapping=LogarithmicMapping(ALPHA),
        store=store,
        negative_store=CollapsingLowestDenseStore(bin_limit),
        zero_count=float(zeros),
    )


@settings(max_examples=300, deadline=None)
@given(
    bin_limit=st.sampled_from([16, 64, 2048]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.floats(0.0, 40.0), LATENCIES),
            st.tuples(
                st.just("add"), st.floats(0.0, 40.0), st.sampled_from([0.0, 1.0, 10.0, 50.0, 1e5])
            ),
            st.tuples(st.just("read"), st.floats(0.0, 45.0), st.sampled_from(QS)),
        ),
        max_size=120,
    ),
)
def test_running_sum_reads_match_merged_intervals(
    bin_limit: int, ops: list[tuple[str, float, float]]
) -> None:
    """Reads from the running sum of older intervals give exactly the quantile of merging the
    covered intervals' stores, as writes move the head, recycle, and collapse stores."""
    w = window(window_s=8.0, bin_limit=bin_limit)
    per_slot: dict[int, tuple[Any, int]] = {}
    head: int | None = None
    for op, dt, value in ops:
        slot = math.floor(T0 + dt)
        if op == "add":
            if not w.add(T0 + dt, value):
                continue
            if head is None or slot > head:
                head = slot
                per_slot = {s: v for s, v in per_slot.items() if s > head - 8}
            sketch, zeros = per_slot.get(slot, (None, 0))
            if sketch is None:
                sketch = LogCollapsingLowestDenseDDSketch(ALPHA, bin_limit)
            if value > sketch._mapping.min_possible:
                sketch.add(value)
            else:
                zeros += 1
            per_slot[slot] = (sketch, zeros)
            continue
        if head is None:
            assert w.quantile(T0 + dt, value) is None
            continue
        last = min(slot, head)
        ref = merged_reference(per_slot, max(slot, head) - 7, last, bin_limit)
        want = ref.get_quantile_value(value) if ref.count else None
        got = w.quantile(T0 + dt, value)
        assert got == (None if want is None else float(want))
        assert allocated_bins(w) <= (8 + 2) * bin_limit


def test_expired_intervals_leave_the_running_sum() -> None:
    """A value read once and then expired no longer counts, even between the live values."""
    w = window(window_s=3.0)
    w.add(T0 + 0.5, 50.0)
    for t in range(1, 3):
        w.add(T0 + t + 0.5, 10.0)
        w.add(T0 + t + 0.5, 100.0)
        assert w.quantile(T0 + t + 0.6, 0.5) == pytest.approx(50.0, rel=ALPHA)
    for t in range(3, 6):
        w.add(T0 + t + 0.5, 10.0)
        w.add(T0 + t + 0.5, 100.0)
        assert w.quantile(T0 + t + 0.6, 0.5) == pytest.approx(10.0, rel=ALPHA)
        assert w.quantile(T0 + t + 0.6, 0.2) == pytest.approx(10.0, rel=ALPHA)


# -- memory ------------------------------------------------------------------------------------


def test_memory_bounded_under_millions_of_values() -> None:
    """Two million values over 12 decades and 40 s keep bins under the limit, P99 accurate."""
    rng = random.Random(3)
    w = window(window_s=10.0, bin_limit=256)
    in_window: list[float] = []
    for second in range(40):
        for _ in range(5):
            batch = [10.0 ** rng.uniform(-6.0, 6.5) for _ in range(10_000)]
            assert w.add_many(T0 + second + 0.5, batch)
            if second >= 30:
                in_window.extend(batch)
        assert w.intervals == 10
        assert allocated_bins(w) <= (10 + 2) * 256
        w.quantile(T0 + second + 0.5, 0.99)
    now = T0 + 39.9
    assert w.count(now) == len(in_window) == 500_000
    got = w.quantile(now, 0.99)
    assert got is not None
    assert rel_err(got, exact(in_window, 0.99)) <= ALPHA + EPS
    assert allocated_bins(w) <= (10 + 2) * 256


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(min_value=0.0, max_value=1e7, allow_nan=False), max_size=50),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([16, 2048]),
)
def test_add_many_is_add_one_by_one(batches: list[list[float]], bin_limit: int) -> None:
    """A batch (the C-level path when its keys fit the bins laid out, the loop otherwise)
    leaves every interval's bins, key range, count and zeros as adding its values one by one
    does, across fresh intervals, widened ranges, growth and collapse."""
    many, one = window(bin_limit=bin_limit), window(bin_limit=bin_limit)
    for i, batch in enumerate(batches):
        ts = T0 + 3.0 * (i // 2)  # two batches an interval, then a fresh one
        assert many.add_many(ts, batch)
        for v in batch:
            assert one.add(ts, v)
    for a, b in zip(many.held_intervals(), one.held_intervals(), strict=True):
        assert (a[0], a[2], a[1].count, a[1].is_collapsed) == (
            b[0],
            b[2],
            b[1].count,
            b[1].is_collapsed,
        )
        if a[1].count:
            assert (a[1].min_key, a[1].max_key) == (b[1].min_key, b[1].max_key)
            keys = range(a[1].min_key, a[1].max_key + 1)
            assert [a[1].bins[k - a[1].offset] for k in keys] == [
                b[1].bins[k - b[1].offset] for k in keys
            ]


def test_ring_recycles_intervals() -> None:
    """A thousand intervals of writes hold no more than the ring's intervals."""
    w = window(window_s=5.0, bin_limit=128)
    for second in range(1000):
        w.add_many(T0 + second, [1.0, 1e3, 1e6])
    assert w.intervals == 5
    assert w.count(T0 + 999.0) == 15
    assert allocated_bins(w) <= (5 + 2) * 128


# -- inputs ------------------------------------------------------------------------------------


def test_inputs_not_mutated() -> None:
    """Batches and histograms handed to the window are left as they were."""
    samples = [3.0, 1.0, 2.0]
    bounds, counts = [1.0, 2.0], [1, 2, 3]
    w = window()
    w.add_many(T0, samples)
    w.add_histogram(T0, bounds, counts)
    assert (samples, bounds, counts) == ([3.0, 1.0, 2.0], [1.0, 2.0], [1, 2, 3])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(lambda w: w.add(T0, -1.0), "non-negative", id="negative-latency"),
        pytest.param(lambda w: w.add(T0, math.nan), "non-negative", id="nan-latency"),
        pytest.param(lambda w: w.add(T0, math.inf), "finite", id="infinite-latency"),
        pytest.param(lambda w: w.add(math.nan, 1.0), "ts must be finite", id="nan-ts"),
        pytest.param(lambda w: w.add_many(math.inf, [1.0]), "ts must be finite", id="inf-ts"),
        pytest.param(lambda w: w.add_many(T0, [1.0, -2.0]), "non-negative", id="bad-in-batch"),
        pytest.param(
            lambda w: w.add_histogram(T0, [2.0, 1.0], [0, 0, 0]), "increasing", id="bounds-down"
        ),
        pytest.param(
            lambda w: w.add_histogram(T0, [1.0], [0, 0, 0]), "counts needs", id="counts-length"
        ),
        pytest.param(
            lambda w: w.add_histogram(T0, [1.0], [1, -1]), "non-negative", id="negative-count"
        ),
        pytest.param(lambda w: w.add_histogram(T0, [], [1]), "empty", id="no-bounds"),
        pytest.param(lambda w: w.quantile(T0, 1.5), "within", id="q-above-1"),
        pytest.param(lambda w: w.quantile(T0, math.nan), "within", id="q-nan"),
    ],
)
def test_invalid_input_raises(call: Callable[[LatencyWindow], object], match: str) -> None:
    """Programming errors raise ValueError, saying what is wrong, instead of corrupting state."""
    with pytest.raises(ValueError, match=match):
        call(window())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"window_s": 10.0, "interval_s": 3.0}, "multiple", id="not-a-multiple"),
        pytest.param({"window_s": 0.0, "interval_s": 1.0}, "window_s", id="zero-window"),
        pytest.param({"window_s": 10.0, "interval_s": -1.0}, "interval_s", id="neg-interval"),
        pytest.param({"window_s": 1.0, "interval_s": 10.0}, "multiple", id="interval-too-big"),
        pytest.param({"window_s": 6.0, "interval_s": 1.0, "bin_limit": 0}, "bin", id="no-bins"),
        pytest.param(
            {"window_s": 6.0, "interval_s": 1.0, "relative_accuracy": 1.0},
            "[Aa]ccuracy",
            id="accuracy-1",
        ),
    ],
)
def test_invalid_configuration_raises(kwargs: dict[str, Any], match: str) -> None:
    """A window that cannot be built as asked refuses to be built."""
    with pytest.raises(ValueError, match=match):
        LatencyWindow(**kwargs)


# -- utilization -------------------------------------------------------------------------------


def util(readings: Sequence[tuple[float, float]], **overrides: Any) -> UtilizationWindow:
    """A 60 s / 1 s utilization window fed ``(seconds after T0, percent)`` readings."""
    w = UtilizationWindow(**({"window_s": 60.0, "interval_s": 1.0} | overrides))
    for dt, pct in readings:
        w.add(T0 + dt, pct)
    return w


@pytest.mark.parametrize(
    ("readings", "now", "mean", "peak", "oldest"),
    [
        pytest.param([], 0.0, None, None, None, id="empty"),
        pytest.param([(0.0, 40.0)], 0.0, 40.0, 40.0, T0, id="one-reading"),
        pytest.param([(0.0, 10.0), (0.5, 30.0), (5.0, 80.0)], 5.0, 40.0, 80.0, T0, id="three"),
        pytest.param([(5.0, 80.0), (0.0, 10.0)], 5.0, 45.0, 80.0, T0, id="out-of-order"),
        pytest.param([(0.0, 100.0), (61.0, 20.0)], 61.0, 20.0, 20.0, T0 + 61, id="expired"),
        pytest.param([(0.0, 100.0)], 200.0, None, None, None, id="all-expired"),
    ],
)
def test_utilization_mean_max_oldest(
    readings: list[tuple[float, float]],
    now: float,
    mean: float | None,
    peak: float | None,
    oldest: float | None,
) -> None:
    """Windowed mean, max and oldest over the readings still in the window."""
    w = util(readings)
    assert w.mean(T0 + now) == (None if mean is None else pytest.approx(mean))
    assert w.max(T0 + now) == peak
    assert w.oldest(T0 + now) == oldest


def test_utilization_late_rejected() -> None:
    """A reading older than the ring is refused and counted."""
    w = util([(100.0, 50.0)], window_s=10.0)
    assert not w.add(T0 + 90.0, 99.0)
    assert w.late == 1
    assert w.max(T0 + 100.0) == 50.0


@pytest.mark.parametrize("pct", [-0.1, 100.1, math.nan], ids=["negative", "over-100", "nan"])
def test_utilization_out_of_range_raises(pct: float) -> None:
    """Percentages outside [0, 100] are a caller's bug."""
    with pytest.raises(ValueError, match="util_pct"):
        util([]).add(T0, pct)


@settings(max_examples=150, deadline=None)
@given(
    readings=st.lists(st.tuples(st.floats(0.0, 30.0), st.floats(0.0, 100.0)), max_size=50),
    at=st.floats(0.0, 30.0),
)
def test_utilization_matches_reference_model(
    readings: list[tuple[float, float]], at: float
) -> None:
    """Mean, max and oldest equal those computed directly from the readings a read covers."""
    w = UtilizationWindow(window_s=5.0, interval_s=1.0)
    kept: list[tuple[int, float]] = []
    head: int | None = None
    for dt, pct in readings:
        slot = math.floor(T0 + dt)
        if head is None or slot > head - 5:
            head = slot if head is None else max(head, slot)
            kept.append((slot, pct))
        w.add(T0 + dt, pct)
    now = math.floor(T0 + at)
    seen = [p for s, p in kept if now - 5 < s <= now and head is not None and s > head - 5]
    slots = [s for s, _ in kept if now - 5 < s <= now and head is not None and s > head - 5]
    if not seen:
        assert (w.mean(T0 + at), w.max(T0 + at), w.oldest(T0 + at)) == (None, None, None)
        return
    assert w.mean(T0 + at) == pytest.approx(sum(seen) / len(seen))
    assert w.max(T0 + at) == max(seen)
    assert w.oldest(T0 + at) == min(slots)
