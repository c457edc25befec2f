"""Pool utilization from GPU readings: the one meter ``ebbtide replay`` and ``ebbtide simulate``
both account with, so a simulated run and the replay of its recording report the same figures.

Design:

* **Sample and hold.** Each device (a whole GPU, or one MIG instance: ``(node, gpu, instance)``)
  holds its last reading; a pool's utilization is the mean over its devices that have reported.
  Each pool keeps a running sum and count, so a reading costs one dict lookup and two float
  updates (the replay loop calls :meth:`PoolMeter.report` for every reading of a recording).
* **A device belongs to its node's pool as of the last snapshot** (:meth:`PoolMeter.refresh`):
  a MIG conversion that relabels a node moves its devices' readings to the other pool.
* **A layout replaces the one before it.** A physical GPU is whole or partitioned into instances
  of one profile, never both: when a node's layout changes (its ``nvidia.com/mig.config``, as
  the snapshot says) the devices held that are not of its new layout are dropped (those that
  are, already reported by the new layout, stay), and a reading for a device
  whose shape (whole, or the instance profile) differs from the devices held for the same GPU
  drops those. Without this a converted node counted its eight whole GPUs' last readings next to
  its 56 new instances (a 16-GPU pool at 95 % read 21 % over 72 "devices"). The second rule
  covers what the snapshot cannot: an open-loop replay's readings come from the recorded
  cluster, whose conversions need not happen when the simulated cluster's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.inventory import matches
from policies.snapshot import Node, Snapshot
from streams.events import GpuUtilization

__all__ = ["PoolMeter"]

DeviceKey = tuple[str, int | str, int | None]
GpuKey = tuple[str, int | str]

#: The shape of a device: ``None`` for a whole GPU, its profile for a MIG instance (``""``
#: when the reading did not name one).
Shape = str | None


def _layout(node: Node) -> str | None:
    """What decides a node's devices: its MIG configuration, ``None`` for whole cards."""
    return node.mig_config if node.is_mig else None


def _shape(ev: GpuUtilization) -> Shape:
    return None if ev.mig_instance is None else (ev.mig_profile or "")


class _Device:
    """A device's pool (its index, -1: none) and last reading."""

    __slots__ = ("pool", "util")

    def __init__(self, pool: int, util: float) -> None:
        self.pool = pool
        self.util = util


class PoolMeter:
    """Pool utilization from readings (see the module docstring)."""

    def __init__(self, pools: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        self.names = [name for name, _ in pools]
        self.selectors = [sel for _, sel in pools]
        self.node_pool: dict[str, int] = {}
        #: Per device: its pool and last reading.
        self.cells: dict[DeviceKey, _Device] = {}
        #: Per physical GPU: the shape of the devices held for it, and their keys.
        self.gpus: dict[GpuKey, tuple[Shape, list[DeviceKey]]] = {}
        self.sums = [0.0] * len(pools)
        self.counts = [0] * len(pools)
        self._layouts: dict[str, str | None] = {}
        self._for: Snapshot | None = None

    def refresh(self, snapshot: Snapshot) -> None:
        """A new snapshot: drop the devices of nodes whose layout changed, and recount the sums
        (nodes may have changed pools)."""
        if snapshot is self._for:
            return
        self._for = snapshot
        layouts = {n.name: _layout(n) for n in snapshot.nodes}
        changed = {
            n.name: n
            for n in snapshot.nodes
            if n.name in self._layouts and self._layouts[n.name] != layouts[n.name]
        }
        self._layouts = layouts
        for gpu in [g for g in self.gpus if g[0] in changed and not self._fits(changed[g[0]], g)]:
            self._drop(gpu)
        self.node_pool = {
            n.name: next((i for i, s in enumerate(self.selectors) if matches(s, n.labels)), -1)
            for n in snapshot.nodes
        }
        sums, counts = [0.0] * len(self.names), [0] * len(self.names)
        for (node, _, _), cell in self.cells.items():
            i = self.node_pool.get(node, -1)
            cell.pool = i
            if i >= 0:
                sums[i] += cell.util
                counts[i] += 1
        self.sums[:], self.counts[:] = sums, counts  # in place: callers may hold the lists

    def report(self, ev: GpuUtilization) -> None:
        """Hold ``ev`` as its device's reading."""
        key = (ev.node, ev.gpu, ev.mig_instance)
        cell = self.cells.get(key)
        if cell is not None:
            i = cell.pool
            if i >= 0:
                self.sums[i] += ev.util_pct - cell.util
            cell.util = ev.util_pct
            return
        gpu = (ev.node, ev.gpu)
        shape = _shape(ev)
        held = self.gpus.get(gpu)
        if held is not None and held[0] != shape:
            self._drop(gpu)  # the GPU was re-partitioned: its old devices are gone
            held = None
        if held is None:
            held = self.gpus[gpu] = (shape, [])
        held[1].append(key)
        i = self.node_pool.get(ev.node, -1)
        self.cells[key] = _Device(i, ev.util_pct)
        if i >= 0:
            self.sums[i] += ev.util_pct
            self.counts[i] += 1

    def _fits(self, node: Node, gpu: GpuKey) -> bool:
        """Whether the devices held for ``gpu`` are those of ``node``'s layout: a whole card
        where it has one, instances of the GPU's profile where it is partitioned."""
        card = next((g for g in node.gpus if g.index == gpu[1]), None)
        if card is None:
            return False
        shape = self.gpus[gpu][0]
        if card.mig_profile is None or shape is None:
            return card.mig_profile is shape
        return shape in (card.mig_profile, "")

    def _drop(self, gpu: GpuKey) -> None:
        for key in self.gpus.pop(gpu)[1]:
            cell = self.cells.pop(key)
            if cell.pool >= 0:
                self.sums[cell.pool] -= cell.util
                self.counts[cell.pool] -= 1

    def pool_util(self, i: int) -> float | None:
        """Pool ``i``'s utilization (percent), ``None`` before any of its devices reported."""
        return self.sums[i] / self.counts[i] if self.counts[i] else None

    def devices(self, i: int) -> int:
        """The devices of pool ``i`` that have reported."""
        return self.counts[i]
