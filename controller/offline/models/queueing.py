"""The queueing model: per-request latency of an inference service given its load and capacity.

Model (per service, per tick of ``dt`` seconds):

* **Capacity** ``C = replicas_running * per_replica_rps``: only Running pods serve (a pod still
  starting, or pending for want of a GPU, adds nothing).
* **Utilization** ``rho = offered_rps / C`` from the *offered* rate (the load shape times the
  peak), so it is the same for every policy given the same replicas.
* **Slowdown** ``S(rho) = min(cap, 1 / (1 - rho))`` for ``rho < 1`` and ``cap`` beyond: the mean
  sojourn time of an M/M/1 queue in units of its service time, which is flat at low load and
  explodes as ``rho -> 1`` (``cap``, default 50, stands for the queue being as long as it gets
  before the backlog below takes over).
* **Backlog** (the fluid approximation of overload): ``B <- max(0, B + (offered_rps - C) dt)``
  requests, at most ``C * timeout``; every request of the tick waits ``B / C`` seconds on top.
  So an overload keeps hurting after it ends until the extra capacity drains the queue, and
  scaling up shortens it: decisions change what follows.
* **Per request**: ``latency = min(timeout, base_ms * S(rho) * (1 + jitter * E) + 1000 B / C)``
  with ``E`` a standard exponential draw, so the P99 at zero load is ``base_ms * (1 + jitter *
  ln 100)`` (1.69 x base with the default jitter 0.15) and scales with ``S``. No capacity at all
  means every request times out.

Defaults (:func:`default_model`) are derived from the policy so any policy gets a sensible
service: ``base_ms`` is a quarter of the objective (P99 at zero load 42% of it, so the objective
is breached above ``rho ~ 0.58`` and the recovery threshold at 80% is met below ``rho ~ 0.5``),
each replica serves ``per_replica_rps = 5`` requests/s, and the daily peak is
``peak_rps = 1.25 * per_replica_rps * initial replicas``: the peak wants 2.5x the starting
replicas at ``rho = 0.5``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final

__all__ = ["ServiceModel", "ServiceQueue", "default_model", "latency_samples", "slowdown"]

DEFAULT_PER_REPLICA_RPS: Final = 5.0
DEFAULT_PEAK_PER_REPLICA: Final = 1.25


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """One inference service's load and latency parameters."""

    key: str
    """``namespace/name`` of the service (and of its workload)."""
    peak_rps: float
    """Offered requests per second when the load shape is 1."""
    per_replica_rps: float
    """Requests per second one Running replica serves at ``rho = 1``."""
    base_ms: float
    """Latency scale at zero load (the median request takes about ``1.1 * base_ms``)."""
    cap: float = 50.0
    """Largest slowdown from utilization alone."""
    jitter: float = 0.15
    """Mean of the exponential per-request variation, relative to ``base_ms``."""
    timeout_ms: float = 30_000.0
    """No request takes longer (clients give up); also bounds the backlog."""


def slowdown(rho: float, cap: float) -> float:
    """``min(cap, 1 / (1 - rho))``; ``cap`` at or beyond saturation."""
    if rho >= 1.0:
        return cap
    return min(cap, 1.0 / (1.0 - max(0.0, rho)))


def latency_samples(
    model: ServiceModel, *, rho: float, wait_ms: float, n: int, rng: random.Random
) -> list[float]:
    """``n`` request latencies (ms, rounded to 0.1) at utilization ``rho`` behind a queue of
    ``wait_ms``. For fixed draws each sample is non-decreasing in ``rho`` and ``wait_ms``."""
    scale = model.base_ms * slowdown(rho, model.cap)
    jitter, timeout, expo = model.jitter, model.timeout_ms, rng.expovariate
    return [round(min(timeout, scale * (1.0 + jitter * expo(1.0)) + wait_ms), 1) for _ in range(n)]


class ServiceQueue:
    """One service's queue over a run: the backlog, and each tick's latency samples."""

    __slots__ = ("backlog", "model", "rho", "rng")

    def __init__(self, model: ServiceModel, rng: random.Random) -> None:
        self.model = model
        self.rng = rng
        self.backlog = 0.0
        self.rho = 0.0
        """Utilization of the last tick (``inf`` without capacity), for GPU telemetry."""

    def step(self, *, offered_rps: float, replicas: int, arrivals: int, dt: float) -> list[float]:
        """Advance the backlog by ``dt`` and return the latencies of ``arrivals`` requests."""
        m = self.model
        capacity = replicas * m.per_replica_rps
        if capacity <= 0.0:
            self.rho = math.inf
            self.backlog = 0.0
            # Draw the same number of variates as with capacity, so the stream stays aligned.
            for _ in range(arrivals):
                self.rng.expovariate(1.0)
            return [m.timeout_ms] * arrivals
        self.rho = offered_rps / capacity
        limit = capacity * m.timeout_ms / 1000.0
        self.backlog = min(limit, max(0.0, self.backlog + (offered_rps - capacity) * dt))
        wait_ms = 1000.0 * self.backlog / capacity
        return latency_samples(m, rho=self.rho, wait_ms=wait_ms, n=arrivals, rng=self.rng)


def default_model(key: str, *, objective_ms: float, initial_replicas: int) -> ServiceModel:
    """The model :mod:`controller.offline.experiment` uses for a policy service (see the module
    docs)."""
    per_replica = DEFAULT_PER_REPLICA_RPS
    return ServiceModel(
        key=key,
        peak_rps=DEFAULT_PEAK_PER_REPLICA * per_replica * max(1, initial_replicas),
        per_replica_rps=per_replica,
        base_ms=objective_ms / 4.0,
    )
