"""Peer ``kpa``: Knative's Pod Autoscaler on in-flight requests (concurrency), with the
scheduler's PriorityClass preemption.

From knative serving ``pkg/autoscaler/scaling/autoscaler.go`` (``autoscaler.Scale``) and the
defaults of ``config/core/configmaps/autoscaler.yaml`` (``config-autoscaler``):

* every ``tick_s`` (2 s, the autoscaler's ``tickInterval``) the observed *total* concurrency is
  averaged over the stable window (``stable-window`` 60 s) and the panic window
  (``panic-window-percentage`` 10 %: 6 s); the queue-proxies' stats are scraped every
  ``scrape_s`` (1 s), so the newest second the autoscaler sees is up to that old;
* ``readyPods = max(1, ready)``; ``maxScaleUp = ceil(max-scale-up-rate (1000) * readyPods)``,
  ``maxScaleDown = floor(readyPods / max-scale-down-rate (2))``;
* ``desiredStable = ceil(stable / target)`` and ``desiredPanic = ceil(panic / target)``, each
  clamped to ``[maxScaleDown, maxScaleUp]``;
* panic starts when ``desiredPanic / readyPods >= panic-threshold-percentage`` (200 %), is
  extended while that holds, and ends a stable window after it last held; in panic the count
  never goes down (``maxPanicPods``, the largest of stable and panic seen); a new autoscaler
  starts in panic when more than one pod is ready;
* ``scale-down-delay`` holds the largest count of that window. Knative's default is 0, and at
  0 the KPA flips a replica up and down within seconds whenever the load sits near a multiple
  of the target (the stable window's mean wanders across the ``ceil`` boundary, and each
  scale-up preempts training). That is flapping, which an SRE running GPU pods that take
  minutes to start does not keep. A one-minute delay still cycles on the Azure shape (from the
  maximum down to a quarter of it and back every few minutes: a new pod waits for a preempted
  training pod's grace and its own start while the load swings minute to minute). The arena's
  default is 10 minutes, the same window ``hpa-rate`` scales down over; 0 and 60 s are in the
  sweep (BENCHMARKS.md has the figures);
* the result is clamped to ``minScale``/``maxScale`` (the policy's replica bounds).

Concurrency is Little's law: the requests completed in a window spent the sum of their
latencies in flight, so that sum over the window's length is its mean concurrency. The target
per replica is ``target`` x the concurrency one replica carries at the service's capacity
utilization ``utilization`` (default 0.5, the capacity the other peers and Ebbtide's proactive
example are given), by Little's law with the service model's mean latency there; Knative's
``container-concurrency-target-percentage`` (70 %) would scale a hand-set
``containerConcurrency``, and is folded into that target.

With ``rps`` on, the revision scales on requests per second instead
(``autoscaling.knative.dev/metric: rps``, ``StableAndPanicRPS``), the same windows and rules,
target ``target`` x ``utilization`` x the requests/s one replica serves.

On the queueing model, concurrency is a poor signal: a replica's latency falls as replicas are
added, so ``ceil(concurrency / target)`` answers an increase of replicas with a decrease (at the
target utilization the loop gain is -1), which adds to the cycling above. That is the
algorithm on this model, not a shortcut of the peer; ``rps`` is the variant without that loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from controller.offline.models.queueing import ServiceModel, slowdown
from controller.offline.models.telemetry import running_replicas
from policies.decisions import Decision, Explanation, Scale
from policies.inventory import Inventory
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency

__all__ = ["Kpa", "KpaSettings", "KpaState"]


@dataclass(frozen=True, slots=True)
class KpaSettings:
    """``config-autoscaler``'s defaults, and the target (module docstring)."""

    target: float = 1.0
    utilization: float = 0.5
    stable_window_s: float = 60.0
    panic_window_pct: float = 10.0
    panic_threshold_pct: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay_s: float = 600.0
    """Knative's default is 0 (see the module docstring)."""
    tick_s: float = 2.0
    scrape_s: float = 1.0
    rps: bool = False
    """Scale on requests per second instead of concurrency (module docstring)."""


def replica_concurrency(model: ServiceModel, utilization: float) -> float:
    """In-flight requests of one replica serving ``utilization`` of its rate (Little's law)."""
    mean_ms = model.base_ms * slowdown(utilization, model.cap) * (1.0 + model.jitter)
    return utilization * model.per_replica_rps * mean_ms / 1000.0


@dataclass(slots=True)
class KpaState:
    """One revision's autoscaler: its concurrency samples, panic state and delay window."""

    min_replicas: int
    max_replicas: int
    target: float
    """Concurrency per replica."""
    settings: KpaSettings
    panic_time: float | None = None
    max_panic_pods: int = 0
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    """(second, total concurrency) as scraped."""
    delayed: deque[tuple[float, int]] = field(default_factory=deque)

    def start(self, now: float, ready: int) -> None:
        """``newAutoscaler``: in panic when more than one pod is ready."""
        if ready > 1:
            self.panic_time, self.max_panic_pods = now, ready

    def observe(self, at: float, concurrency: float) -> None:
        self.samples.append((at, concurrency))

    def average(self, now: float, window: float) -> float | None:
        """Mean concurrency of the scraped seconds in ``(end - window, end]``, ``end`` the last
        scrape visible at ``now``; ``None`` without data."""
        s = self.settings
        end = math.floor(round(now / s.scrape_s, 9)) * s.scrape_s
        while self.samples and self.samples[0][0] <= end - s.stable_window_s:
            self.samples.popleft()
        seen = [c for t, c in self.samples if end - window < t <= end]
        if not seen:
            return None
        return sum(seen) / max(1.0, window)

    def scale(self, now: float, *, ready: int) -> int | None:
        """``autoscaler.Scale`` at ``now``: the desired count, ``None`` without data."""
        s = self.settings
        stable = self.average(now, s.stable_window_s)
        panic = self.average(now, s.stable_window_s * s.panic_window_pct / 100.0)
        if stable is None or panic is None:
            return None
        pods = max(1.0, float(ready))
        up = math.ceil(s.max_scale_up_rate * pods)
        down = math.floor(pods / s.max_scale_down_rate)
        dspc = math.ceil(round(stable / self.target, 9))
        dppc = math.ceil(round(panic / self.target, 9))
        want_stable = int(min(max(dspc, down), up))
        want_panic = int(min(max(dppc, down), up))
        over = dppc / pods >= s.panic_threshold_pct / 100.0
        if over:
            self.panic_time = now
        elif self.panic_time is not None and self.panic_time + s.stable_window_s < now:
            self.panic_time, self.max_panic_pods = None, 0
        want = want_stable
        if self.panic_time is not None:
            want = max(want, want_panic)
            self.max_panic_pods = max(self.max_panic_pods, want)
            want = self.max_panic_pods
        if s.scale_down_delay_s > 0:
            self.delayed.append((now, want))
            while self.delayed[0][0] <= now - s.scale_down_delay_s:
                self.delayed.popleft()
            want = max(w for _, w in self.delayed)
        return min(self.max_replicas, max(self.min_replicas, want))


class Kpa:
    """The ``kpa`` peer (module docstring)."""

    name: ClassVar[str] = "kpa"
    label: ClassVar[str] = "Knative KPA (concurrency, 60s/6s windows) + priority preemption"
    preemption: ClassVar[bool] = True

    def __init__(
        self,
        policy: Policy,
        models: Mapping[str, ServiceModel],
        *,
        start: float,
        settings: KpaSettings,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self._next = start
        self._started = False
        self.states: dict[str, tuple[str, KpaState]] = {}
        for name, svc in sorted(policy.spec.services.items()):
            key = f"{svc.namespace}/{name}"
            model = models.get(key)
            if svc.scale is None or svc.replicas is None or model is None:
                continue
            if settings.rps:
                target = settings.target * settings.utilization * model.per_replica_rps
            else:
                target = settings.target * replica_concurrency(model, settings.utilization)
            state = KpaState(svc.replicas.min, svc.replicas.max, target, settings)
            self.states[key] = (name, state)
        self._second: dict[str, tuple[float, float]] = {}

    def observe(self, event: Event) -> None:
        """A tick's completed requests add their time in flight (or, with ``rps``, their
        count) to that second."""
        if type(event) is not InferenceLatency or event.samples_ms is None:
            return
        hit = self.states.get(event.key)
        if hit is not None:
            samples = event.samples_ms
            value = float(len(samples)) if self.settings.rps else sum(samples) / 1000.0
            hit[1].observe(event.time, value)

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Every ``tick_s``: one ``Scale`` per revision."""
        if now < self._next:
            return []
        self._next = now + self.settings.tick_s
        inv = Inventory(snapshot, self.policy)
        out: list[Decision] = []
        for key, (name, state) in self.states.items():
            wl = inv.service_workload.get(key)
            if wl is None:
                continue
            ready = running_replicas(snapshot, {wl.key: key})[key]
            if not self._started:
                state.start(now, ready)
            to = state.scale(now, ready=ready)
            if to is None or to == wl.replicas:
                continue
            mode = "panic" if state.panic_time is not None else "stable"
            why = Explanation.of(
                self.name,
                f"{name}: {'rps' if self.settings.rps else 'concurrency'} target "
                f"{state.target:.2f}/replica, {ready} ready, "
                f"{mode} mode: KPA {wl.replicas}→{to}",
            )
            out.append(Scale(now, wl.key, wl.kind, wl.replicas, to, "inference", why))
        self._started = True
        return out
