"""Peers Ebbtide is compared against in ``ebbtide simulate --compare``: one small interface,
one module per implementation (as KEDA has one scaler per file). docs/scenarios.md cites the
upstream source each one follows.

Fair peers (:data:`FAIR`), each with the scheduler's PriorityClass preemption and the same
priority backfill of idle GPUs by training
(:class:`~controller.offline.experiment.baselines.Backfill`):

* ``hpa-rate`` (:mod:`.hpa_rate`): HPA v2 on request rate per replica plus a P99 guard;
* ``hpa-latency`` (:mod:`.hpa_latency`): HPA v2 on the P99, target below the objective;
* ``keda`` (:mod:`.keda`): KEDA's Prometheus scaler at its defaults (``cached`` an option);
* ``kpa`` (:mod:`.kpa`): Knative's KPA on concurrency, stable and panic windows;
* ``static-p95`` (:func:`~controller.offline.experiment.baselines.static_partition`): sized
  before the run at the P95 of the previous window's load plus headroom.

Not fair, kept and labelled: ``static-peak`` (an oracle sized for the run's own peak, bursts
included) and ``polling`` (a strawman: HPA on a 30 s-old P99 every 30 s, no preemption, no
backfill).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.offline.experiment.peers.hpa import HpaBehavior, HpaState
from controller.offline.experiment.peers.hpa_latency import HpaLatency, HpaLatencySettings
from controller.offline.experiment.peers.hpa_rate import HpaRate, HpaRateSettings
from controller.offline.experiment.peers.hpacontroller import HpaPeer, HpaSettings
from controller.offline.experiment.peers.keda import Keda, KedaSettings
from controller.offline.experiment.peers.kpa import Kpa, KpaSettings, KpaState
from controller.offline.experiment.peers.promquery import Pipeline, PrometheusQuantile
from policies.decisions import Decision
from policies.snapshot import Snapshot
from streams.events import Event

__all__ = [
    "DECIDING",
    "HpaBehavior",
    "HpaLatency",
    "HpaLatencySettings",
    "HpaPeer",
    "HpaRate",
    "HpaRateSettings",
    "HpaSettings",
    "HpaState",
    "Keda",
    "KedaSettings",
    "Kpa",
    "KpaSettings",
    "KpaState",
    "Peer",
    "Pipeline",
    "PrometheusQuantile",
]


class Peer(Protocol):
    """An autoscaler run in Ebbtide's place: it sees the same events and snapshots."""

    name: str
    """Its name in ``compare.json`` (``runs[].controller``)."""
    label: str
    """What it is, for tables and the report."""
    preemption: bool
    """Whether its cluster's scheduler preempts lower PriorityClasses."""

    def observe(self, event: Event) -> None:
        """Every generated event, in time order."""

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Its decisions at ``now`` (applied to the simulated cluster as they are)."""
        ...


#: The peers that decide during the run: name -> (class, settings class).
DECIDING: Mapping[str, tuple[Any, Any]] = {
    "hpa-rate": (HpaRate, HpaRateSettings),
    "hpa-latency": (HpaLatency, HpaLatencySettings),
    "keda": (Keda, KedaSettings),
    "kpa": (Kpa, KpaSettings),
}
