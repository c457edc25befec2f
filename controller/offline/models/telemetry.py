"""GPU telemetry of the simulated cluster: which device serves whom, and what it reports.

Design:

* **Devices** (:func:`devices_of`): every whole GPU of a node, and every MIG instance of a
  partitioned GPU, as the DCGM exporter lists them. The simulator tracks GPUs per node, not per
  device, so pods are laid onto devices deterministically: the node's GPU-holding pods sorted by
  name take consecutive whole GPUs (or instances of their profile) in index order. Recomputed
  only when the snapshot object changes.
* **Utilization** (:class:`Telemetry.readings`): a device held by a training pod reports
  ``95% +- 1.5`` (a busy data-parallel job); by a Running replica of a policy service
  ``100 * rho`` of that service (``rho`` from :mod:`controller.offline.models.queueing`, at most
  100,
  +-3% noise); by a replica of any other inference workload (not named by the policy, so with no
  latency model) ``50% *`` the load shape; a pod still starting, a free device or a node being
  reconfigured reports 0. Readings are published every ``util_every_s`` (15 s) as
  :class:`~streams.events.GpuUtilization` events, per MIG instance with its profile.
* **Pool utilization** is accounted by ``ebbtide replay``'s own meter
  (:class:`~controller.offline.accounting.poolmeter.PoolMeter`, re-exported here): each device
  holds its
  last reading, a device belongs to its node's pool as of the last snapshot, a node's previous
  MIG layout stops counting when it changes. Replaying the recording of a run therefore reports
  the same utilization.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from controller.offline.accounting.poolmeter import PoolMeter
from policies.inventory import matches
from policies.snapshot import Snapshot
from streams.events import GpuUtilization

__all__ = [
    "Device",
    "PoolMeter",
    "Telemetry",
    "devices_of",
    "physical_mean",
    "running_replicas",
]

Use = Literal["training", "service", "other", "idle"]


@dataclass(frozen=True, slots=True)
class Device:
    """One reporting device and what runs on it."""

    node: str
    gpu: int
    mig_profile: str | None
    mig_instance: int | None
    use: Use
    owner: str | None
    """The policy service key (``use == "service"``) or the pod key, else ``None``."""


def devices_of(
    snapshot: Snapshot,
    *,
    services: Mapping[str, str],
    training_selector: Mapping[str, str],
) -> list[Device]:
    """Every device of ``snapshot`` with its use; ``services`` maps workload keys to the policy
    service keys they serve."""
    by_node: dict[str, list[tuple[str, int, Mapping[str, int], Use, str | None]]] = {}
    for pod in snapshot.pods:
        if not pod.holds_gpus or pod.node is None or (pod.gpus == 0 and not pod.mig):
            continue
        use: Use
        owner: str = pod.key
        if pod.phase != "Running":
            use = "idle"
        elif matches(training_selector, pod.labels):
            use = "training"
        elif pod.workload is not None and pod.workload in services:
            use, owner = "service", services[pod.workload]
        else:
            use = "other"
        by_node.setdefault(pod.node, []).append((pod.name, pod.gpus, pod.mig, use, owner))
    out: list[Device] = []
    for node in snapshot.nodes:
        pods = sorted(by_node.get(node.name, ()))
        reconfiguring = node.mig_state == "pending"
        whole = [g for g in node.gpus if g.mig_profile is None]
        slots: list[tuple[int, str, int]] = [
            (g.index, g.mig_profile, j)
            for g in node.gpus
            if g.mig_profile is not None
            for j in range(g.mig_slices)
        ]
        holders: list[tuple[Use, str | None]] = [("idle", None)] * len(whole)
        inst: list[tuple[Use, str | None]] = [("idle", None)] * len(slots)
        w = 0
        for _, gpus, mig, kind, holder in pods:
            for _ in range(gpus):
                if w < len(holders):
                    holders[w] = (kind, holder)
                    w += 1
            for profile, count in sorted(mig.items()):
                for _ in range(count):
                    i = next(
                        (i for i, s in enumerate(slots) if s[1] == profile and inst[i][1] is None),
                        None,
                    )
                    if i is not None:
                        inst[i] = (kind, holder)
        for g, (held, who) in zip(whole, holders, strict=True):
            if reconfiguring:
                held, who = "idle", None
            out.append(Device(node.name, g.index, None, None, held, who))
        for (index, profile, j), (held, who) in zip(slots, inst, strict=True):
            if reconfiguring:
                held, who = "idle", None
            out.append(Device(node.name, index, profile, j, held, who))
    return out


def running_replicas(snapshot: Snapshot, workloads: Mapping[str, str]) -> dict[str, int]:
    """Running pods per policy service key (``workloads`` maps workload key -> service key)."""
    counts = dict.fromkeys(workloads.values(), 0)
    for pod in snapshot.pods:
        service = workloads.get(pod.workload or "")
        if service is not None and pod.phase == "Running" and pod.node is not None:
            counts[service] += 1
    return counts


class Telemetry:
    """The devices of the current snapshot, and their readings at a tick."""

    def __init__(
        self,
        *,
        services: Mapping[str, str],
        training_selector: Mapping[str, str],
        rng: random.Random,
    ) -> None:
        self.services = dict(services)
        self.training_selector = training_selector
        self.rng = rng
        self.devices: list[Device] = []
        self._for: Snapshot | None = None

    def refresh(self, snapshot: Snapshot) -> None:
        if snapshot is not self._for:
            self._for = snapshot
            self.devices = devices_of(
                snapshot, services=self.services, training_selector=self.training_selector
            )

    def readings(
        self, ts: float, *, rho: Mapping[str, float], other_load: float
    ) -> list[GpuUtilization]:
        """One reading per device at ``ts`` (see the module docstring)."""
        gauss = self.rng.gauss
        out: list[GpuUtilization] = []
        for d in self.devices:
            if d.use == "training":
                util = 95.0 + gauss(0.0, 1.5)
            elif d.use == "service":
                util = min(100.0, 100.0 * rho.get(d.owner or "", 0.0)) * (1.0 + gauss(0.0, 0.03))
            elif d.use == "other":
                util = 50.0 * other_load * (1.0 + gauss(0.0, 0.03))
            else:
                util = 0.0
            out.append(
                GpuUtilization(
                    ts=ts,
                    node=d.node,
                    gpu=d.gpu,
                    util_pct=round(min(100.0, max(0.0, util)), 1),
                    mig_profile=d.mig_profile,
                    mig_instance=d.mig_instance,
                )
            )
        return out


def physical_mean(readings: Sequence[GpuUtilization]) -> float | None:
    """Mean utilization over physical GPUs (a MIG GPU: the mean of its instances)."""
    per_gpu: dict[tuple[str, int | str], list[float]] = {}
    for ev in readings:
        cell = per_gpu.setdefault((ev.node, ev.gpu), [0.0, 0.0])
        cell[0] += ev.util_pct
        cell[1] += 1.0
    if not per_gpu:
        return None
    return sum(s / n for s, n in per_gpu.values()) / len(per_gpu)
