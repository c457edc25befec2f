"""Open-loop replay: a recording through the real engine and a simulated cluster, in event time.

Design:

* **Time is event time.** Ticks fall every ``evaluate_every`` seconds at ``T_k = T_0 + k dt``,
  ``T_0`` being the first accepted event's time rounded up to a multiple of ``dt``. Events are
  observed in file order; before observing one later than the next tick, every tick before it is
  run. A tick is: ``cluster.advance(T)`` (grace periods, pod start-ups, MIG reconfigurations due
  by then), ``engine.evaluate(T, cluster.snapshot())``, ``cluster.apply(decisions)`` (each
  decision and its outcome go to ``decisions.jsonl`` at once), then the accounting of
  :mod:`controller.offline.accounting.summary` and the report's
  :class:`~controller.offline.accounting.timeline.Timeline`.
  After the last event one final tick covers it. Events arriving after their tick are observed
  late, as the live controller would see them.
* **Open loop.** Latency and utilization come from the recording whatever the decisions were;
  only the simulated cluster's allocation follows the decisions (``simulate`` closes the loop).
  A :class:`TickHook` may change that: it sees each batch of events before the loop (and may
  replace some by :class:`Withheld`, which move the clock but reach no engine) and, at each
  tick before the evaluation, gives the engine events of its own made from the simulated
  cluster's state (:mod:`.counterfactual` closes the loop this way).
* **Synchronous.** Reading the file blocks anyway, so the loop is plain code; the port's
  ``async apply`` runs on a private :class:`asyncio.Runner`, only on ticks with decisions.
* **As fast as possible**, or paced: with ``speed`` the tick at ``T`` waits until
  ``(T - T_0) / speed`` wall seconds have passed since the start.
* **Memory independent of the recording's length**: events are streamed a batch at a time
  (:mod:`controller.offline.replay.source`), the engine's windows and the accounting are bounded by
  the
  policy's services and the cluster's GPUs, decisions are written as they happen, the time
  series are downsampled to a fixed number of points, and breaches listed are capped.
* **The hot loop** does per event: a type check, a comparison with the next tick, the engine's
  ``observe`` and, for utilization, the pool meter's ``report``
  (:mod:`controller.offline.accounting.poolmeter`:
  one dict lookup and two float updates). Per-tick work follows what changed. A tick the engine says
  is idle (:meth:`~policies.engine.Engine.idle`: no SLO state changes, no rules to run, the pool
  rules quiet) while the simulated cluster's ``advance`` changed nothing is only accounted: no
  ``evaluate``, no snapshot; before the cluster's next due time it is not even advanced. Runs of
  such ticks within a timeline bucket go through one loop with its state in locals
  (:meth:`_Replay._quiet_ticks`); a tick the plot reads at (the first of a bucket among them)
  is accounted in full but not evaluated either (:meth:`_Replay._quiet_sample`). A
  :class:`TickHook` or ``speed`` turns the short ways off (``tests/replay/test_quiet_ticks.py``
  checks they agree).
  Services are accounted when the engine changed their SLO state
  (:meth:`~policies.engine.Engine.changed`), when their breach's peak is due (once per window slot)
  or when the plot samples them; the others' unchanged ticks are accounted in bulk when they next
  change or at the end (:meth:`~controller.offline.accounting.summary.ServiceAccount.repeat`), and
  GPUs by use
  once per timeline bucket or cluster change; plus the pools' utilization, plus windowed percentiles
  (:meth:`~policies.engine.Engine.quantile`: a running sum of the window's older intervals plus the
  newest, cheap to read but not free), still rationed: for the plot, at most
  :data:`READS_PER_SAMPLE` services a tick, a share of them on each of a few ticks of a timeline
  bucket so that each is read once a bucket (while buckets are narrower than the shares, one
  share a bucket in turn); for a breach's peak, once per window slot while the service is above
  its objective. A replay told its recording's span (``replay(span=…)``: the inferred cluster's
  scan measured it) starts its buckets as wide as they end, so none of those reads goes into a
  narrow bucket later merged.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Protocol

import msgspec

from controller.loop.gate import SafetyGate
from controller.loop.tick import Loop, run_now
from controller.offline.accounting.outputs import (
    DECISIONS_FILE,
    RunResult,
    clear_outputs,
    count_action,
    decision_line,
    settle_flows,
)
from controller.offline.accounting.poolmeter import PoolMeter
from controller.offline.accounting.summary import USES, PoolAccount, Summary, sample_reclaimable
from controller.offline.accounting.timeline import Timeline
from controller.offline.replay.source import SourceStats, read_event_batches
from controller.simcluster import GpuUse, SimCluster
from controller.simcluster.sim_runtime import SimRuntime
from policies.engine import Engine
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, EventDecoder, GpuUtilization, InferenceLoad, Rejection

__all__ = ["ReplaySettings", "TickHook", "Withheld", "replay"]

#: Most windowed percentiles read for the plot per tick.
READS_PER_SAMPLE: Final = 16
#: Allocations between young-generation collections during a replay (Python's default: 700).
GC_THRESHOLD: Final = 20_000


#: What :meth:`_Replay._quiet_ticks` reads: the timeline, the simulated cluster, the engine's
#: ``idle`` and ``advance``, the pool meter's sums and counts, the pools' utilization cells,
#: ``t0`` and ``dt``.
_QuietEnv = tuple[
    Timeline,
    SimCluster,
    Callable[[float, Snapshot], bool],
    Callable[[float], None],
    list[float],
    list[int],
    list[tuple[int, list[float], list[int], PoolAccount]],
    float,
    float,
]


@dataclass(frozen=True, slots=True)
class Withheld:
    """An event a :class:`TickHook` keeps from the engine: it still advances the replay's
    clock, so ticks fall where they would have."""

    ts: float


class TickHook(Protocol):
    """Changes what the engine sees (see the module docstring)."""

    def filter(self, batch: list[Event | Rejection]) -> Sequence[Event | Rejection | Withheld]:
        """The batch the loop observes (called once per batch, before any of its events)."""
        ...

    def tick(self, now: float, snapshot: Snapshot) -> Sequence[Event]:
        """Events stamped ``now`` for the engine, before it evaluates at ``now``."""
        ...


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    evaluate_every: float = 1.0
    """Seconds of event time between evaluations."""
    speed: float | None = None
    """Event seconds per wall second; ``None``: as fast as possible."""
    points: int = 600
    """Most points per time series in the report."""


class _Replay:
    def __init__(
        self,
        policy: Policy,
        cluster: Callable[[float], SimCluster],
        *,
        decisions: IO[bytes],
        settings: ReplaySettings,
        hook: TickHook | None = None,
        span: tuple[float, float] | None = None,
    ) -> None:
        s = settings
        self.hook = hook
        self.span = span
        self.policy = policy
        self.engine = Engine(policy)
        self.make_cluster = cluster
        self.cluster: SimCluster | None = None
        self.loop: Loop | None = None
        #: The simulated cluster's next due time as of the last tick that asked it: a quiet
        #: tick before then need not advance it (see :meth:`_quiet`).
        self.cluster_due = -math.inf
        self.dt = s.evaluate_every
        self.speed = s.speed
        self.points = s.points
        self.summary = Summary.for_policy(policy, policy.sha256(), self.dt)
        self.timeline: Timeline | None = None
        self.markers: list[dict[str, object]] = []
        self.out = decisions
        self.encode = msgspec.json.Encoder().encode
        self.t0 = 0.0
        self.k = 0
        self.next_tick = -math.inf
        self.wall0 = time.perf_counter()
        pools = policy.spec.pools
        self.pool_names = sorted(pools)
        self.meter = PoolMeter([(p, pools[p].node_selector) for p in self.pool_names])
        self.snap: Snapshot | None = None
        self.services = list(self.summary.services.items())
        self.resolution = {
            f"{spec.namespace}/{name}": spec.slo.resolution
            for name, spec in policy.spec.services.items()
        }
        self.peak_slot: dict[str, int] = {}
        #: Per service (in ``services`` order): its level, and the first tick not yet
        #: accounted (every tick since at that level); the services above their objective,
        #: each with when its breach's peak is read next (the next window slot's start, a
        #: little early: accounting a service at any tick is right, only needless).
        self.index = {key: i for i, (key, _) in enumerate(self.services)}
        self.levels: list[str] = ["none"] * len(self.services)
        self.since = [0] * len(self.services)
        self.above: dict[int, float] = {}
        #: Per service (in ``services`` order): its percentile channel's ``add`` (from
        #: :meth:`_start`).
        self.plot_sinks: list[Callable[[int, float], None]] = []
        #: Per pool: its utilization channel's ``add`` (from :meth:`_start`) and its account;
        #: and for :meth:`_quiet_ticks`, its index, that channel's cells and its account.
        self.util_sinks: list[tuple[Callable[[int, float], None], PoolAccount]] = []
        self.util_cells: list[tuple[int, list[float], list[int], PoolAccount]] = []
        #: What :meth:`_quiet_ticks` reads (from :meth:`_start`), and the quiet ticks it ran
        #: that are not counted yet (:meth:`_count_quiet`).
        self.quiet_env: _QuietEnv | None = None
        self.quiet_held = 0
        #: The GPUs by use per pool (from ``usage``), and the ticks of bucket ``uses_bucket``
        #: not yet accounted with them (see :meth:`_flush_uses`).
        self.usage: Mapping[str, GpuUse] | None = None
        self.uses: list[dict[str, int]] = []
        self.uses_ticks = 0
        self.uses_bucket = 0
        #: The plot reads its services in ``plot_every`` shares (see :meth:`_plot_phase`).
        self.plot_every = max(1, math.ceil(len(self.services) / READS_PER_SAMPLE))

    # -- accounting helpers -----------------------------------------------------------------

    def _refresh_pools(self, snap: Snapshot) -> None:
        """A new snapshot: nodes may have changed pools or layouts (MIG conversion)."""
        self.snap = snap
        self.meter.refresh(snap)

    def _flush_uses(self) -> None:
        """Account the GPUs by use of the ticks since the last flush, all in one bucket and
        with the same use (the simulated cluster's view changes only with its snapshot)."""
        n, tl = self.uses_ticks, self.timeline
        if not n or tl is None:
            return
        for name, uses in zip(self.pool_names, self.uses, strict=True):
            for u, v in uses.items():
                tl.add_many(f"use:{name}:{u}", self.uses_bucket, v, n)
            self.summary.pools[name].hold_uses(uses, n)
        self.uses_ticks = 0

    # -- the loop ---------------------------------------------------------------------------

    def _quiet_ticks(self, ts: float) -> None:
        """Run the ticks before ``ts`` the short way while nothing can change but the accounting:
        not a plot tick (:func:`_plot_width`), the simulated cluster unchanged by ``advance`` and
        the engine idle
        (:meth:`~policies.engine.Engine.idle`: no SLO state changes, no rules to run). Stops at
        the first tick that is not quiet (``next_tick`` is then that tick; its cluster
        ``advance`` done, which the full tick repeats as a no-op). Before the cluster's next due
        time (``SimCluster.next_due``, as of the last tick) ``advance`` would change nothing but
        its clock, which the next full tick's ``advance`` moves on: it is not called.

        One loop with its state in locals, written back when it stops: the sparse day's replay
        is mostly quiet ticks, and a method call per step of each was a sizeable share of it.
        Every tick of a run falls in one timeline bucket ``b`` (the first tick of a bucket is a
        sample tick, never quiet); the pools' utilization is added as :meth:`_end_tick` adds it
        (the same floats in the same order), straight into the channels' cells. The ticks are
        counted (:meth:`_count_quiet`) only before the next tick that is not quiet: a call runs
        about one tick, between two events."""
        k, now = self.k, self.next_tick
        assert self.quiet_env is not None
        tl, cluster, idle, advance, sums, counts, cells, t0, dt = self.quiet_env
        stride = tl.stride
        width = _plot_width(stride, self.plot_every)
        if now >= ts or k % width == 0:
            return  # a plot tick (a sample tick: GPUs by use flushed, every service accounted)
        snap, above, due = self.snap, self.above, self.cluster_due
        assert snap is not None
        b = k // stride
        first = k
        while True:
            if now >= due:
                cluster.advance(now)
                due = self.cluster_due = cluster.next_due()
                if cluster.snapshot() is not snap or cluster.gpus_by_use() is not self.usage:
                    break
            if not idle(now, snap):
                break
            if above:
                self.k = k
                for i in self._peaks_due(now):
                    self._account(i, now, b, phase=None)
            for i, values, reads, account in cells:
                c = counts[i]
                if c:
                    util = sums[i] / c
                    values[b] += util
                    reads[b] += 1
                    account.util_sum += util
                    account.util_ticks += 1
            k += 1
            now = t0 + k * dt
            advance(now)  # events up to the next tick are on time
            if now >= ts or k % width == 0:
                break
        self.k, self.next_tick = k, now
        self.quiet_held += k - first

    def _count_quiet(self) -> None:
        """Count the quiet ticks :meth:`_quiet_ticks` ran since the last count: all in one
        timeline bucket, since the first tick of a bucket is not quiet and counts them first."""
        n = self.quiet_held
        if not n:
            return
        self.quiet_held = 0
        tl, summary = self.timeline, self.summary
        assert tl is not None
        for _, _, _, account in self.util_cells:
            account.ticks += n
        self.uses_bucket = tl.bucket(self.k - 1)  # the timeline's last tick: no new bucket
        self.uses_ticks += n
        summary.last_tick = self.t0 + (self.k - 1) * self.dt  # as the loop worked it out
        summary.ticks += n

    def _tick(self, now: float) -> None:
        self._count_quiet()
        if self.speed is not None:
            delay = self.wall0 + (now - self.t0) / self.speed - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        cluster, engine, summary, loop = self.cluster, self.engine, self.summary, self.loop
        assert cluster is not None
        assert loop is not None
        tl = self.timeline
        assert tl is not None
        hook = self.hook

        def before(snap: Snapshot) -> None:
            if snap is not self.snap:
                self._refresh_pools(snap)
            if hook is not None:
                for event in hook.tick(now, snap):
                    engine.observe(event)
            if tl.is_sample_tick(self.k):
                self._flush_uses()  # before the bucket (and maybe the stride) changes

        results = run_now(loop.tick(now, before=before))
        b = tl.bucket(self.k)
        if results:
            for result in results:
                self.out.write(self.encode(decision_line(result)) + b"\n")
                count_action(result, summary=summary, timeline=tl, bucket=b, markers=self.markers)
            snap = cluster.snapshot()
            if snap is not self.snap:
                self._refresh_pools(snap)
        self._account_changed({self.index[key] for key in engine.changed()}, now, b)
        usage = cluster.gpus_by_use()
        if usage is not self.usage:
            self._flush_uses()
            self.usage = usage
            self.uses = [
                {u: getattr(usage.get(name, GpuUse()), u) for u in USES} for name in self.pool_names
            ]
        self.uses_ticks += 1
        self.uses_bucket = b
        self.cluster_due = cluster.next_due()
        self._end_tick(now, b)

    def _plot_phase(self, k: int) -> int | None:
        """The share of the plot's services tick ``k`` reads (services ``i`` with
        ``i % plot_every`` equal to it), or ``None`` (see :func:`_plot_width`; a bucket's ticks
        after its last share read none)."""
        assert self.timeline is not None
        stride, every = self.timeline.stride, self.plot_every
        width = _plot_width(stride, every)
        if k % width:
            return None
        if stride < every:
            return (k // stride) % every
        phase = (k % stride) // width
        return phase if phase < every else None

    def _account_changed(self, active: set[int], now: float, b: int) -> None:
        """Account the services of ``active`` (those whose SLO state changed), those whose
        breach's peak is due and, on a plot tick, the share of the plot's services it reads.
        The others' level is unchanged: accounted in bulk, later."""
        active.update(self._peaks_due(now))
        phase = self._plot_phase(self.k)
        if phase is not None:
            # The plot's services whose level did not change and is neither above (a breach's
            # peak is read in _account) nor none (no percentile): only their percentile is
            # plotted; their tick is accounted in bulk with the others', later.
            every, levels, quantile, sinks = (
                self.plot_every,
                self.levels,
                self.engine.quantile,
                self.plot_sinks,
            )
            for i in range(phase, len(self.services), every):
                if i in active or levels[i] == "above" or levels[i] == "none":
                    active.add(i)
                    continue
                p = quantile(self.services[i][0], now)
                if p is not None:
                    sinks[i](b, p)
        for i in sorted(active):
            self._account(i, now, b, phase=phase)

    def _quiet_sample(self, now: float) -> bool:
        """Run the plot tick at ``now`` (:func:`_plot_width`; the first of a timeline bucket
        among them) the short way when the cluster is unchanged and the engine idle, as
        :meth:`_quiet_ticks` runs the others: its accounting in full (GPUs by use flushed, the
        plot's share of services; reclaimable GPUs on a bucket's first) but no ``evaluate``,
        which would decide nothing. ``False``, with nothing done but the cluster's
        ``advance``, otherwise."""
        self._count_quiet()
        cluster, tl, snap = self.cluster, self.timeline, self.snap
        assert cluster is not None
        assert tl is not None
        if snap is None:
            return False  # the first tick: nothing indexed yet
        if now >= self.cluster_due:
            cluster.advance(now)
            self.cluster_due = cluster.next_due()
            if cluster.snapshot() is not snap or cluster.gpus_by_use() is not self.usage:
                return False
        if not self.engine.idle(now, snap):
            return False
        self._flush_uses()  # before the bucket (and maybe the stride) changes
        b = tl.bucket(self.k)
        self._account_changed(set(), now, b)
        self.uses_ticks += 1
        self.uses_bucket = b
        self._end_tick(now, b)
        return True

    def _account(self, i: int, now: float, b: int, *, phase: int | None) -> None:
        """Service ``i``'s SLO accounting at the tick ``now`` (in timeline bucket ``b``): its
        unaccounted ticks since it last changed, this tick's level, and a windowed percentile
        when the plot reads it (its share is ``phase``) or its breach enters a new window
        slot."""
        key, acc = self.services[i]
        k, levels, since = self.k, self.levels, self.since
        if since[i] < k:
            acc.repeat(levels[i], k - since[i])
        level = levels[i] = self.engine.slo_state(key).last_level
        since[i] = k + 1
        p = None
        every = self.plot_every
        read = level != "none" and i % every == phase
        if level == "above":
            res = self.resolution[key]
            slot = int(now // res)
            at = (slot + 1) * res
            self.above[i] = at - 1e-12 * abs(at)
            if not acc.in_breach or self.peak_slot.get(key) != slot:
                self.peak_slot[key] = slot
                read = True
        else:
            self.above.pop(i, None)
        if read:
            p = self.engine.quantile(key, now)
            if p is not None:
                self.plot_sinks[i](b, p)
        acc.tick(now, level, p)

    def _peaks_due(self, now: float) -> list[int]:
        """The services above their objective whose breach's peak is read at ``now``."""
        return [i for i, at in self.above.items() if at <= now] if self.above else []

    def _end_tick(self, now: float, b: int) -> None:
        """Every tick's end: the pools' utilization, the tick counted, the clock moved on."""
        tl, summary = self.timeline, self.summary
        assert tl is not None
        pool_util = self.meter.pool_util
        for i, (add, account) in enumerate(self.util_sinks):
            util = pool_util(i)
            if util is not None:
                add(b, util)
            account.tick_util(util)
        if tl.is_sample_tick(self.k):  # reclaimable GPUs: once per bucket, not every tick
            sample_reclaimable(summary, tl, b, self.engine.reclaimable(now))
        if summary.first_tick is None:
            summary.first_tick = now
        summary.last_tick = now
        summary.ticks += 1
        self.k += 1
        self.next_tick = self.t0 + self.k * self.dt
        self.engine.advance(self.next_tick)  # events up to the next tick are on time

    def _start(self, ts: float) -> None:
        dt = self.dt
        self.t0 = self.next_tick = math.ceil(ts / dt) * dt
        self.engine.advance(self.t0)
        sim = self.cluster = self.make_cluster(self.t0)
        gate = SafetyGate(self.policy, clock=lambda: sim.now, ledger=self.engine.ledger)
        self.loop = Loop(self.engine, SimRuntime(sim, gate))
        self.wall0 = time.perf_counter()
        # A recording scanned first says how many ticks the run has: its buckets are as wide
        # from the start as they end (the plot reads each service once a bucket, not once in
        # each of the narrower buckets merged into it).
        ticks = None if self.span is None else max(1, math.ceil((self.span[1] - self.t0) / dt) + 1)
        tl = self.timeline = Timeline(start=self.t0, dt=dt, capacity=self.points, ticks=ticks)
        for key, _ in self.services:
            tl.channel(f"p:{key}", "max")
        self.plot_sinks = [tl.adder(f"p:{key}") for key, _ in self.services]
        self.util_sinks, self.util_cells = [], []
        for name in self.pool_names:
            tl.channel(f"util:{name}", "mean")
            tl.channel(f"reclaim:{name}", "mean")
            for u in USES:
                tl.channel(f"use:{name}:{u}", "mean")
            self.util_sinks.append((tl.adder(f"util:{name}"), self.summary.pools[name]))
            cells = tl.cells(f"util:{name}")
            self.util_cells.append((len(self.util_cells), *cells, self.summary.pools[name]))
        engine, meter = self.engine, self.meter
        self.quiet_env = (
            *(tl, sim, engine.idle, engine.advance, meter.sums, meter.counts, self.util_cells),
            *(self.t0, dt),
        )

    def _until(self, ts: float) -> None:
        """Run every tick before ``ts``: the quiet ones the short way (:meth:`_quiet_ticks`;
        not when paced or hooked), the others in full."""
        short = self.speed is None and self.hook is None
        while self.next_tick < ts:
            if short:
                self._quiet_ticks(ts)
                if self.next_tick >= ts:
                    return
                tl = self.timeline
                assert tl is not None
                plot = _plot_width(tl.stride, self.plot_every)
                if self.k % plot == 0 and self._quiet_sample(self.next_tick):
                    continue
            self._tick(self.next_tick)

    def run(
        self, path: Path, decoder: EventDecoder, progress: Callable[[int], None] | None
    ) -> None:
        observe = self.engine.observe
        rejected = self.summary.rejected
        report = self.meter.report
        next_tick = self.next_tick
        accepted = matched = 0
        services = self.summary.services
        stats = SourceStats()
        self.summary.rejected_lines = stats.rejected_lines
        hook = self.hook
        for batch in read_event_batches(path, decoder, progress=progress, stats=stats):
            accepted += len(batch)  # less the rejections, below
            # a hook models latency only: it passes load events (and GPU readings) through
            items = batch if hook is None else hook.filter(batch)  # type: ignore[arg-type]
            for item in items:
                cls = type(item)
                if cls is Rejection:
                    rejected[item.code] += 1  # type: ignore[union-attr]
                    accepted -= 1
                    continue
                ts: float = item.ts  # type: ignore[union-attr,assignment]
                if ts > next_tick:
                    if self.timeline is None:
                        self._start(ts)
                    if ts > self.next_tick:
                        self._until(ts)
                    next_tick = self.next_tick
                if cls is GpuUtilization:  # most events: the fewest tests
                    observe(item)  # type: ignore[arg-type]
                    report(item)  # type: ignore[arg-type]
                    continue
                if cls is Withheld:
                    matched += 1  # a policy service's latency, modelled instead
                    continue
                taken = observe(item)  # type: ignore[arg-type]
                if cls is InferenceLoad:
                    continue  # a load signal's gauges: no latency to match, no GPU to meter
                if taken or item.key in services:  # type: ignore[union-attr]
                    matched += 1  # taken, or late
                else:
                    self.summary.not_in_policy(item.key)  # type: ignore[union-attr]
        self.summary.accepted = accepted
        self.summary.latency_matched = matched
        if self.timeline is not None:  # every event is at or before next_tick: one more covers them
            self._until(math.nextafter(self.next_tick, math.inf))  # that one tick
            self._count_quiet()
            self._flush_uses()
            end = self.t0 + self.k * self.dt
            for i, (_, acc) in enumerate(self.services):
                if self.since[i] < self.k:
                    acc.repeat(self.levels[i], self.k - self.since[i])
                acc.close(end)
        engine = self.engine
        self.summary.engine = {
            "observed": engine.observed,
            "late": engine.late,
            "unknown_service": engine.unknown,
            **{f"gpu_dropped_{why}": n for why, n in engine.dropped.items()},
        }


def _plot_width(stride: int, every: int) -> int:
    """Every how many ticks the plot reads a share of its ``every`` shares of services (a plot
    tick), for timeline buckets ``stride`` ticks wide: while a bucket is narrower than
    ``every`` ticks, on each bucket's first tick (one share a bucket, in turn); else ``every``
    times a bucket (every share once a bucket), so each service's line has a value in every
    bucket, as wide as they get."""
    return stride // every if stride >= every else stride


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often while replaying: the loop allocates a
    batch of event objects at a time (freed by reference counting) and each young-generation
    pass, and the full passes they trigger over the engine's long-lived state, take a
    sizeable share of the loop's time at the default threshold. The thresholds are restored
    afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def replay(
    path: Path,
    *,
    policy: Policy,
    cluster: Callable[[float], SimCluster],
    out_dir: Path,
    settings: ReplaySettings | None = None,
    decoder: EventDecoder | None = None,
    progress: Callable[[int], None] | None = None,
    notes: tuple[str, ...] = (),
    hook: TickHook | None = None,
    span: tuple[float, float] | None = None,
) -> RunResult:
    """Replay ``path`` under ``policy``; writes ``out_dir/decisions.jsonl`` as it goes and
    returns the accounting (see :func:`controller.offline.accounting.report.write_outputs`).
    ``cluster`` makes
    the simulated cluster given the replay's start ``T_0`` (known at the first event).
    ``progress`` is called with the bytes of the file read so far after each batch; ``hook``
    changes what the engine sees (:class:`TickHook`). ``span``: the recording's first event
    time (in file order) and its latest, when a pass over it found them
    (:attr:`~controller.offline.replay.inferred.InferredCluster.span`): the report's buckets are
    then as wide from the start as they end; without it they start one tick wide and merge.

    An earlier run's outputs in ``out_dir`` are removed first, and this run's
    ``decisions.jsonl`` when it fails (a damaged recording raises
    :class:`~streams.stream_errors.RecordingError`), so ``out_dir`` never looks complete when it
    is not."""
    settings = settings or ReplaySettings()
    if not (settings.evaluate_every > 0 and math.isfinite(settings.evaluate_every)):
        raise ValueError(f"evaluate_every must be positive; got {settings.evaluate_every}")
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_outputs(out_dir)
    started = time.perf_counter()
    try:
        with (
            open(out_dir / DECISIONS_FILE, "wb") as decisions,
            _fewer_collections(),
        ):
            run = _Replay(
                policy, cluster, decisions=decisions, settings=settings, hook=hook, span=span
            )
            run.summary.notes = notes
            run.run(path, decoder or EventDecoder(load=True), progress)
    except BaseException:
        clear_outputs(out_dir)
        raise
    timeline = run.timeline or Timeline(start=0.0, dt=settings.evaluate_every)
    settle_flows(run.markers, run.cluster.effects if run.cluster is not None else ())
    return RunResult(run.summary, timeline, run.markers, time.perf_counter() - started)
