"""The Kubernetes HPA v2 replica calculation with its default behaviour, as a pure state machine,
and the HPA controller the HPA-based peers share (:class:`HpaPeer`).

From the documented algorithm (kubernetes.io "Horizontal Pod Autoscaling", and
``pkg/controller/podautoscaler/horizontal.go`` / ``replica_calculator.go``):

1. **Proposal per metric.** ``Value`` target (Object/External): ``usageRatio = metric /
   target``; within the tolerance (``|usageRatio - 1| <= 0.1``, the controller's
   ``--horizontal-pod-autoscaler-tolerance``) the proposal is the current ``spec.replicas``,
   otherwise ``ceil(usageRatio * readyPods)`` (pods being created, starting or pending do not
   count; with none ready that is 0, raised to ``minReplicas``); from 0 replicas
   ``ceil(usageRatio)`` (:meth:`HpaState.raw`). ``AverageValue`` target (External,
   ``GetExternalPerPodMetricReplicas``): ``usageRatio = total / (target * statusReplicas)``;
   outside the tolerance ``ceil(total / target)``, else ``statusReplicas``
   (:meth:`HpaState.per_pod`). No metric: no proposal. With several metrics the largest
   proposal wins (``computeReplicasForMetrics``).
2. **Bounds.** Clamped to ``[minReplicas, maxReplicas]``.
3. **Stabilization** (``stabilizeRecommendationWithBehaviors``): every raw recommendation is
   stored with its time; scale-up uses the *lowest* of those within ``scaleUp.
   stabilizationWindowSeconds`` (default 0: the current one), scale-down the *highest* within
   ``scaleDown.stabilizationWindowSeconds`` (default 300 s).
4. **Rate limits** (``convertDesiredReplicasWithBehaviorRate``): going up, at most
   ``max(ceil(start * (1 + 100%)), start + 4)`` where ``start`` is the replica count at the start
   of the last ``periodSeconds`` (15 s), i.e. ``current`` minus replicas added plus replicas
   removed by this HPA in that period (``selectPolicy: Max`` of the two default policies);
   going down, ``100%`` per 15 s, i.e. no limit beyond the stabilization.
5. Each sync (``--horizontal-pod-autoscaler-sync-period``, 15 s) that ends at a count different
   from ``spec.replicas`` rescales and records the change as a scale event.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["HpaBehavior", "HpaState"]


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    """The HPA's documented defaults (autoscaling/v2, no ``behavior`` field set)."""

    sync_period_s: float = 15.0
    """How often the controller reconciles an HPA."""
    tolerance: float = 0.1
    """No change while the ratio is within 1 ± tolerance."""
    up_window_s: float = 0.0
    """scaleUp.stabilizationWindowSeconds."""
    down_window_s: float = 300.0
    """scaleDown.stabilizationWindowSeconds."""
    up_percent: float = 100.0
    """scaleUp policy Percent: value 100, periodSeconds 15."""
    up_pods: int = 4
    """scaleUp policy Pods: value 4, periodSeconds 15."""
    up_period_s: float = 15.0
    """periodSeconds of both scale-up policies."""
    down_percent: float = 100.0
    """scaleDown policy Percent: value 100, periodSeconds 15."""
    down_period_s: float = 15.0


@dataclass(slots=True)
class HpaState:
    """One HPA object's memory: recommendations and scale events."""

    min_replicas: int
    max_replicas: int
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    events: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, replica change) of this HPA's rescales."""

    def raw(self, *, current: int, ready: int, metric: float, target: float) -> int:
        """Steps 1-2 for a ``Value`` target: the proposal from this metric alone."""
        ratio = metric / target
        if abs(ratio - 1.0) <= self.behavior.tolerance:
            want = current
        else:
            want = math.ceil(round(ratio * ready, 9)) if current != 0 else math.ceil(ratio)
        return min(self.max_replicas, max(self.min_replicas, want))

    def per_pod(self, *, current: int, total: float, target: float) -> int:
        """Step 1-2 for an ``AverageValue`` target: ``total`` over all pods, ``target`` each."""
        want = current
        if current == 0 or abs(total / (target * current) - 1.0) > self.behavior.tolerance:
            want = math.ceil(round(total / target, 9))
        return min(self.max_replicas, max(self.min_replicas, want))

    def step(self, now: float, *, current: int, desired: int) -> int:
        """One sync from the largest proposal ``desired``: the replica count the HPA sets
        (``current`` when it changes nothing)."""
        b = self.behavior
        # 3. stabilization over the stored recommendations (the current one included)
        longest = max(b.up_window_s, b.down_window_s)
        recs = self.recommendations
        while recs and recs[0][0] < now - longest:
            recs.popleft()
        up = down = desired
        for at, r in recs:
            if at > now - b.up_window_s:
                up = min(up, r)
            if at > now - b.down_window_s:
                down = max(down, r)
        recs.append((now, desired))
        stable = min(max(current, up), down)
        # 4. rate limits from the scale events of the last period
        if stable > current:
            added = self._changed(now, b.up_period_s, +1)
            removed = self._changed(now, b.up_period_s, -1)
            start = current - added + removed
            limit = max(math.ceil(start * (1 + b.up_percent / 100.0)), start + b.up_pods)
            stable = min(stable, max(limit, current), self.max_replicas)
        elif stable < current:
            added = self._changed(now, b.down_period_s, +1)
            removed = self._changed(now, b.down_period_s, -1)
            start = current - added + removed
            limit = math.ceil(start * (1 - b.down_percent / 100.0))
            stable = max(stable, min(limit, current), self.min_replicas)
        if stable != current:
            self.events.append((now, stable - current))
        return stable

    def _changed(self, now: float, period: float, sign: int) -> int:
        while self.events and self.events[0][0] <= now - 3600.0:
            self.events.popleft()
        return sum(abs(d) for at, d in self.events if at > now - period and d * sign > 0)
