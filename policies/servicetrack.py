"""What the engine keeps per service: its windows, its SLO state and where it stands in the
incremental schedule.

One object per service is shared by the engine's parts, each writing its own fields: intake
(:mod:`policies.intake`) adds to the windows and marks the service due; the schedule
(:mod:`policies.scheduling`) steps its SLO and keeps its wake time; deciding
(:mod:`policies.deciding`) runs its rules and keeps its scale-down recommendations. Slotted
attributes, since intake touches it for every latency event.
"""

from __future__ import annotations

import math

from policies.model import ServiceSpec
from policies.scaledown import Recommendations
from policies.slo import ExceedanceWindow, SloState
from policies.windows import LatencyWindow

__all__ = ["ServiceTrack"]


class ServiceTrack:
    """One service's windows, SLO state and schedule (see the module docstring)."""

    __slots__ = (
        "down",
        "due",
        "exceed",
        "index",
        "interval",
        "key",
        "latency",
        "metric",
        "min_samples",
        "name",
        "namespace",
        "q",
        "ruled_at",
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
        #: When the SLO must be ticked again without events (:mod:`policies.scheduling`).
        self.wake = -math.inf
        #: When the SLO was last ticked.
        self.ticked_at = -math.inf
        #: Samples in the window when the SLO was last ticked.
        self.samples = 0
        #: When the rules last ran for the service.
        self.ruled_at: float | None = None
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

    @staticmethod
    def _recommendations(spec: ServiceSpec, kept: Recommendations | None) -> Recommendations | None:
        """Scale-down recommendations for a service that has ``scale.down`` (kept across a
        reload that keeps it), else none."""
        if spec.scale is None or spec.scale.down is None:
            return None
        return kept if kept is not None else Recommendations()

    @staticmethod
    def _counters(spec: ServiceSpec) -> ExceedanceWindow:
        s = spec.slo
        return ExceedanceWindow(
            window_s=s.window,
            interval_s=s.resolution,
            high=s.objective_ms,
            low=s.objective_ms * s.recover_below,
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
        self.spec = spec
        self.down = self._recommendations(spec, self.down)
        self.q = new.percentile / 100.0
        self.min_samples = new.min_samples
        self.interval = new.resolution
