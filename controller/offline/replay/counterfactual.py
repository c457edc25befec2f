"""Counterfactual replay: what latency would have been under this policy's replicas.

``ebbtide replay --model fit`` runs the recording twice through :func:`~.runner.replay`:

1. **Fit pass** (open loop, outputs discarded): under the policy the recording was made with
   (``--recorded-policy``, by default ``--policy``), so the simulated cluster's Running replicas
   at each tick stand for the recorded ones. :class:`FitRecorder` collects per service and tick
   the requests that arrived and those replicas, and per minute the observed percentiles;
   :func:`~.fit.fit_service` fits and validates the latency model on them.
2. **Counterfactual pass** (closed loop): :class:`ModelledLatency` drops the recorded latency
   events of every modelled service, keeping only how many requests arrived when, and at each
   tick, before the engine evaluates, draws that many latencies from the fitted model
   (:class:`~controller.offline.models.queueing.ServiceQueue`, the simulator's) with the capacity of
   the service's Running replicas in *this* run's simulated cluster. A scale-up, once its pods
   have started (the scenario's ``podStartup``), lowers the load per replica and with it the
   latencies the engine sees next: the loop is closed. Services without a usable fit keep
   their recorded latencies, and the summary names them.

The recording's timing is kept: modelled requests are stamped at the tick their recorded
counterparts preceded, so the engine's windows fill as in the open-loop replay, and the
recorded events still move the replay's clock (:class:`~.runner.Withheld`). Draws are
seeded per service (``crc32`` of its key), so a counterfactual replay is deterministic.
"""

from __future__ import annotations

import random
import tempfile
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.offline.accounting.outputs import RunResult
from controller.offline.accounting.summary import MODELLED_FIT
from controller.offline.models.fit import (
    BUCKET_S,
    MIN_REQUESTS,
    SMOOTH_S,
    Fit,
    Observed,
    fit_service,
    quantile_at,
)
from controller.offline.models.queueing import ServiceQueue
from controller.offline.models.telemetry import running_replicas
from controller.offline.replay.inferred import MAX_PODS
from controller.offline.replay.replayer import (
    ReplaySettings,
    Withheld,
    replay,
)
from controller.simcluster import SimCluster
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency, Rejection

__all__ = ["FitRecorder", "ModelledLatency", "counterfactual_replay", "service_workloads"]

_EPS: Final = 1e-9


def service_workloads(policy: Policy) -> dict[str, str]:
    """Workload key -> service key for every policy service (as the engine pairs them)."""
    return {
        f"{s.namespace}/{s.workload or name}": f"{s.namespace}/{name}"
        for name, s in policy.spec.services.items()
    }


def _tick_of(ts: float, dt: float) -> int:
    """The number of the tick an event at ``ts`` is observed before (``ceil(ts / dt)``)."""
    return int(-(-ts // dt)) if ts % dt > _EPS * dt else round(ts / dt)


def _requests(event: InferenceLatency) -> list[tuple[float, int]]:
    """The event's requests as ``(latency, count)``; a histogram's count at their bucket's
    bound (the overflow bucket at the last bound)."""
    if event.latency_ms is not None:
        return [(event.latency_ms, 1)]
    if event.samples_ms is not None:
        return [(v, 1) for v in event.samples_ms]
    h = event.histogram
    assert h is not None
    return [(b, n) for b, n in zip([*h.bounds_ms, h.bounds_ms[-1]], h.counts, strict=True) if n]


def _count(event: InferenceLatency) -> int:
    """How many requests the event reports."""
    h = event.histogram
    return sum(h.counts) if h is not None else event.size


@dataclass(slots=True)
class _Series:
    q: float
    arrivals: dict[int, int] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)
    open: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    """Bucket -> ``(latency, requests)``, for buckets that may still get events."""
    pq: dict[int, float | None] = field(default_factory=dict)
    p50: dict[int, float | None] = field(default_factory=dict)
    pods: dict[int, set[str]] = field(default_factory=dict)
    """Bucket -> the pods its latency events named, while open; then :attr:`pod_counts`."""
    pod_counts: dict[int, int] = field(default_factory=dict)

    def close_before(self, bucket: int) -> None:
        for b in [b for b in self.pods if b < bucket]:
            self.pod_counts[b] = len(self.pods.pop(b))
        for b in [b for b in self.open if b < bucket]:
            values = self.open.pop(b)
            enough = sum(n for _, n in values) >= MIN_REQUESTS
            self.pq[b] = quantile_at(values, self.q) if enough else None
            self.p50[b] = quantile_at(values, 0.5) if enough else None


class FitRecorder:
    """The fit pass's hook: observes the recorded latencies, records replicas at each tick.
    Memory: a few numbers per service and tick, and one open minute of latencies.

    The replicas that served are the simulated cluster's Running ones, except in minutes whose
    latency events name pods (``pod``): there the distinct pods named are the recording's own
    word for them (as :mod:`.inventory` counts a service's replicas)."""

    def __init__(self, policy: Policy, dt: float) -> None:
        self.dt = dt
        self.workloads = service_workloads(policy)
        self.series = {
            f"{s.namespace}/{name}": _Series(s.slo.percentile / 100.0)
            for name, s in policy.spec.services.items()
        }
        self.per = max(1, round(BUCKET_S / dt))
        self.first: int | None = None
        """The replay's first tick (that of its first event, as the runner's ``T_0``)."""
        self.last = 0

    def filter(self, batch: list[Event | Rejection]) -> Sequence[Event | Rejection | Withheld]:
        dt, series, per = self.dt, self.series, self.per
        for item in batch:
            if isinstance(item, Rejection):
                continue
            if self.first is None:
                self.first = _tick_of(item.time, dt)
            if not isinstance(item, InferenceLatency) or (s := series.get(item.key)) is None:
                continue
            k = _tick_of(item.time, dt)
            s.arrivals[k] = s.arrivals.get(k, 0) + _count(item)
            b = (k - self.first) // per
            s.open.setdefault(b, []).extend(_requests(item))
            if item.pod is not None:
                pods = s.pods.setdefault(b, set())
                if len(pods) < MAX_PODS:
                    pods.add(item.pod)
            s.close_before(b - 1)  # a minute late is still counted
        return batch

    def tick(self, now: float, snapshot: Snapshot) -> Sequence[Event]:
        k = self.last = round(now / self.dt)
        running = running_replicas(snapshot, self.workloads)
        for key, s in self.series.items():
            s.replicas[k] = running.get(key, 0)
        return ()

    def observed(self) -> list[Observed]:
        """Every service's series, tick 0 being the first tick of the replay."""
        out: list[Observed] = []
        first = self.first if self.first is not None else self.last + 1
        ticks = range(first, self.last + 1)
        buckets = range(-(-len(ticks) // self.per))
        for key, s in sorted(self.series.items()):
            s.close_before(len(buckets))
            pq = [s.pq.get(b) for b in buckets]
            p50 = [s.p50.get(b) for b in buckets]
            arrivals = [s.arrivals.get(k, 0) for k in ticks]
            named, per = s.pod_counts, self.per
            replicas = [named.get(i // per, s.replicas.get(k, 0)) for i, k in enumerate(ticks)]
            out.append(Observed(key, s.q, self.dt, arrivals, replicas, pq, p50))
        return out

    def replicas_from(self, key: str, policy: Policy) -> str:
        """Where the replicas fitted to for service ``key`` came from, in words."""
        replayed = f"replayed under {policy.metadata.name} {policy.digest()}"
        named = len(self.series[key].pod_counts)
        if not named:
            return replayed
        minutes = -(-(self.last + 1 - (self.first or 0)) // self.per)
        return f"pods named on its latency events ({named} of {minutes} min), else {replayed}"


class ModelledLatency:
    """The counterfactual pass's hook: replaces the recorded latencies of modelled services
    with draws from their fitted models at the replicas this run has (module docstring)."""

    def __init__(self, policy: Policy, fits: Mapping[str, Fit], dt: float) -> None:
        self.dt = dt
        self.workloads = service_workloads(policy)
        self.queues = {
            key: ServiceQueue(f.model(), random.Random(zlib.crc32(key.encode())))
            for key, f in fits.items()
            if f.modelled
        }
        self.pending: dict[str, dict[int, int]] = {key: {} for key in self.queues}
        window = max(1, round(SMOOTH_S / dt))
        self.recent: dict[str, deque[int]] = {k: deque(maxlen=window) for k in self.queues}
        self.done: int | None = None
        """The last tick run: an arrival stamped at or before it counts at the next one."""

    def filter(self, batch: list[Event | Rejection]) -> list[Event | Rejection | Withheld]:
        dt, pending = self.dt, self.pending
        out: list[Event | Rejection | Withheld] = []
        for item in batch:
            if type(item) is InferenceLatency:
                counts = pending.get(item.key)
                if counts is not None:
                    k = _tick_of(item.time, dt)
                    if self.done is not None and k <= self.done:
                        k = self.done + 1  # late, as the runner observes it
                    counts[k] = counts.get(k, 0) + _count(item)
                    out.append(Withheld(item.time))
                    continue
            out.append(item)
        return out

    def tick(self, now: float, snapshot: Snapshot) -> Sequence[Event]:
        k = round(now / self.dt)
        running = running_replicas(snapshot, self.workloads)
        events: list[Event] = []
        for key, queue in self.queues.items():
            counts = self.pending[key]
            due = range(self.done + 1, k + 1) if self.done is not None else sorted(counts)
            arrivals = sum(counts.pop(t, 0) for t in due if t <= k)
            recent = self.recent[key]
            recent.append(arrivals)
            rate = sum(recent) / (len(recent) * self.dt)
            samples = queue.step(
                offered_rps=rate, replicas=running.get(key, 0), arrivals=arrivals, dt=self.dt
            )
            if samples:
                namespace, name = key.split("/", 1)
                events.append(
                    InferenceLatency(ts=now, service=name, namespace=namespace, samples_ms=samples)
                )
        self.done = k
        return events


def counterfactual_replay(
    path: Path,
    *,
    policy: Policy,
    recorded_policy: Policy,
    cluster: Callable[[Policy], Callable[[float], SimCluster]],
    out_dir: Path,
    settings: ReplaySettings,
    progress: Callable[[int], None] | None = None,
    notes: tuple[str, ...] = (),
    span: tuple[float, float] | None = None,
) -> tuple[RunResult, dict[str, Fit]]:
    """Fit the recording's latencies (under ``recorded_policy``), then replay it under
    ``policy`` with modelled latencies; ``summary.fit`` and ``summary.latency`` say how.
    ``cluster(p)`` makes the simulated cluster for a replay under policy ``p``; ``span`` is
    :func:`~controller.offline.replay.replayer.replay`'s."""
    recorder = FitRecorder(recorded_policy, settings.evaluate_every)
    with tempfile.TemporaryDirectory(prefix="ebbtide-fit-") as scratch:
        replay(path, policy=recorded_policy, cluster=cluster(recorded_policy),
               out_dir=Path(scratch), settings=settings, hook=recorder, span=span)  # fmt: skip
    fits = {obs.key: fit_service(obs) for obs in recorder.observed()}
    ours = {key: f for key, f in fits.items() if key in service_workloads(policy).values()}
    hook = ModelledLatency(policy, ours, settings.evaluate_every)
    result = replay(path, policy=policy, cluster=cluster(policy), out_dir=out_dir,
                    settings=settings, progress=progress, notes=notes, hook=hook,
                    span=span)  # fmt: skip
    result.summary.latency = MODELLED_FIT
    result.summary.fit = {
        key: f.to_dict() | {"replicas_from": recorder.replicas_from(key, recorded_policy)}
        for key, f in ours.items()
    }
    return result, ours
