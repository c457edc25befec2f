"""Training goodput: the GPU-seconds of training work that was kept, restart-aware.

Why job-level: a DDP or elastic PyTorch job is one program over all its workers. When its
membership changes — a worker evicted, preempted, drained or removed by a shrink, *or* a worker
added by growth — TorchElastic stops every worker, re-runs the rendezvous and restarts them all
from the job's last checkpoint (torch ``distributed/elastic/agent/server/api.py``,
``SimpleElasticAgent._invoke_run``: on ``num_nodes_waiting > 0`` or a failed worker group it
calls ``_restart_workers``, which stops and re-starts the whole group). A per-pod model, where
the other workers carry on, makes resizing look free; this one does not.

**Restart-aware model** (the default ``training_goodput_gpu_hours``), per training workload
of the scenario (:func:`jobs_of`):

* A **DDP/elastic job** (any kind but ``Job``) trains while it has at least ``min_members``
  Running workers (its gang minimum, else its elastic minimum, else all its replicas). Its
  useful work accrues at its Running workers' GPUs from ``since``; it checkpoints every
  ``interval_s`` counted from ``since``.
* Any **membership change** at ``t`` while it trains (a worker Running, or a Running worker
  starting to terminate) throws away the work since the last checkpoint, ``G * ((t - since)
  mod interval)``, and restarts every worker: ``since = t + restart_s`` (the restart time, 120 s
  by default, during which the job's GPUs do no work: ``restart_s x`` the job's GPUs). A change
  while it restarts restarts the rendezvous again (``since = t + restart_s``); workers that come
  up while the job is (re)starting join that rendezvous without another restart. Fewer than
  ``min_members``: the job waits (no work) until enough are back, then restarts. Its first start
  costs ``restart_s`` too (start-up is not training); workers Running when the measured run
  starts count as training from that start.
* A **sweep task** (a ``Job``'s pod, or a training pod of no workload) is alone: it trains from
  Running and loses only its own work since its last checkpoint when it starts terminating.
* **Start-up and termination are not training**: a worker's GPUs count from Running and stop at
  the termination's start (the grace period computes nothing kept).
* Work not yet checkpointed when the run ends counts as done.
* ``disruptions``: every shrink, grow, eviction and preemption of training, whoever caused it:
  a DDP job's membership changes after it first started (changes at the same instant are one),
  plus every sweep task that was Running when it started terminating.

**Optimistic model** (``training_goodput_gpu_hours_optimistic``, the earlier figure): GPU-hours
held by training pods (starting and terminating included) minus, per removed pod, the work since
*its own* last checkpoint, or at most ``shrink_loss_s`` when an elastic job was shrunk (the
survivors carry on); growth is free.

:class:`Goodput` follows one simulated cluster's effects and feeds both models, plus the
restart-aware model at every point of a sensitivity grid (:data:`SENSITIVITY`: checkpoint
interval x restart time, overriding every job's), from the same effects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from controller.simcluster import Scenario, SimCluster
from policies.inventory import matches

__all__ = [
    "DEFAULT_CHECKPOINT_S",
    "DEFAULT_RESTART_S",
    "DEFAULT_SHRINK_LOSS_S",
    "SENSITIVITY",
    "Goodput",
    "GoodputFigures",
    "RestartAware",
    "TrainingJob",
    "jobs_of",
    "lost_work",
]

DEFAULT_CHECKPOINT_S: Final = 1800.0
DEFAULT_SHRINK_LOSS_S: Final = 60.0
DEFAULT_RESTART_S: Final = 120.0
#: (checkpoint interval s, restart time s) points reported beside the scenario's own figures.
SENSITIVITY: Final[tuple[tuple[float, float], ...]] = tuple(
    (interval, restart) for interval in (600.0, 1800.0, 3600.0) for restart in (60.0, 120.0, 300.0)
)
_SHRINK: Final = "scaled down"
_TASKS: Final = "Job"


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """How one training workload checkpoints and restarts (scenario fields, :func:`jobs_of`)."""

    interval_s: float = DEFAULT_CHECKPOINT_S
    restart_s: float = DEFAULT_RESTART_S
    shrink_loss_s: float = DEFAULT_SHRINK_LOSS_S
    """The optimistic model's most loss of a replica removed by a shrink."""
    elastic: bool = False
    tasks: bool = False
    """Its pods are independent sweep tasks (a ``Job``), not one DDP program."""
    min_members: int = 1
    """Running workers it needs to train."""


def jobs_of(scenario: Scenario) -> dict[str, TrainingJob]:
    """Per workload key of ``scenario``, its :class:`TrainingJob`."""
    jobs: dict[str, TrainingJob] = {}
    for w in scenario.spec.workloads:
        e = w.elastic
        least = w.replicas if e is None else (e.gang_minimum or e.min)
        jobs[f"{w.namespace}/{w.name}"] = TrainingJob(
            interval_s=w.checkpoint_interval,
            restart_s=w.restart_time,
            shrink_loss_s=w.shrink_loss,
            elastic=e is not None,
            tasks=w.kind == _TASKS,
            min_members=max(1, least),
        )
    return jobs


def lost_work(
    *, origin: float, at: float, interval: float, gpus: int, shrink_loss: float | None
) -> float:
    """GPU-seconds lost by a replica Running since ``origin`` that is gone at ``at``:
    everything since its last checkpoint, or at most ``shrink_loss`` for an elastic shrink."""
    ran = max(0.0, at - origin)
    since = ran - _kept(ran, interval)
    if shrink_loss is not None:
        since = min(since, shrink_loss)
    return gpus * since


def _kept(ran: float, interval: float) -> float:
    """Of ``ran`` seconds of work checkpointed every ``interval`` from its start, what the last
    checkpoint holds (nothing without checkpoints)."""
    return math.floor(ran / interval) * interval if interval > 0 else 0.0


@dataclass(slots=True)
class _Ddp:
    job: TrainingJob
    members: dict[str, int] = field(default_factory=dict)
    since: float | None = None
    """When the current membership trains (after its restart); None while it waits."""
    changed_at: float | None = None


class RestartAware:
    """The restart-aware model (module docstring) over joins and leaves of training pods."""

    def __init__(self, jobs: Mapping[str, TrainingJob]) -> None:
        self.jobs = jobs
        self.useful_gpu_s = 0.0
        self.disruptions = 0
        self.restarts = 0
        """DDP job restarts caused by a membership change (first starts not counted)."""
        self._ddp: dict[str, _Ddp] = {}
        self._tasks: dict[str, tuple[float, int, float]] = {}

    def _accrue(self, d: _Ddp, at: float) -> None:
        if d.since is not None and at > d.since:
            self.useful_gpu_s += sum(d.members.values()) * _kept(at - d.since, d.job.interval_s)

    def _disrupted(self, d: _Ddp, at: float) -> None:
        if d.changed_at != at:
            self.disruptions += 1
            self.restarts += 1
        d.changed_at = at

    def join(self, key: str, workload: str, gpus: int, at: float, *, started: bool) -> None:
        """Pod ``key`` of ``workload`` Running at ``at`` (``started``: already training)."""
        job = self.jobs.get(workload)
        if job is None or job.tasks:
            self._tasks[key] = (at, gpus, (job or TrainingJob()).interval_s)
            return
        d = self._ddp.setdefault(workload, _Ddp(job))
        training = d.since is not None and at >= d.since
        if training and not started:
            self._accrue(d, at)
            self._disrupted(d, at)
        d.members[key] = gpus
        if started:
            d.since = at
        elif training or (d.since is None and len(d.members) >= job.min_members):
            d.since = at + job.restart_s

    def leave(self, key: str, at: float) -> None:
        """Pod ``key`` starts terminating at ``at`` (a no-op when it was not Running)."""
        task = self._tasks.pop(key, None)
        if task is not None:
            origin, gpus, interval = task
            self.useful_gpu_s += gpus * _kept(at - origin, interval)
            self.disruptions += 1
            return
        for d in self._ddp.values():
            if key in d.members:
                self._accrue(d, at)
                self._disrupted(d, at)
                del d.members[key]
                enough = len(d.members) >= d.job.min_members
                d.since = at + d.job.restart_s if enough else None
                return

    def close(self, end: float) -> None:
        """The run ends at ``end``: work since the last checkpoint counts as done."""
        for origin, gpus, _ in self._tasks.values():
            self.useful_gpu_s += gpus * max(0.0, end - origin)
        self._tasks.clear()
        for d in self._ddp.values():
            if d.since is not None and end > d.since:
                self.useful_gpu_s += sum(d.members.values()) * (end - d.since)
            d.since = None


@dataclass(frozen=True, slots=True)
class GoodputFigures:
    """What :meth:`Goodput.figures` reports (GPU-seconds and counts)."""

    useful_gpu_s: float
    optimistic_lost_gpu_s: float
    disruptions: int
    restarts: int
    sensitivity: Sequence[tuple[float, float, float]]
    """(checkpoint interval s, restart time s, useful GPU-s) at each :data:`SENSITIVITY` point."""


class Goodput:
    """Follows one simulated cluster's effects and feeds both models (module docstring)."""

    def __init__(
        self,
        sim: SimCluster,
        *,
        checkpoints: Mapping[str, TrainingJob],
        training_selector: Mapping[str, str],
        start: float,
    ) -> None:
        """``checkpoints``: per workload key, its :class:`TrainingJob` (:func:`jobs_of`)."""
        self.sim = sim
        self.checkpoints = checkpoints
        self.selector = training_selector
        self.lost_gpu_s = 0.0
        """The optimistic model's lost work so far, in GPU-seconds."""
        self.losses = 0
        """Training pods that lost work in the optimistic model."""
        self.model = RestartAware(checkpoints)
        self.grid = [
            (interval, restart, RestartAware(_override(checkpoints, interval, restart)))
            for interval, restart in SENSITIVITY
        ]
        self._models = [self.model, *(m for _, _, m in self.grid)]
        self._cursor = len(sim.effects)
        self._running: dict[str, tuple[float, int, str]] = {}
        self._why: dict[str, str] = {}
        self._closed: GoodputFigures | None = None
        for pod in sim.snapshot().pods:
            if pod.phase == "Running" and pod.gpus > 0 and matches(self.selector, pod.labels):
                self._start(pod.key, pod.gpus, pod.workload or "", start, started=True)

    def _start(self, key: str, gpus: int, workload: str, at: float, *, started: bool) -> None:
        self._running[key] = (at, gpus, workload)
        for m in self._models:
            m.join(key, workload, gpus, at, started=started)

    def _started(self, key: str, at: float, *, scheduled: bool) -> None:
        """``key`` started running at ``at``, or was scheduled then (which is running for a pod
        of no start-up: the simulator logs no ``running`` for it)."""
        pod = self.sim.pod(key)
        if pod is None or key in self._running:
            return
        if scheduled and self.sim.startup_s(pod.workload) > 0:
            return
        if pod.gpus > 0 and matches(self.selector, pod.labels):
            self._start(key, pod.gpus, pod.workload or "", at, started=False)

    def update(self) -> None:
        """Take the effects since the last call into account."""
        effects = self.sim.effects_since(self._cursor)
        self._cursor += len(effects)
        for e in effects:
            if e.kind in ("running", "scheduled"):
                self._started(e.target, e.at, scheduled=e.kind == "scheduled")
            elif e.kind == "terminating":
                self._why[e.target] = e.detail
                for m in self._models:
                    m.leave(e.target, e.at)
            elif e.kind == "deleted":
                self._deleted(e.target, e.at, self._why.pop(e.target, e.detail))

    def _deleted(self, key: str, at: float, why: str) -> None:
        for m in self._models:
            m.leave(key, at)  # deleted without terminating first
        run = self._running.pop(key, None)
        if run is None:
            return
        origin, gpus, workload = run
        job = self.checkpoints.get(workload, TrainingJob())
        shrunk = job.elastic and why.startswith(_SHRINK)
        lost = lost_work(
            origin=origin,
            at=at,
            interval=job.interval_s,
            gpus=gpus,
            shrink_loss=job.shrink_loss_s if shrunk else None,
        )
        self.lost_gpu_s += lost
        self.losses += lost > 0

    def figures(self, end: float) -> GoodputFigures:
        """Close every model at ``end`` and report; later calls return the same figures."""
        if self._closed is None:
            for m in self._models:
                m.close(end)
            self._closed = GoodputFigures(
                useful_gpu_s=self.model.useful_gpu_s,
                optimistic_lost_gpu_s=self.lost_gpu_s,
                disruptions=self.model.disruptions,
                restarts=self.model.restarts,
                sensitivity=tuple((i, r, m.useful_gpu_s) for i, r, m in self.grid),
            )
        return self._closed


def _override(
    jobs: Mapping[str, TrainingJob], interval: float, restart: float
) -> dict[str, TrainingJob]:
    """``jobs`` with every checkpoint interval and restart time replaced (training pods of no
    scenario workload keep :class:`TrainingJob`'s defaults)."""
    return {k: replace(j, interval_s=interval, restart_s=restart) for k, j in jobs.items()}
