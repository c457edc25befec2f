"""Closed-loop simulation: generated load, a queueing model, the engine, the simulated cluster.

Design:

* **The loop.** Ticks fall every ``dt`` (1 s) at ``T_k = T_0 + k dt`` from ``T_0 = EPOCH +
  start`` (the time of day the run starts) for ``duration``. Tick ``k``: (1) each policy
  service is offered ``peak_rps * shape(T_k)`` requests/s (:mod:`.load`); a Poisson count of
  them arrive; their latencies come from the queueing model (:mod:`~controller.offline.models.
  queueing`) or the LLM serving model (:mod:`~controller.offline.models.llmserving`, with
  :attr:`Bench.serving`) with the capacity
  of the service's Running replicas *in the simulated cluster now*, and go out as one
  :class:`~streams.events.InferenceLatency` event stamped ``T_k``; (2) every ``util_every_s``
  each GPU and MIG instance reports its utilization from what runs on it (:mod:`.telemetry`);
  (3) the controller observes the events; (4) ``cluster.advance(T_k)``, ``evaluate(T_k,
  snapshot)``, ``apply``; (5) the accounting. Decisions change the replicas, the replicas change
  the next tick's latency: the loop is closed.
* **Same as replay.** The event order per tick (events stamped ``T_k`` observed, then the
  evaluation at ``T_k``) is exactly what ``ebbtide replay`` does with a recording of these
  events, and the accounting reuses :mod:`controller.offline.accounting.summary`, ``.timeline`` and
  ``.report``: ``summary.json``, ``decisions.jsonl`` and ``report.html`` have the same keys and
  meaning. Replaying a ``--record``-ed run under the same policy and scenario reproduces its
  decisions and figures.
* **Controllers.** ``ebbtide``: the real :class:`~policies.engine.Engine` in the one tick
  (:class:`~controller.loop.tick.Loop`), every decision through
  :class:`~controller.simcluster.sim_runtime.GatedSimCluster` (the SafetyGate, on the simulated
  clock), as live. Peers (:mod:`.peers`, :mod:`.baselines`): ``hpa-rate``, ``hpa-latency``,
  ``keda``, ``kpa`` decide every tick on their own metric pipelines; ``static-p95`` and
  ``static-peak`` apply a plan before ``T_0``; ``polling`` is the strawman. Peers act on the
  simulated cluster through the same gate (a :class:`~controller.loop.gate.SafetyGate` for the
  policy), not through Ebbtide's tick. Every peer but ``polling`` also gets the priority
  :class:`~.baselines.Backfill` of idle GPUs by training. Each run's settings
  (:class:`RunSpec`) override its controller's defaults; ``compare.json`` lists them.
* **What each controller knows, and when.** Ebbtide's engine sees every event late
  (:class:`EventLag`: the producers' flush interval, events batched until it ends, plus the
  broker-to-decision p99); each peer reads its metrics through its own
  pipeline (scrape, rate window, adapter delay: :class:`~.peers.Pipeline`; KPA's 1 s scrape).
* **An independent meter.** SLO attainment is measured by an engine that decides nothing (the
  policy with its kill switch on), fed every event on time, the same for every run; the
  deciding engine never measures itself.
* **One scheduler for all.** kube-scheduler preempts by PriorityClass in every real cluster, so
  every run's simulated cluster does too (:attr:`Bench.preemption`, on by default), Ebbtide's
  included: where the scenario puts inference above training, a scaled-up inference pod that
  finds no GPU evicts training whoever scaled it. The one exception is ``polling``, the
  strawman, labelled "no preemption".
* **Goodput and the worst minutes.** :mod:`.goodput` follows the cluster's effects from ``T_0``
  (restart-aware: a training job's membership change restarts it from its last checkpoint);
  :class:`~.figures.WorstWindow` keeps the worst 5-minute percentile of the raw requests
  (:mod:`.figures` defines every column).
* **Deterministic for a seed.** Arrivals come from one ``random.Random`` per service seeded by
  ``(seed, service)``, latency noise from another, utilization noise from a third; arrivals and
  latency draws do not depend on the cluster, so every controller sees the same requests.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult, Outcome
from controller.loop.tick import Loop, run_now
from controller.offline.accounting.outputs import (
    DECISIONS_FILE,
    RunResult,
    count_action,
    decision_line,
    settle_flows,
)
from controller.offline.accounting.summary import MODELLED, USES, Summary, sample_reclaimable
from controller.offline.accounting.timeline import Timeline
from controller.offline.experiment.baselines import (
    Backfill,
    PollingAutoscaler,
    StaticSettings,
    load_quantile,
    static_partition,
)
from controller.offline.experiment.figures import RunFigures, ServedWindows, WorstWindow
from controller.offline.experiment.goodput import Goodput, jobs_of
from controller.offline.experiment.load import LoadShape, peak_factor, poisson
from controller.offline.experiment.peers import DECIDING, Peer
from controller.offline.models.llmserving import LlmServer, LlmServing
from controller.offline.models.queueing import ServiceModel, ServiceQueue, default_model
from controller.offline.models.telemetry import (
    PoolMeter,
    Telemetry,
    physical_mean,
    running_replicas,
)
from controller.simcluster import EPOCH, Scenario, SimCluster
from controller.simcluster.sim_runtime import GatedSimCluster, SimRuntime
from policies.decisions import Scale
from policies.engine import Engine
from policies.inventory import Inventory
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import (
    DEFAULT_TOPICS,
    LOAD_TOPIC,
    Event,
    InferenceLatency,
    InferenceLoad,
    encode_event,
    event_type,
)
from streams.producer import RawMessage
from streams.recording import RecordingWriter

__all__ = [
    "CONTROLLERS",
    "EBBTIDE_KNOBS",
    "FAIR",
    "SWEEP",
    "Bench",
    "EventLag",
    "Run",
    "RunFigures",
    "RunSpec",
    "SimulateSettings",
    "ebbtide_variant",
    "run_controller",
]

Controller = str
CONTROLLERS: Final[tuple[Controller, ...]] = (
    "ebbtide",
    "hpa-rate",
    "hpa-latency",
    "keda",
    "kpa",
    "static-p95",
    "static-peak",
    "polling",
)
#: The peers an SRE would run instead (``static-peak`` is an oracle, ``polling`` a strawman).
FAIR: Final = frozenset({"hpa-rate", "hpa-latency", "keda", "kpa", "static-p95"})
_STATIC: Final = frozenset({"static-p95", "static-peak"})
#: Ebbtide's knobs a sweep may set, applied to every service of the policy.
EBBTIDE_KNOBS: Final = ("breach_after_s", "down_stabilization_s", "tolerance")


def _grid(**axes: Sequence[float]) -> tuple[dict[str, float], ...]:
    """Every combination of the axes' values."""
    runs: list[dict[str, float]] = [{}]
    for name, values in axes.items():
        runs = [{**r, name: v} for r in runs for v in values]
    return tuple(runs)


#: ``--sweep``: each controller over a small grid of its own settings (defaults run anyway).
SWEEP: Final[Mapping[Controller, tuple[dict[str, float], ...]]] = {
    "ebbtide": _grid(breach_after_s=(15.0, 60.0), down_stabilization_s=(120.0, 1200.0)),
    "hpa-rate": _grid(utilization=(0.4, 0.6), down_window_s=(300.0, 1200.0)),
    "hpa-latency": _grid(target=(0.5, 0.6, 0.8), down_window_s=(300.0, 1200.0)),
    "keda": _grid(utilization=(0.4, 0.6)) + _grid(cached=(1.0,)),
    "kpa": _grid(target=(0.7, 1.4)) + _grid(scale_down_delay_s=(0.0, 60.0)) + _grid(rps=(1.0,)),
    "static-p95": _grid(headroom=(0.0, 0.5, 1.0)),
}
#: Simulated seconds static partitioning's plan gets to settle before ``T_0``.
SETTLE_S: Final = 120.0
#: Ticks between progress reports (a terminal's bar; a day at 1 s ticks is 86,400).
PROGRESS_EVERY: Final = 600
_DONE: Final = frozenset({Outcome.APPLIED, Outcome.IN_PROGRESS})
LABELS: Final[dict[str, str]] = {
    "ebbtide": "Ebbtide (event-driven)",
    **{name: cls.label for name, (cls, _) in DECIDING.items()},
    "static-p95": "static partitioning (P95 of the previous window + headroom)",
    "static-peak": "oracle: static partitioning sized for the run's own peak",
    "polling": PollingAutoscaler.label,
}


@dataclass(frozen=True, slots=True)
class EventLag:
    """When Ebbtide's engine sees an event stamped ``ts``: producers batch events until their
    flush interval ends (the node agent publishes every 5 s, ``controller/agent/publisher.py``
    ``interval_s``), then the broker-to-decision p99 (the default is what BENCHMARKS.md
    "Reaction time" measures at its highest event rate)."""

    flush_s: float = 5.0
    transport_s: float = 0.076

    def visible_at(self, ts: float) -> float:
        flushed = math.ceil(round(ts / self.flush_s, 9)) * self.flush_s if self.flush_s else ts
        return flushed + self.transport_s


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of a comparison: a controller and the settings that differ from its defaults
    (for ``ebbtide``: :data:`EBBTIDE_KNOBS`, applied to every service of the policy)."""

    controller: Controller
    settings: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.settings:
            return self.controller
        return self.controller + " " + ",".join(f"{k}={v:g}" for k, v in self.settings.items())


def peer_settings(controller: Controller, overrides: Mapping[str, float]) -> Any:
    """The settings object of a peer with ``overrides`` (``None`` for ``polling``, which has
    none); an unknown name raises :class:`ValueError` naming the ones it has."""
    cls: Any = None
    if controller in DECIDING:
        cls = DECIDING[controller][1]
    elif controller in _STATIC:
        cls = StaticSettings
    known = set(getattr(cls, "__dataclass_fields__", {}))
    unknown = sorted(set(overrides) - known)
    if unknown:
        has = ", ".join(sorted(known)) or "none"
        raise ValueError(f"{controller} has no setting {', '.join(unknown)} (it has {has})")
    return cls(**overrides) if cls is not None else None


def ebbtide_variant(policy: Policy, overrides: Mapping[str, float]) -> Policy:
    """``policy`` with :data:`EBBTIDE_KNOBS` set on every service (a sweep's variant; the
    policy files are not changed)."""
    unknown = sorted(set(overrides) - set(EBBTIDE_KNOBS))
    if unknown:
        has = ", ".join(EBBTIDE_KNOBS)
        raise ValueError(f"ebbtide has no setting {', '.join(unknown)} (it has {has})")
    if not overrides:
        return policy
    services = {}
    for name, svc in policy.spec.services.items():
        slo, scale = svc.slo, svc.scale
        if "breach_after_s" in overrides:
            slo = slo.model_copy(update={"breach_after": float(overrides["breach_after_s"])})
        if scale is not None and "tolerance" in overrides:
            scale = scale.model_copy(update={"tolerance": float(overrides["tolerance"])})
        if scale is not None and scale.down is not None and "down_stabilization_s" in overrides:
            down = scale.down.model_copy(
                update={"stabilization": float(overrides["down_stabilization_s"])}
            )
            scale = scale.model_copy(update={"down": down})
        services[name] = svc.model_copy(update={"slo": slo, "scale": scale})
    spec = policy.spec.model_copy(update={"services": services})
    return policy.model_copy(update={"spec": spec})


@dataclass(frozen=True, slots=True)
class SimulateSettings:
    duration_s: float
    """Simulated seconds to run."""
    seed: int = 0
    start_of_day_s: float = 2 * 3600.0
    """Time of day (UTC) of ``T_0``, on ``EPOCH``'s day."""
    evaluate_every: float = 1.0
    util_every_s: float = 15.0
    points: int = 600


@dataclass(frozen=True, slots=True)
class Bench:
    """What every controller of a comparison shares: cluster, policy, load, services."""

    scenario: Scenario
    policy: Policy
    shape: LoadShape
    settings: SimulateSettings
    models: Mapping[str, ServiceModel]
    workloads: Mapping[str, str]
    """Workload key -> policy service key, for services with a model."""
    inference_outranks_training: bool = False
    """Every service's workload has a higher priority than every training workload."""
    preemption: bool = True
    """The scheduler preempts by PriorityClass in every run but ``polling``."""
    serving: LlmServing | None = None
    """The LLM serving model for every service; ``None``: the queueing model."""
    lag: EventLag = EventLag()
    """When Ebbtide's engine sees each event."""

    @property
    def start(self) -> float:
        return EPOCH + self.settings.start_of_day_s

    @classmethod
    def of(
        cls,
        scenario: Scenario,
        policy: Policy,
        make_shape: Callable[[float], LoadShape],
        settings: SimulateSettings,
        *,
        llm: LlmServing | None = None,
        load_scale: float = 1.0,
        lag: EventLag | None = None,
    ) -> Bench:
        """Service models for every policy service whose workload the scenario has (the LLM
        server's with ``llm``, else :func:`~controller.offline.models.queueing.default_model`),
        their peak times ``load_scale``; ``make_shape`` gets the run's start."""
        start = EPOCH + settings.start_of_day_s
        snap = SimCluster.from_scenario(scenario, start=start, policy=policy).snapshot()
        inv = Inventory(snap, policy)
        models: dict[str, ServiceModel] = {}
        workloads: dict[str, str] = {}
        for name, svc in sorted(policy.spec.services.items()):
            key = f"{svc.namespace}/{name}"
            wl = inv.service_workload.get(key)
            if wl is None:
                continue
            if llm is not None:
                model = llm.model(key, initial_replicas=wl.replicas)
            else:
                model = default_model(
                    key, objective_ms=svc.slo.objective_ms, initial_replicas=wl.replicas
                )
            models[key] = replace(model, peak_rps=model.peak_rps * load_scale)
            workloads[wl.key] = key
        serving = [w.priority for w in snap.workloads if w.key in workloads]
        training = [v.workload.priority for v in inv.training.values()]
        outranks = bool(serving and training) and min(serving) > max(training)
        return cls(
            scenario, policy, make_shape(start), settings, models, workloads, outranks,
            serving=llm, lag=lag or EventLag(),
        )  # fmt: skip


def _renamed(policy: Policy, name: str) -> Policy:
    """``policy`` with its kill switch on, named ``name``: the independent SLO meter."""
    meta = policy.metadata.model_copy(update={"name": name})
    spec = policy.spec.model_copy(update={"kill_switch": True})
    return policy.model_copy(update={"metadata": meta, "spec": spec})


class _Loop:
    """One controller's run (see the module docstring)."""

    def __init__(
        self,
        bench: Bench,
        spec: RunSpec,
        *,
        decisions: IO[bytes],
        recorder: RecordingWriter | None,
        runner: asyncio.Runner,
    ) -> None:
        s = bench.settings
        controller = spec.controller
        self.bench, self.controller, self.runner = bench, controller, runner
        self.spec = spec
        self.dt = s.evaluate_every
        self.t0 = bench.start
        self.ticks = max(1, round(s.duration_s / self.dt))
        self.util_every = max(1, round(s.util_every_s / self.dt))
        self.out, self.recorder = decisions, recorder
        self.encode = msgspec.json.Encoder().encode
        policy = bench.policy
        static = controller in _STATIC
        start = self.t0 - SETTLE_S if static else self.t0
        self.sim = SimCluster.from_scenario(bench.scenario, start=start, policy=policy)
        self.sim.preemption = bench.preemption and controller != "polling"
        self.peer: Peer | None = None
        self.backfill: Backfill | None = None
        self.loop: Loop | None = None
        """Ebbtide's tick (the one ``ebbtide run`` and replay run); peers act on the cluster."""
        self.engine: Engine | None = None
        """Ebbtide's deciding engine, fed events ``bench.lag`` late."""
        self.lagged: deque[tuple[float, Event | InferenceLoad]] = deque()
        #: Services whose policy scales on load signals: each tick publishes their queue's
        #: inference.load (waiting: the backlog; running: Little's law), to Ebbtide only.
        self.load_keys = frozenset(
            f"{svc.namespace}/{name}"
            for name, svc in policy.spec.services.items()
            if svc.scale is not None and svc.scale.signals is not None
        )
        self.settings: Any = None
        self.training_changes = 0
        """Training resizes and evictions applied (this controller's, the backfill's)."""
        if controller == "ebbtide":
            policy = ebbtide_variant(policy, spec.settings)
            self.engine = Engine(policy)
            gate = SafetyGate(policy, clock=lambda: self.sim.now, ledger=self.engine.ledger)
            self.loop = Loop(self.engine, SimRuntime(self.sim, gate))
            summary_policy = policy
        elif controller in CONTROLLERS:
            summary_policy = _renamed(policy, controller)
            self.settings = peer_settings(controller, spec.settings)
            if controller == "polling":
                self.peer = PollingAutoscaler(policy, start=self.t0)
            elif controller in DECIDING:
                cls = DECIDING[controller][0]
                self.peer = cls(policy, bench.models, start=self.t0, settings=self.settings)
            if controller != "polling":
                self.backfill = Backfill(policy, start=self.t0)
        else:
            raise ValueError(f"unknown controller {controller!r}; known: {', '.join(CONTROLLERS)}")
        self.port = GatedSimCluster(self.sim, SafetyGate(policy, clock=lambda: self.sim.now))
        """Where a peer's decisions go: the simulated cluster behind the gate Ebbtide's pass."""
        self.meter = Engine(_renamed(bench.policy, summary_policy.metadata.name))
        """The independent SLO meter: decides nothing, sees every event on time, judges by
        the policy as given (a sweep's variant of Ebbtide is judged like every other run)."""
        self.summary = Summary.for_policy(summary_policy, summary_policy.sha256(), self.dt)
        self.summary.latency = MODELLED
        self.services = [
            (key, acc, policy.spec.services[key.split("/", 1)[1]].slo.percentile / 100.0)
            for key, acc in self.summary.services.items()
        ]
        self.resolution = {
            f"{v.namespace}/{n}": v.slo.resolution for n, v in policy.spec.services.items()
        }
        self.peak_slot: dict[str, int] = {}
        self.timeline = Timeline(start=self.t0, dt=self.dt, capacity=s.points)
        self.markers: list[dict[str, object]] = []
        pools = sorted(policy.spec.pools.items())
        self.pool_meter = PoolMeter([(n, p.node_selector) for n, p in pools])
        selector = policy.spec.training.selector if policy.spec.training else None
        seed = s.seed
        self.telemetry = Telemetry(
            services=bench.workloads,
            training_selector=selector or self.sim.training_selector,
            rng=random.Random(f"{seed}/telemetry"),
        )
        make = bench.serving.server if bench.serving is not None else ServiceQueue
        self.queues = {
            key: (
                make(m, random.Random(f"{seed}/latency/{key}")),
                random.Random(f"{seed}/arrivals/{key}"),
            )
            for key, m in sorted(bench.models.items())
        }
        self.served = ServedWindows(self.t0, self.queues) if bench.serving is not None else None
        self.snap: Snapshot | None = None
        self.replicas: dict[str, int] = {}
        self.cluster_util: float | None = None
        self.util_sum = 0.0
        self.util_ticks = 0
        self.training_gpu_s = 0.0
        self.events = 0
        self.worst = WorstWindow(self.t0, {key: q for key, _, q in self.services})
        self.goodput: Goodput | None = None
        self.preempted_before = 0
        self.preempted_seen = 0
        self.timeline.channel("preempted", "sum")
        for key, _, _ in self.services:
            self.timeline.channel(f"p:{key}", "max")
        for name, _ in pools:
            self.timeline.channel(f"util:{name}", "mean")
            self.timeline.channel(f"reclaim:{name}", "mean")
            for u in USES:
                self.timeline.channel(f"use:{name}:{u}", "mean")

    # -- helpers ----------------------------------------------------------------------------

    def _write(self, results: Sequence[ActionResult], *, count: bool, bucket: int) -> None:
        for result in results:
            line = decision_line(result)
            line["controller"] = self.controller
            self.out.write(self.encode(line) + b"\n")
            d = result.decision
            if (
                count
                and result.outcome is Outcome.APPLIED
                and (d.action == "evict" or (isinstance(d, Scale) and d.role == "training"))
            ):
                self.training_changes += 1
            if count:
                count_action(
                    result,
                    summary=self.summary,
                    timeline=self.timeline,
                    bucket=bucket,
                    markers=self.markers,
                )

    def _emit(self, ev: Event) -> None:
        self.events += 1
        self.meter.observe(ev)
        if self.engine is not None:
            self.lagged.append((self.bench.lag.visible_at(ev.time), ev))
        if self.peer is not None:
            self.peer.observe(ev)
        if self.recorder is not None:
            ts_ms = round(ev.time * 1000)
            self.recorder.write(
                RawMessage(
                    DEFAULT_TOPICS[event_type(ev)],
                    0,
                    self.events - 1,
                    ev.key.encode(),
                    encode_event(ev),
                    (),
                    ts_ms,
                )
            )

    def _emit_load(
        self,
        key: str,
        now: float,
        queue: ServiceQueue | LlmServer,
        offered: float,
        samples: list[float],
    ) -> None:
        """The service's ``inference.load`` of this tick, as a server's gauges would read:
        requests waiting (the queue's backlog) and running (served rate x mean latency, by
        Little's law). Only Ebbtide and the recording get it (the peers read what they read)."""
        capacity = self.replicas.get(key, 0) * queue.model.per_replica_rps
        served = min(offered, capacity)
        mean_s = sum(samples) / len(samples) / 1000.0 if samples else 0.0
        ns, _, name = key.partition("/")
        ev = InferenceLoad(
            ts=now,
            service=name,
            namespace=ns,
            version=1,
            waiting=round(queue.backlog, 3),
            running=round(served * mean_s, 3),
        )
        self.events += 1
        if self.engine is not None:
            self.lagged.append((self.bench.lag.visible_at(now), ev))
        if self.recorder is not None:
            self.recorder.write(
                RawMessage(
                    LOAD_TOPIC, 0, self.events - 1, ev.key.encode(), encode_event(ev), (),
                    round(now * 1000),
                )
            )  # fmt: skip

    def _quantile(self, key: str, now: float) -> float | None:
        status = next(s for s in self.meter.service_status(now) if s.key == key)
        return status.quantile_ms

    def _refresh(self) -> Snapshot:
        snap = self.sim.snapshot()
        if snap is not self.snap:
            self.snap = snap
            self.pool_meter.refresh(snap)
            self.replicas = running_replicas(snap, self.bench.workloads)
        return snap

    # -- the loop ---------------------------------------------------------------------------

    def setup(self) -> None:
        """Static partitioning: apply the plan before ``T_0`` and let the cluster settle."""
        if self.controller not in _STATIC:
            return
        b, st = self.bench, self.settings
        duration = b.settings.duration_s
        if self.controller == "static-peak":
            factor = peak_factor(b.shape, self.t0, duration)
            sized_for = "the run's own peak (oracle)"
        else:
            factor = load_quantile(b.shape, self.t0 - duration, duration, st.quantile)
            factor *= 1.0 + st.headroom
            sized_for = (
                f"the P{st.quantile * 100:g} of the previous {duration / 3600:g} h "
                f"+ {st.headroom:.0%} headroom"
            )
        plan = static_partition(
            self.sim.snapshot(),
            b.policy,
            b.models,
            load_factor=factor,
            at=self.sim.now,
            target_rho=st.utilization,
            sized_for=sized_for,
        )
        results = self.runner.run(self.port.apply(plan.decisions))
        self._write(results, count=False, bucket=0)
        self.sim.advance(self.t0)

    def tick(self, k: int) -> None:
        now = self.t0 + k * self.dt
        self.meter.advance(now)  # this tick's events are stamped now: on time
        dt, b = self.dt, self.bench
        factor = b.shape.factor(now)
        snap = self._refresh()
        rho: dict[str, float] = {}
        for key, (queue, arrivals) in self.queues.items():
            offered = b.models[key].peak_rps * factor
            n = poisson(arrivals, offered * dt)
            samples = queue.step(
                offered_rps=offered, replicas=self.replicas.get(key, 0), arrivals=n, dt=dt
            )
            rho[key] = queue.rho
            if self.served is not None:
                self.served.add(key, now)
            if samples:
                self.worst.add(key, now, samples)
                ns, _, name = key.partition("/")
                self._emit(InferenceLatency(ts=now, service=name, namespace=ns, samples_ms=samples))
            if key in self.load_keys:
                self._emit_load(key, now, queue, offered, samples)
        if k % self.util_every == 0:
            self.telemetry.refresh(snap)
            readings = self.telemetry.readings(now, rho=rho, other_load=factor)
            for ev in readings:
                self._emit(ev)
                self.pool_meter.report(ev)
            self.cluster_util = physical_mean(readings)
        tl = self.timeline
        bucket = tl.bucket(k)
        if self.loop is not None and self.engine is not None:
            lagged, engine = self.lagged, self.engine
            engine.advance(now)
            while lagged and lagged[0][0] <= now + 1e-9:
                engine.observe(lagged.popleft()[1])
            results = run_now(self.loop.tick(now))
            self.meter.evaluate(now, self.sim.snapshot())
        else:
            self.sim.advance(now)
            snap = self._refresh()
            self.meter.evaluate(now, snap)
            decisions = self.peer.evaluate(now, snap) if self.peer is not None else []
            results = self.runner.run(self.port.apply(decisions)) if decisions else []
            if self.backfill is not None:
                grown = self.backfill.evaluate(now, self._refresh())
                if grown:
                    results += self.runner.run(self.port.apply(grown))
        if results:
            self._write(results, count=True, bucket=bucket)
        self._refresh()
        self._account(k, now, bucket)

    def _account(self, k: int, now: float, bucket: int) -> None:
        tl, summary = self.timeline, self.summary
        sample = tl.is_sample_tick(k)
        for key, acc, _ in self.services:
            level = self.meter.slo_state(key).last_level
            read = sample and level != "none"
            if level == "above":
                slot = int(now // self.resolution[key])
                if not acc.in_breach or self.peak_slot.get(key) != slot:
                    self.peak_slot[key] = slot
                    read = True
            p = self._quantile(key, now) if read else None
            if p is not None:
                tl.add(f"p:{key}", bucket, p)
            acc.tick(now, level, p)
        usage = self.sim.gpus_by_use()
        meter = self.pool_meter
        for i, name in enumerate(meter.names):
            util = meter.pool_util(i)
            if util is not None:
                tl.add(f"util:{name}", bucket, util)
            use = usage.get(name)
            uses = {u: getattr(use, u) if use is not None else 0 for u in USES}
            for u, v in uses.items():
                tl.add(f"use:{name}:{u}", bucket, v)
            summary.pools[name].tick(util, uses)
        if sample:
            sample_reclaimable(summary, tl, bucket, self.meter.reclaimable(now))
        self.training_gpu_s += sum(u.training for u in usage.values()) * self.dt
        if self.goodput is not None:
            self.goodput.update()
        preempted = self.sim.preemptions - self.preempted_before - self.preempted_seen
        if preempted:
            self.preempted_seen += preempted
            self.timeline.add("preempted", bucket, float(preempted))
        if self.cluster_util is not None:
            self.util_sum += self.cluster_util
            self.util_ticks += 1
        if summary.first_tick is None:
            summary.first_tick = now
        summary.last_tick = now
        summary.ticks += 1

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        """All ticks; ``progress`` gets the simulated seconds done every
        :data:`PROGRESS_EVERY` ticks."""
        self.setup()
        self.preempted_before = self.sim.preemptions  # static's settling is not measured
        self.goodput = Goodput(
            self.sim,
            checkpoints=jobs_of(self.bench.scenario),
            training_selector=self.telemetry.training_selector,
            start=self.t0,
        )
        for k in range(self.ticks):
            self.tick(k)
            if progress is not None and k % PROGRESS_EVERY == 0:
                progress(int(k * self.dt))
        end = self.t0 + self.ticks * self.dt
        for _, acc, _ in self.services:
            acc.close(end)
        self.worst.flush()
        if self.served is not None:
            self.served.flush()
        self.summary.accepted = self.events
        m = self.meter
        self.summary.engine = {"observed": m.observed, "late": m.late, "unknown_service": m.unknown}

    def figures(self, wall_s: float) -> RunFigures:
        accs = self.summary.services
        evaluated = sum(a.evaluated for a in accs.values())
        by = self.summary.by_action_outcome
        trained = self.training_gpu_s / 3600.0
        kept = self.goodput.figures(self.t0 + self.ticks * self.dt) if self.goodput else None
        worst = [w for w in self.worst.worst.values() if w is not None]
        services = {
            key: {
                "slo_attainment": a.within / a.evaluated if a.evaluated else None,
                "breach_minutes": round((a.evaluated - a.within) * self.dt / 60.0, 3),
                "p99_worst_5min_ms": self.worst.worst.get(key),
            }
            for key, a in accs.items()
        }
        if self.served is not None:
            for key, llm_worst in self.served.figures().items():
                services[key] = {**services[key], **llm_worst}
        applied = Outcome.APPLIED.value
        actions = sum(
            n for (_, outcome), n in by.items() if outcome in (applied, Outcome.IN_PROGRESS.value)
        )
        preempting = self.sim.preemption
        label = LABELS[self.controller]
        if self.controller == "ebbtide":
            label += " + priority preemption" if preempting else ", no preemption"
        if self.spec.settings:
            label += f" ({', '.join(f'{k}={v:g}' for k, v in self.spec.settings.items())})"
        return RunFigures(
            controller=self.controller,
            label=label,
            policy=self.summary.policy.metadata.name,
            preemption=preempting,
            slo_attainment=sum(a.within for a in accs.values()) / evaluated if evaluated else None,
            breach_minutes=sum((a.evaluated - a.within) for a in accs.values()) * self.dt / 60.0,
            p99_worst_5min_ms=max(worst) if worst else None,
            mean_gpu_util_pct=self.util_sum / self.util_ticks if self.util_ticks else None,
            training_gpu_hours=trained,
            goodput=kept,
            reclaimable_gpu_hours=sum(p.reclaimable_gpu_s for p in self.summary.pools.values())
            / 3600.0,
            actions=actions,
            evictions=by["evict", applied],
            preemptions=self.sim.preemptions - self.preempted_before,
            mig_conversions=sum(by["mig_convert", o.value] for o in _DONE),
            scale_actions=by["scale", applied],
            events=self.events,
            wall_s=wall_s,
            services=services,
        )


@dataclass(frozen=True, slots=True)
class Run:
    """One finished run: replay's outputs, its figures and what ``compare.json`` adds."""

    result: RunResult
    figures: RunFigures
    spec: RunSpec
    settings: Mapping[str, Any]
    """Every setting of the run (defaults included)."""
    disruptions: int
    """Training resizes and evictions applied, plus the scheduler's preemptions."""

    def row(self) -> dict[str, Any]:
        """The run's ``compare.json`` row. ``training_goodput_gpu_hours_optimistic`` is the
        goodput figure the figures carry; a restart-aware figure replaces the main one where
        :mod:`.figures` provides it."""
        row = self.figures.to_dict()
        row["settings"] = dict(self.settings)
        row["fair"] = self.spec.controller in FAIR
        row.setdefault("training_goodput_gpu_hours_optimistic", row["training_goodput_gpu_hours"])
        row.setdefault("disruptions", self.disruptions)
        return row


def run_controller(
    bench: Bench,
    spec: RunSpec | Controller,
    out_dir: Path,
    *,
    record: Path | None = None,
    record_header: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Run:
    """Run ``spec`` (a controller, with settings) on ``bench``; write ``decisions.jsonl`` into
    ``out_dir`` (the caller writes ``summary.json`` and ``report.html`` with
    :func:`controller.offline.accounting.report.write_outputs`) and, with ``record``, every
    generated event as a recording ``ebbtide replay`` and ``publish`` accept. ``progress`` is
    called with the simulated seconds done, now and then. An unknown controller or setting
    raises :class:`ValueError` before anything runs."""
    if isinstance(spec, str):
        spec = RunSpec(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    recorder = None
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        recorder = RecordingWriter(record, source="ebbtide simulate", **(record_header or {}))
    try:
        with open(out_dir / DECISIONS_FILE, "wb") as out, asyncio.Runner() as runner:
            loop = _Loop(bench, spec, decisions=out, recorder=recorder, runner=runner)
            loop.run(progress)
    finally:
        if recorder is not None:
            recorder.close()
    wall = time.perf_counter() - started
    settle_flows(loop.markers, loop.sim.effects)
    result = RunResult(loop.summary, loop.timeline, loop.markers, wall, command="simulate")
    if spec.controller == "ebbtide":
        lag = bench.lag
        settings: dict[str, Any] = {"lag_flush_s": lag.flush_s, "lag_transport_s": lag.transport_s}
        settings.update(spec.settings)
    elif spec.controller == "static-peak":
        settings = {"utilization": loop.settings.utilization}  # sized for the peak, as is
    else:
        settings = asdict(loop.settings) if loop.settings is not None else {}
    figures = loop.figures(wall)
    disruptions = loop.training_changes + figures.preemptions
    return Run(result, figures, spec, settings, disruptions)
