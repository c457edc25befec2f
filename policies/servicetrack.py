"""What the engine keeps per service: its windows, its SLO state and where it stands in the
incremental schedule.

One object per service is shared by the engine's parts, each writing its own fields: intake
(:mod:`policies.intake`) adds to the windows and marks the service due; the schedule
(:mod:`policies.scheduling`) steps its SLO and keeps its wake time; deciding
(:mod:`policies.deciding`) runs its rules and keeps its scale-down recommendations and what its
leading indicator learns (:mod:`policies.headroom`). Slotted
attributes, since intake touches it for every latency event.
"""

from __future__ import annotations

import math

from policies.headroom import ServiceLoad
from policies.indicators import request_rate
from policies.inventory import Inventory
from policies.model import ServiceSpec
from policies.rules import breach_quiet_static
from policies.scaledown import Recommendations, scale_down_floor, scale_down_quiet_static
from policies.slo import ExceedanceWindow, SloState
from policies.windows import LatencyWindow, reads_at_least

__all__ = ["ServiceTrack", "observe_load"]


class ServiceTrack:
    """One service's windows, SLO state and schedule (see the module docstring)."""

    __slots__ = (
        "below_slack",
        "breach_quiet",
        "down",
        "down_quiet",
        "due",
        "exceed",
        "index",
        "interval",
        "key",
        "latency",
        "load",
        "metric",
        "min_samples",
        "name",
        "namespace",
        "q",
        "ruled_at",
        "rules_at",
        "samples",
        "slo",
        "spec",
        "ticked_at",
        "wake",
    )

    def __init__(self, name: str, spec: ServiceSpec) -> None:
        #: Position in the engine's sorted order.
        self.index = 0
        #: Events arrived since the SLO was last ticked.
        self.due = True
        #: How many requests its last (quiet) step left room for before it must be stepped
        #: again, none of them above the recovery threshold (0: the next event steps it). Its
        #: level was "below": such requests cannot change it before the wake worked out then,
        #: and its rules only hold whatever its window holds (any number) or while the
        #: percentile stays at or above the scale-down rule's floor (the counters' slack), so
        #: an event within that room does not make it due (:mod:`policies.scheduling`).
        self.below_slack = 0
        #: When the SLO must be ticked again without events (:mod:`policies.scheduling`).
        self.wake = -math.inf
        #: When the SLO was last ticked.
        self.ticked_at = -math.inf
        #: Samples in the window when the SLO was last ticked.
        self.samples = 0
        #: When the rules last ran for the service.
        self.ruled_at: float | None = None
        #: When its rules must run again though nothing changed (a cooldown ends;
        #: :mod:`policies.scheduling`), ``-math.inf`` for no such time.
        self.rules_at = -math.inf
        self.name = name
        self.namespace = spec.namespace
        self.key = f"{spec.namespace}/{name}"
        self.spec = spec
        s = spec.slo
        self.q = s.percentile / 100.0
        #: The latency its objective is on (``e2e``, ``ttft`` or ``tpot``).
        self.metric = s.metric
        self.min_samples = s.min_samples
        self.interval = s.resolution
        self.latency = LatencyWindow(window_s=s.window, interval_s=s.resolution)
        self.exceed = self._counters(spec)
        self.slo = SloState()
        self.down = self._recommendations(spec, None)
        #: :func:`~policies.rules.breach_quiet_static` and
        #: :func:`~policies.scaledown.scale_down_quiet_static` of the spec, worked out once.
        self.breach_quiet = breach_quiet_static(spec)
        self.down_quiet = scale_down_quiet_static(spec)
        #: Learned capacity, start-up and growth, for a service with ``scale.leading``.
        self.load = self._load(spec, None)

    @staticmethod
    def _load(spec: ServiceSpec, kept: ServiceLoad | None) -> ServiceLoad | None:
        """What the leading indicator learns, for a service that has one (kept across a
        reload that keeps it)."""
        if spec.scale is None or spec.scale.leading is None:
            return None
        return kept if kept is not None else ServiceLoad()

    @staticmethod
    def _recommendations(spec: ServiceSpec, kept: Recommendations | None) -> Recommendations | None:
        """Scale-down recommendations for a service that has ``scale.down`` (kept across a
        reload that keeps it), else none."""
        if spec.scale is None or spec.scale.down is None:
            return None
        return kept if kept is not None else Recommendations()

    @staticmethod
    def _floor(spec: ServiceSpec) -> float | None:
        """What the counters count above besides the SLO's thresholds: the latency above
        which requests read, in the latency window's sketch, at or above the scale-down rule's
        :func:`~policies.scaledown.scale_down_floor`."""
        floor = scale_down_floor(spec)
        return None if floor is None else reads_at_least(floor)

    @classmethod
    def _counters(cls, spec: ServiceSpec) -> ExceedanceWindow:
        s = spec.slo
        return ExceedanceWindow(
            window_s=s.window,
            interval_s=s.resolution,
            high=s.objective_ms,
            low=s.objective_ms * s.recover_below,
            floor=cls._floor(spec),
        )

    def respec(self, spec: ServiceSpec) -> None:
        """Adopt a reloaded spec, keeping whatever data the new SLO can still use."""
        old = self.spec.slo
        new = spec.slo
        if (old.window, old.resolution) != (new.window, new.resolution):
            self.latency = LatencyWindow(window_s=new.window, interval_s=new.resolution)
            self.exceed = self._counters(spec)
        elif (old.objective_ms, old.recover_below) != (new.objective_ms, new.recover_below):
            self.exceed = self._counters(spec)
        else:
            self.exceed.refloor(self._floor(spec))
        self.spec = spec
        self.down = self._recommendations(spec, self.down)
        self.breach_quiet = breach_quiet_static(spec)
        self.down_quiet = scale_down_quiet_static(spec)
        self.load = self._load(spec, self.load)
        self.q = new.percentile / 100.0
        self.min_samples = new.min_samples
        self.interval = new.resolution


def observe_load(svc: ServiceTrack, now: float, inv: Inventory) -> None:
    """Feed the service's leading indicator what the evaluation at ``now`` sees: its request
    rate and percentile over the SLO window and its workload's pods (:mod:`policies.headroom`)."""
    load, spec = svc.load, svc.spec
    if load is None:
        return
    rate = request_rate(spec, svc.samples, svc.latency, now)
    workload = inv.service_workload.get(svc.key)
    pods = inv.pods_by_workload.get(workload.key, ()) if workload is not None else ()
    load.observe(
        now,
        spec,
        rate=rate if svc.samples >= svc.min_samples else None,
        p_ms=svc.latency.quantile(now, svc.q),
        pods=pods,
    )
