"""Training goodput: the GPU-hours training held, minus the work it lost when pods went away.

Model (per training pod, from the simulated cluster's effects):

* A training replica does useful work from the moment it is **Running** (pods Running when the
  measured run starts count from that start) and checkpoints every ``checkpointInterval`` of
  its workload (a scenario field, default 30 min) counted from then: the last checkpoint before
  ``t`` is ``origin + floor((t - origin) / interval) * interval``.
* When the pod is **deleted** after an *eviction* (a controller's Evict, the scheduler's
  preemption, a MIG drain, a scale-down of a job that is not elastic), the work since its last
  checkpoint is lost: ``gpus * (t_deleted - last_checkpoint)``. The grace period counts: the
  process runs until it is killed, but what it computed after the checkpoint is thrown away.
* When an **elastic** job is *shrunk* (its replicas lowered: the workload controller removes
  the pod), the survivors carry on from their own state (TorchElastic, DeepSpeed elastic
  re-rendezvous), so the removed replica loses at most its current step: ``gpus *
  min(shrinkLoss, t_deleted - last_checkpoint)`` (``shrinkLoss`` a scenario field, default 1 min).
* A pod deleted before it ran lost nothing. Work not yet checkpointed when the run ends is not
  counted as lost.

``goodput = training GPU-hours - lost GPU-hours``. Training GPU-hours (the runner's) count every
whole GPU a training pod holds, starting and terminating pods included, so the loss above is
the only deduction: the model is deliberately simple and the same for every controller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from controller.simcluster import SimCluster
from policies.inventory import matches

__all__ = ["DEFAULT_CHECKPOINT_S", "DEFAULT_SHRINK_LOSS_S", "Goodput", "lost_work"]

DEFAULT_CHECKPOINT_S: Final = 1800.0
DEFAULT_SHRINK_LOSS_S: Final = 60.0
_SHRINK: Final = "scaled down"


def lost_work(
    *, origin: float, at: float, interval: float, gpus: int, shrink_loss: float | None
) -> float:
    """GPU-seconds lost by a replica Running since ``origin`` that is gone at ``at``:
    everything since its last checkpoint, or at most ``shrink_loss`` for an elastic shrink."""
    ran = max(0.0, at - origin)
    since = ran - math.floor(ran / interval) * interval if interval > 0 else ran
    if shrink_loss is not None:
        since = min(since, shrink_loss)
    return gpus * since


class Goodput:
    """Follows one simulated cluster's effects and adds up training work lost (module doc)."""

    def __init__(
        self,
        sim: SimCluster,
        *,
        checkpoints: Mapping[str, tuple[float, float, bool]],
        training_selector: Mapping[str, str],
        start: float,
    ) -> None:
        """``checkpoints``: per workload key, (interval s, shrink loss s, elastic)."""
        self.sim = sim
        self.checkpoints = checkpoints
        self.selector = training_selector
        self.lost_gpu_s = 0.0
        """Training work lost so far, in GPU-seconds."""
        self.losses = 0
        """Training pods that lost work (evicted, preempted or shrunk after running)."""
        self._cursor = len(sim.effects)
        self._running: dict[str, tuple[float, int, str]] = {}
        self._why: dict[str, str] = {}
        for pod in sim.snapshot().pods:
            if pod.phase == "Running" and pod.gpus > 0 and matches(self.selector, pod.labels):
                self._running[pod.key] = (start, pod.gpus, pod.workload or "")

    def _started(self, key: str, at: float) -> None:
        pod = self.sim.pod(key)
        if pod is not None and pod.gpus > 0 and matches(self.selector, pod.labels):
            self._running[key] = (at, pod.gpus, pod.workload or "")

    def update(self) -> None:
        """Take the effects since the last call into account."""
        effects = self.sim.effects_since(self._cursor)
        self._cursor += len(effects)
        instant = self.sim.delays.pod_startup_s == 0
        for e in effects:
            if e.kind == "running" or (e.kind == "scheduled" and instant):
                self._started(e.target, e.at)
            elif e.kind == "terminating":
                self._why[e.target] = e.detail
            elif e.kind == "deleted":
                why = self._why.pop(e.target, e.detail)
                run = self._running.pop(e.target, None)
                if run is None:
                    continue
                origin, gpus, workload = run
                interval, shrink, elastic = self.checkpoints.get(
                    workload, (DEFAULT_CHECKPOINT_S, DEFAULT_SHRINK_LOSS_S, False)
                )
                shrunk = elastic and why.startswith(_SHRINK)
                lost = lost_work(
                    origin=origin,
                    at=e.at,
                    interval=interval,
                    gpus=gpus,
                    shrink_loss=shrink if shrunk else None,
                )
                self.lost_gpu_s += lost
                self.losses += lost > 0
