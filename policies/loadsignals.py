"""A service's signals beyond its one percentile: further objectives, load gauges, and whether
its latency is set by the work rather than by queueing.

Design:

* **Several objectives.** ``slo`` is the primary objective (:class:`~policies.servicetrack.
  ServiceTrack` keeps its windows and its state, stepped by :mod:`policies.scheduling`); every
  further objective (``objectives:``) gets an :class:`ObjectiveTrack` here with its own latency
  window, exceedance counters and state machine (:func:`policies.slo.step`), fed by the
  latency events of its metric (:mod:`policies.intake`) and stepped once per round, before
  the service's rules run (:meth:`ServiceSignals.tick`). A service with further objectives,
  load signals or the work-bound check is ruled every round (its rules say they are never
  quiet), so stepping them with the rules is stepping them every tick, incremental or not.
  The service breaches when any objective breaches and has recovered only when all have.
* **Load gauges.** ``inference.load`` events carry, per pod, the gauges an inference server
  exposes (waiting, running, KV-cache usage). The last reading of each pod counts until
  ``signals.staleAfter``; a signal asks for replicas from the fresh readings only, the way the
  HPA asks from the pods that report (kubernetes ``pkg/controller/podautoscaler/
  replica_calculator.go``, ``GetResourceReplicas``/``GetMetricReplicas``: sum or mean over the
  ready pods' metrics). Memory: one entry per (signal, pod) of the policy's services; a pod
  that stops reporting is swept once its reading is stale.
* **Combining** (:func:`asks`): each signal asks for ``ceil(sum / target)`` (an average value
  per replica: waiting, running) or ``ceil(replicas * mean / target)`` (a utilization: KV
  cache, GPU), nothing while within ``scale.tolerance`` of the current replicas, as the HPA.
  Scale-up goes to the most any signal or objective asks; scale-down only when every
  configured signal has a fresh reading and asks for fewer (a missing signal vetoes it, as the
  HPA skips a scale-down while a metric is unavailable: ``horizontal.go``,
  ``computeReplicasForMetrics``; KEDA composes its triggers into one HPA the same way,
  ``pkg/scaling/resolver`` and the HPA's multiple metrics).
* **Work-bound latency** (:class:`WorkBound`). The check watches the service's own replicas
  (the snapshot's, so replay and a restart see what the cluster did, not what was decided): a
  rise starts a probe holding the percentile and request rate per replica just before it;
  ``settle`` later it reads them again. A probe counts when the rate per replica fell by at
  least ``loadDrop``; it is *flat* when the percentile's elasticity to the load per replica
  (``ln(p0/p1) / ln(l0/l1)``), extrapolated to ``replicas.max``, still leaves it above the
  objective: no number of replicas would meet it (while the queue-depth signal is over its
  target the probe waits: a percentile behind a draining queue says nothing about the work).
  ``afterSteps`` flat probes in a row make the
  service work-bound: latency stops driving it (no breach scale-up, no veto on scale-down) and
  its load signals alone size it. It ends when the percentile rises well past the level it
  was declared at (half again: queueing is back) or falls within the objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from policies.model import ServiceSpec, SignalsSpec, SloSpec
from policies.slo import ExceedanceWindow, SloState, State, step
from policies.windows import LatencyWindow
from streams.events import InferenceLoad

__all__ = [
    "GAUGES",
    "Ask",
    "ObjectiveTrack",
    "ServiceSignals",
    "Verdicts",
    "WorkBound",
    "asks",
    "combined_state",
    "tick_round",
    "verdicts",
]

#: The ``inference.load`` fields a policy signal reads, by the signal's name.
GAUGES: Final = {"waiting": "waiting", "running": "running", "kv_cache": "kv_cache_pct"}
#: Past the level it was declared at by this factor, a work-bound percentile is queueing again.
REARM: Final = 1.5


class ObjectiveTrack:
    """One further objective: its windows and its state."""

    __slots__ = ("exceed", "latency", "samples", "spec", "state")

    def __init__(self, spec: SloSpec) -> None:
        self.spec = spec
        self.latency = LatencyWindow(window_s=spec.window, interval_s=spec.resolution)
        self.exceed = ExceedanceWindow(
            window_s=spec.window,
            interval_s=spec.resolution,
            high=spec.objective_ms,
            low=spec.objective_ms * spec.recover_below,
        )
        self.state = SloState()
        self.samples = 0

    def step(self, now: float) -> None:
        spec = self.spec
        level, self.samples = self.exceed.level(now, spec.percentile / 100.0, spec.min_samples)
        self.state = step(self.state, level, now, spec)


@dataclass(frozen=True, slots=True)
class Ask:
    """What one signal asks for: its name, the replicas, the value read and its target."""

    signal: str
    replicas: int
    value: float
    target: float


@dataclass(slots=True)
class _Probe:
    at: float
    start: int
    to: int
    p_ms: float
    per_replica: float


class WorkBound:
    """The work-bound check of one service (see the module docstring)."""

    __slots__ = ("_last", "evidence", "flat", "level_ms", "probe", "replicas", "since")

    def __init__(self) -> None:
        self.replicas: int | None = None
        self._last: tuple[float, float] | None = None
        self.probe: _Probe | None = None
        self.flat = 0
        self.since: float | None = None
        self.level_ms: float | None = None
        #: Why the latency is taken as set by the work (for explanations), while it is.
        self.evidence = ""

    @property
    def active(self) -> bool:
        return self.since is not None

    def tick(
        self,
        now: float,
        *,
        replicas: int,
        p_ms: float | None,
        rate: float | None,
        spec: ServiceSpec,
        queued: bool = False,
    ) -> bool:
        """One round's look at the service; ``True`` when it became work-bound or stopped.
        While ``queued`` (the queue-depth signal over its target) a probe waits: a percentile
        read behind a draining queue says nothing about the work."""
        scale, bounds = spec.scale, spec.replicas
        assert scale is not None
        assert scale.work_bound is not None
        assert bounds is not None
        wb = scale.work_bound
        slo = spec.slo
        settle = wb.settle if wb.settle is not None else slo.window + slo.breach_after
        before = self.replicas
        self.replicas = replicas
        changed = False
        if before is not None and replicas > before and self._last is not None:
            if self.probe is None:
                p0, rate0 = self._last
                self.probe = _Probe(now, before, replicas, p0, rate0 / max(before, 1))
            else:
                self.probe.to, self.probe.at = replicas, now
        elif before is not None and replicas < before:
            self.probe = None
        probe = self.probe
        if (
            probe is not None
            and now - probe.at >= settle
            and p_ms is not None
            and rate
            and not queued
        ):
            self.probe = None
            per_replica = rate / probe.to
            if probe.per_replica > 0 and per_replica <= probe.per_replica * (1.0 - wb.load_drop):
                elasticity = max(0.0, math.log(probe.p_ms / p_ms)) / math.log(
                    probe.per_replica / per_replica
                )
                at_max = p_ms * (probe.to / bounds.max) ** elasticity
                if at_max > slo.objective_ms:
                    self.flat += 1
                    self.evidence = (
                        f"{probe.start}→{probe.to} replicas cut the request rate per replica "
                        f"{probe.per_replica:.2f}→{per_replica:.2f}/s and moved "
                        f"P{slo.percentile:g} {probe.p_ms:.0f}→{p_ms:.0f}ms: at replicas.max "
                        f"({bounds.max}) it would still be ~{at_max:.0f}ms > "
                        f"{slo.objective_ms:g}ms"
                    )
                else:
                    self.flat = 0
            if self.flat >= wb.after_steps and self.since is None:
                self.since, self.level_ms, changed = now, p_ms, True
        if p_ms is not None and rate is not None:
            self._last = (p_ms, rate)
        level = self.level_ms
        if (
            self.since is not None
            and p_ms is not None
            and level is not None
            and (p_ms > level * REARM or p_ms <= slo.objective_ms)
        ):
            self.since = self.level_ms = None
            self.flat, self.evidence, changed = 0, "", True
        return changed


class ServiceSignals:
    """One service's further objectives, load gauges and work-bound check."""

    __slots__ = ("gauges", "key", "objectives", "spec", "work_bound")

    def __init__(self, key: str, spec: ServiceSpec) -> None:
        self.key = key
        self.spec = spec
        self.objectives = [ObjectiveTrack(o) for o in spec.objectives]
        #: signal -> pod -> (time, value) of its last reading.
        self.gauges: dict[str, dict[str, tuple[float, float]]] = {g: {} for g in GAUGES}
        self.work_bound = WorkBound()

    def respec(self, spec: ServiceSpec) -> None:
        """Adopt a reloaded spec: objectives whose settings did not change keep their data."""
        kept = {t.spec: t for t in self.objectives}
        self.objectives = [kept.get(o) or ObjectiveTrack(o) for o in spec.objectives]
        if spec.scale is None or spec.scale.work_bound is None:
            self.work_bound = WorkBound()
        self.spec = spec

    def add_load(self, ts: float, event: InferenceLoad) -> None:
        """Keep each gauge of one pod's reading (a newer one replaces it)."""
        pod = event.pod or ""
        for signal, field in GAUGES.items():
            value = getattr(event, field)
            if value is not None:
                seen = self.gauges[signal].get(pod)
                if seen is None or seen[0] <= ts:
                    self.gauges[signal][pod] = (ts, float(value))

    def fresh(self, signal: str, now: float, stale_after: float) -> list[float]:
        """The values of ``signal``'s pods read within ``stale_after`` of ``now`` (stale ones
        are forgotten)."""
        readings = self.gauges[signal]
        gone = [pod for pod, (ts, _) in readings.items() if now - ts > stale_after]
        for pod in gone:
            del readings[pod]
        return [v for ts, v in readings.values() if ts <= now]

    def tick(self, now: float) -> None:
        """Step the further objectives (once per round, before the rules)."""
        for track in self.objectives:
            track.step(now)


def combined_state(primary: SloState, extra: Iterable[ObjectiveTrack]) -> State:
    """The service's state over all its objectives: breaching when any breaches, recovering
    when none breaches and any recovers, stale when every one is, else ok."""
    states = [primary.state, *(t.state.state for t in extra)]
    for state in ("breaching", "recovering"):
        if state in states:
            return state
    return "stale" if all(s == "stale" for s in states) else "ok"


def _ask(
    signal: str, replicas: int, need: float, value: float, target: float, *, tolerance: float
) -> Ask:
    """HPA-style: ``need / target`` replicas (``need`` the sum over the replicas, or the mean
    times the replicas), the current ones while within the tolerance of them; ``value`` is the
    sum or mean as read, for the explanation."""
    ratio = need / (target * max(replicas, 1))
    if abs(ratio - 1.0) <= tolerance:
        return Ask(signal, replicas, value, target)
    return Ask(signal, math.ceil(need / target - 1e-9), value, target)


def asks(
    signals: SignalsSpec,
    sig: ServiceSignals,
    now: float,
    replicas: int,
    *,
    tolerance: float,
    gpu_util: Mapping[str, tuple[float, float]],
    pods: Iterable[str],
    margin: float = 0.0,
) -> tuple[list[Ask], list[str]]:
    """What each configured load signal asks for at ``replicas``, and the signals with no fresh
    reading (they ask for nothing and veto a scale-down). ``gpu_util`` is the intake's last
    pod-attributed reading per pod (``namespace/pod`` → (time, percent)); ``pods`` the
    service's pods in the snapshot; ``margin`` raises every need by that fraction."""
    out: list[Ask] = []
    raise_by = 1.0 + margin
    missing: list[str] = []
    stale = signals.stale_after
    for signal, target, total in (
        ("waiting", signals.waiting, True),
        ("running", signals.running, True),
        ("kv_cache", signals.kv_cache, False),
    ):
        if target is None:
            continue
        values = sig.fresh(signal, now, stale)
        if not values:
            missing.append(signal)
            continue
        if signal == "kv_cache":
            target *= 100.0  # readings are percent, the policy's target a fraction
        value = sum(values) if total else sum(values) / len(values)
        need = (value if total else value * replicas) * raise_by
        out.append(_ask(signal, replicas, need, value, target, tolerance=tolerance))
    if signals.gpu_utilization is not None:
        readings = [gpu_util.get(p) for p in pods]
        values = [r[1] for r in readings if r is not None and 0 <= now - r[0] <= stale]
        if not values:
            missing.append("gpu_utilization")
        else:
            mean = sum(values) / len(values)
            target = signals.gpu_utilization * 100.0
            out.append(
                _ask(
                    "gpu_utilization",
                    replicas,
                    mean * replicas * raise_by,
                    mean,
                    target,
                    tolerance=tolerance,
                )
            )
    return out, missing


@dataclass(frozen=True, slots=True)
class Verdicts:
    """What a service's signals say in one round, for its rules."""

    work_bound: bool
    """Latency is set by the work: it neither scales the service up nor vetoes a scale-down."""
    breaching: tuple[tuple[SloSpec, float | None], ...]
    """The further objectives breaching, each with its percentile (``None``: none yet)."""
    held: tuple[tuple[SloSpec, float | None], ...]
    """The further objectives that veto a scale-down (not ``ok`` below their ``down.below``),
    each with its percentile."""
    asks: tuple[Ask, ...]
    """What each load signal with fresh readings asks for."""
    missing: tuple[str, ...]
    """Load signals with no fresh reading: they veto a scale-down."""


def tick_round(
    sig: ServiceSignals,
    spec: ServiceSpec,
    now: float,
    *,
    p_ms: float | None,
    rate: float | None,
    replicas: int | None,
) -> bool:
    """Step the further objectives and the work-bound check, once per round before the rules;
    ``True`` when the work-bound verdict changed."""
    sig.tick(now)
    scale = spec.scale
    if scale is None or scale.work_bound is None or spec.replicas is None or replicas is None:
        return False
    queued = False
    if scale.signals is not None and scale.signals.waiting is not None:
        waiting = sig.fresh("waiting", now, scale.signals.stale_after)
        queued = sum(waiting) > scale.signals.waiting * max(replicas, 1)
    return sig.work_bound.tick(
        now, replicas=replicas, p_ms=p_ms, rate=rate, spec=spec, queued=queued
    )


def verdicts(
    sig: ServiceSignals,
    spec: ServiceSpec,
    now: float,
    replicas: int,
    *,
    gpu_util: Mapping[str, tuple[float, float]],
    pods: Iterable[str],
    margin: float,
) -> Verdicts:
    """This round's verdicts (see :class:`Verdicts`); ``margin`` raises every ask by that
    fraction (scale-down asks with ``scale.tolerance``, as the leading indicator does)."""
    scale = spec.scale
    down = scale.down if scale is not None else None
    breaching, held = [], []
    for t in sig.objectives:
        o = t.spec
        state = t.state
        p = t.latency.quantile(now, o.percentile / 100.0)
        if state.state == "breaching":
            breaching.append((o, p))
        below = down.below if down is not None else 0.0
        if state.state != "ok" or p is None or p >= below * o.objective_ms:
            held.append((o, p))
    found: list[Ask] = []
    missing: list[str] = []
    if scale is not None and scale.signals is not None:
        found, missing = asks(
            scale.signals,
            sig,
            now,
            replicas,
            tolerance=scale.tolerance,
            gpu_util=gpu_util,
            pods=pods,
            margin=margin,
        )
    return Verdicts(
        sig.work_bound.active, tuple(breaching), tuple(held), tuple(found), tuple(missing)
    )
