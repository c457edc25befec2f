"""Peers Ebbtide is compared against in ``ebbtide simulate --compare``: one small interface,
one module per implementation (as KEDA's ``pkg/scalers/*_scaler.go``).

* ``hpa-priority`` (:mod:`.hpa_priority`): the HPA's documented algorithm and default behaviour
  (:mod:`.hpa`) on a Prometheus-delayed P99 (:mod:`.prometheus`), plus kube-scheduler's
  PriorityClass preemption in the simulated cluster;
* ``keda-priority`` (:mod:`.keda_priority`): the same with KEDA's 30 s polling in front;
* ``polling`` (:class:`~controller.offline.experiment.baselines.PollingAutoscaler`): an HPA on a 30
s-old
  P99 every 30 s with **no** preemption (the strawman of earlier benchmarks, kept and labelled);
* ``static`` (:func:`~controller.offline.experiment.baselines.static_partition`): a plan applied
before
  the run, then nothing; it is not a :class:`Peer` (it never decides during the run).
"""

from __future__ import annotations

from typing import Protocol

from controller.offline.experiment.peers.hpa import HpaBehavior, HpaState
from controller.offline.experiment.peers.hpa_priority import HpaPriority
from controller.offline.experiment.peers.keda_priority import KedaPriority
from controller.offline.experiment.peers.promquery import PrometheusQuantile
from policies.decisions import Decision
from policies.snapshot import Snapshot
from streams.events import Event

__all__ = ["HpaBehavior", "HpaPriority", "HpaState", "KedaPriority", "Peer", "PrometheusQuantile"]


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
