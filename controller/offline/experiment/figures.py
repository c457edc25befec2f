"""What ``--compare`` reports per run: one :class:`RunFigures` row of ``compare.json``.

Definitions (``compare.json`` and the comparison report use exactly these):

* ``slo_attainment``: ticks within objective / evaluated ticks, over every service (the engine's
  windowed percentile, as ``summary.json``); ``breach_minutes``: evaluated ticks above the
  objective, summed over services, in minutes.
* ``p99_worst_5min_ms``: the requests are cut into 5-minute windows from the run's start; for
  each service and window the percentile of the service's SLO (P99) over *every request* in it
  (not windowed: the raw latencies); the worst over windows, per service and over all.
* ``training_gpu_hours``: whole GPUs held by training pods (starting and terminating ones
  included), integrated over the run; ``training_goodput_gpu_hours``: the training work kept
  under the restart-aware model (:mod:`.goodput`: any membership change of a DDP/elastic job
  restarts every worker from the job's last checkpoint and costs its restart time; a sweep task
  loses only its own work; start-up and termination are not training);
  ``training_lost_gpu_hours``: the difference of the two. ``training_goodput_gpu_hours_optimistic``:
  the earlier per-pod figure (held minus each removed pod's work since its own checkpoint, an
  elastic shrink at most ``shrinkLoss``, growth free). ``disruptions``: shrinks, grows,
  evictions and preemptions of training, whoever caused them; ``training_restarts``: the DDP
  job restarts among them. ``goodput_sensitivity``: ``training_goodput_gpu_hours`` again with
  every job's checkpoint interval and restart time set to each point of
  :data:`.goodput.SENSITIVITY`.
* Under the LLM serving model, per service also ``ttft_p99_worst_5min_ms``,
  ``tpot_p99_worst_5min_ms`` and ``e2e_p99_worst_5min_ms`` (:class:`ServedWindows`): the worst
  5-minute P99 of time to first token, time per output token and end-to-end latency, whichever
  of them the controllers saw.
* ``reclaimable_gpu_hours``: GPUs held by pods but idle for the whole utilization window (an
  over-provisioned replica's: the engine's ``PoolStatus.reclaimable_gpus``, every pool),
  integrated from one sample per report bucket.
* ``mean_gpu_util_pct``: mean over ticks of the mean utilization of every physical GPU.
* ``actions``: the controller's applied actions (scale, evict, MIG); ``preemptions``: pods the
  *scheduler* preempted (not an action of the controller; the same scheduler for every run but
  ``polling``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.offline.experiment.goodput import GoodputFigures
from controller.offline.models.llmserving import METRICS, LlmServer

__all__ = ["RunFigures", "ServedWindows", "WorstWindow"]


class WorstWindow:
    """The worst percentile of the raw request latencies over tumbling windows (module doc)."""

    def __init__(self, start: float, quantiles: Mapping[str, float], window_s: float = 300.0):
        self.start = start
        self.window_s = window_s
        self.quantiles = dict(quantiles)
        self.worst: dict[str, float | None] = dict.fromkeys(quantiles)
        self._slot = 0
        self._values: dict[str, list[float]] = {k: [] for k in quantiles}

    def add(self, key: str, at: float, samples: Sequence[float]) -> None:
        """Requests of ``key`` completed at ``at`` (non-decreasing over calls)."""
        slot = math.floor((at - self.start) / self.window_s)
        if slot != self._slot:
            self.flush()
            self._slot = slot
        self._values[key].extend(samples)

    def flush(self) -> None:
        """Close the current window."""
        for key, values in self._values.items():
            if not values:
                continue
            values.sort()
            p = values[math.floor(self.quantiles[key] * (len(values) - 1))]
            w = self.worst[key]
            self.worst[key] = p if w is None else max(w, p)
            values.clear()


class ServedWindows:
    """The worst 5-minute P99 of each LLM latency (TTFT, TPOT, end to end) per service: the
    metrics the controllers did not see are reported beside the one they did."""

    def __init__(
        self, start: float, queues: Mapping[str, tuple[object, object]], window_s: float = 300.0
    ) -> None:
        self.servers = {k: q for k, (q, _) in queues.items() if isinstance(q, LlmServer)}
        quantiles = dict.fromkeys(self.servers, 0.99)
        self.windows = {m: WorstWindow(start, quantiles, window_s) for m in METRICS}

    def add(self, key: str, at: float) -> None:
        """The requests ``key``'s server answered in its last step, completed at ``at``."""
        server = self.servers.get(key)
        if server is None:
            return
        for metric, window in self.windows.items():
            values = server.latest(metric)
            if values:
                window.add(key, at, values)

    def flush(self) -> None:
        for window in self.windows.values():
            window.flush()

    def figures(self) -> dict[str, dict[str, float | None]]:
        return {
            key: {f"{m}_p99_worst_5min_ms": w.worst[key] for m, w in self.windows.items()}
            for key in self.servers
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One row of ``--compare`` (module docstring)."""

    controller: str
    label: str
    policy: str
    preemption: bool
    """Whether the run's scheduler preempted lower PriorityClasses."""
    slo_attainment: float | None
    breach_minutes: float
    p99_worst_5min_ms: float | None
    mean_gpu_util_pct: float | None
    training_gpu_hours: float
    goodput: GoodputFigures | None
    """The goodput models' figures (None: no training was followed)."""
    reclaimable_gpu_hours: float
    actions: int
    evictions: int
    preemptions: int
    mig_conversions: int
    scale_actions: int
    events: int
    wall_s: float
    services: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per service: attainment, breach minutes, worst 5-minute percentile."""

    @property
    def training_goodput_gpu_hours(self) -> float:
        """Restart-aware goodput (module docstring)."""
        return self.goodput.useful_gpu_s / 3600.0 if self.goodput else self.training_gpu_hours

    @property
    def training_goodput_gpu_hours_optimistic(self) -> float:
        lost = self.goodput.optimistic_lost_gpu_s / 3600.0 if self.goodput else 0.0
        return self.training_gpu_hours - lost

    @property
    def training_lost_gpu_hours(self) -> float:
        return self.training_gpu_hours - self.training_goodput_gpu_hours

    @property
    def disruptions(self) -> int:
        return self.goodput.disruptions if self.goodput else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "label": self.label,
            "policy": self.policy,
            "preemption": self.preemption,
            "slo_attainment": self.slo_attainment,
            "breach_minutes": round(self.breach_minutes, 3),
            "p99_worst_5min_ms": _r(self.p99_worst_5min_ms),
            "mean_gpu_util_pct": _r(self.mean_gpu_util_pct),
            "training_gpu_hours": round(self.training_gpu_hours, 3),
            "training_goodput_gpu_hours": round(self.training_goodput_gpu_hours, 3),
            "training_goodput_gpu_hours_optimistic": round(
                self.training_goodput_gpu_hours_optimistic, 3
            ),
            "training_lost_gpu_hours": round(self.training_lost_gpu_hours, 3),
            "disruptions": self.disruptions,
            "training_restarts": self.goodput.restarts if self.goodput else 0,
            "goodput_sensitivity": [
                {
                    "checkpoint_interval_s": i,
                    "restart_s": r,
                    "training_goodput_gpu_hours": round(u / 3600.0, 3),
                }
                for i, r, u in (self.goodput.sensitivity if self.goodput else ())
            ],
            "reclaimable_gpu_hours": round(self.reclaimable_gpu_hours, 3),
            "actions": self.actions,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "mig_conversions": self.mig_conversions,
            "scale_actions": self.scale_actions,
            "events": self.events,
            "wall_s": round(self.wall_s, 2),
            "services": {k: dict(v) for k, v in self.services.items()},
        }
