"""MIG rules: turn idle whole-card nodes into MIG nodes, and back when whole cards are wanted.

Design:

* **Convert** a node of the whole-card pool when (a) the pool's mean utilization has stayed below
  ``convertBelow`` over the last ``convertAfter`` (the pool window must cover the whole period),
  (b) every GPU of the node has stayed at or below ``nodeIdleBelow`` for the whole
  ``convertAfter`` (it must have reported throughout: a silent node is not an idle one), (c) no
  pod holds a GPU on it, no pod waits for whole cards, its GPU model has a target profile, and
  the pool keeps ``minWholeNodes`` schedulable whole nodes (cordoned nodes and nodes being
  converted are not spare); at most ``maxConcurrent`` conversions (and reverts) are in flight,
  and the MIG budget pays for each.
* **Layout.** When the policy lists several configs for the node's GPU model, the conversion
  takes the one that covers most of the pending MIG demand (:func:`policies.miglayout.
  choose_layout`); what the first candidates of a tick cover is taken off the demand the next
  ones see, so two conversions do not both chase the same pending pods. On a node labelled
  ``nvidia.com/mig.strategy=single`` only one-profile layouts are candidates: the device
  plugin there cannot advertise a mixed one (:func:`policies.miglayout.unservable`), and the
  Kubernetes flow would fail it every time.
* **Revert** MIG nodes of the MIG pool when pending pods, and elastic training below its
  maximum (it shrank for a service in the morning and would grow back), have demanded more
  whole GPUs than the whole-card pool has free for ``revertAfter``: as many nodes as cover the
  unmet demand, emptiest first, within the same concurrency limit and budget. Only nodes a
  drain can empty are picked (:mod:`policies.drain`: no inference, protected or
  ``do-not-disrupt`` GPU pod on them): a real cluster rolls any other revert back, and it
  would be decided again every tick.
* Node idleness is tracked per GPU in O(1) per reading by :class:`IdleTracker` (first reading,
  last reading, last busy reading), so checking 10,000 GPUs is a dictionary walk, not a window
  merge. :class:`MigFlights` remembers conversions the engine decided until the snapshot shows
  them done (``nvidia.com/mig.config.state`` ``success``/``failed``) or ``stuckAfter`` passes,
  and counts the flows the snapshot shows under way (``Node.mig_flow``: the flow's own record;
  a MIG manager still applying a layout), so an engine that restarted mid-flow, or took over
  from another leader, still keeps ``maxConcurrent``.
* Planning functions are pure: they take the inventory, tracker and counters and return
  candidates with their inputs and the alternatives rejected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.decisions import Alternative, Scalar
from policies.drain import DrainPlan, disrupt_forbidden, plan_drain
from policies.inventory import Inventory
from policies.miglayout import choose_layout, layout_of, strategy_of, unservable
from policies.model import MigSpec
from policies.snapshot import MIG_DISABLED, Node

__all__ = ["IdleTracker", "MigCandidate", "MigFlights", "plan_conversions", "plan_reverts"]

_IN_PROGRESS = frozenset({"pending", "rebooting"})


def _under_way(node: Node) -> bool:
    """The snapshot shows a MIG flow on ``node``: its record (started by any replica, before any
    restart), or the MIG manager still applying a layout."""
    return node.mig_flow or node.mig_state in _IN_PROGRESS


class IdleTracker:
    """Per GPU: first reading, last reading, last reading above the idle threshold."""

    __slots__ = ("_gpus", "threshold_pct")

    def __init__(self, threshold_pct: float) -> None:
        self.threshold_pct = threshold_pct
        self._gpus: dict[str, dict[str, list[float]]] = {}

    def add(self, node: str, gpu: str, ts: float, util_pct: float) -> None:
        per_node = self._gpus.get(node)
        if per_node is None:
            per_node = self._gpus[node] = {}
        rec = per_node.get(gpu)
        if rec is None:
            rec = per_node[gpu] = [ts, ts, -math.inf]
        if ts < rec[0]:
            rec[0] = ts
        if ts > rec[1]:
            rec[1] = ts
        if util_pct > self.threshold_pct and ts > rec[2]:
            rec[2] = ts

    def idle_since(self, node: str, gpus: int, now: float, stale_s: float) -> float | None:
        """Since when every one of the node's ``gpus`` GPUs has been idle, judging by readings;
        ``None`` when a GPU never reported or went silent for ``stale_s``."""
        per_node = self._gpus.get(node)
        if per_node is None or len(per_node) < gpus:
            return None
        since = -math.inf
        for first, last, busy in per_node.values():
            if now - last > stale_s:
                return None
            since = max(since, first, busy)
        return since

    def idle_gpus(self, now: float, idle_s: float, stale_s: float) -> dict[str, int]:
        """Per node: GPUs with no reading above the threshold for ``idle_s`` (observed that
        long, not silent for ``stale_s``). One pass over what :meth:`add` keeps: no window is
        read, so a report can ask every sample tick."""
        out: dict[str, int] = {}
        since = now - idle_s
        for node, per_node in self._gpus.items():
            n = 0
            for gpu, (first, last, busy) in per_node.items():  # a plain loop: per sample tick
                if busy <= since and first <= since and now - last <= stale_s and "/" not in gpu:
                    n += 1
            if n:
                out[node] = n
        return out

    def forget(self, keep: Mapping[str, object]) -> None:
        """Drop nodes no longer in the cluster (bounded memory)."""
        for node in [n for n in self._gpus if n not in keep]:
            del self._gpus[node]


class MigFlights:
    """Conversions and reverts the engine decided and the cluster has not finished yet."""

    __slots__ = ("_flights", "_held")

    def __init__(self) -> None:
        self._flights: dict[str, tuple[float, str]] = {}
        self._held: dict[str, float] = {}
        """Nodes whose last flow failed, and until when nothing is planned for them."""

    def start(self, node: str, now: float, target_config: str) -> None:
        self._flights[node] = (now, target_config)

    def settle(self, nodes: Mapping[str, Node], now: float, stuck_after: float) -> None:
        """Forget flights the snapshot shows finished, ones stuck longer than allowed, and
        holds that have run out."""
        for name in [n for n, until in self._held.items() if until <= now]:
            del self._held[name]
        for name, (since, target) in sorted(self._flights.items()):
            node = nodes.get(name)
            done = (
                node is not None
                and (node.mig_config or MIG_DISABLED) == target
                and (node.mig_state not in _IN_PROGRESS)
            )
            if node is None or done or now - since >= stuck_after:
                del self._flights[name]

    def count(self, nodes: Mapping[str, Node]) -> int:
        """Flights in progress: decided here, or shown under way by the snapshot."""
        busy = set(self._flights)
        busy.update(n.name for n in nodes.values() if _under_way(n))
        return len(busy)

    def busy(self, node: Node) -> bool:
        """A flight is decided here or shown under way by the snapshot, or the node's last
        flow failed lately: plan nothing for it."""
        return node.name in self._flights or node.name in self._held or _under_way(node)

    def drop(self, node: str, *, hold_until: float | None = None) -> None:
        """The cluster did not start it (refused) or it failed: free its ``maxConcurrent``
        slot; with ``hold_until``, plan nothing for the node before then (a reconfiguration
        that failed would fail again, draining the node's training each time)."""
        self._flights.pop(node, None)
        if hold_until is not None:
            self._held[node] = max(hold_until, self._held.get(node, hold_until))


def _drain(inv: Inventory, node: Node) -> DrainPlan:
    return plan_drain(inv.drain_rule, inv.pods_by_node.get(node.name, ()))


@dataclass(frozen=True, slots=True)
class MigCandidate:
    node: Node
    profile: str
    inputs: Mapping[str, Scalar]


def plan_conversions(
    *,
    now: float,
    spec: MigSpec,
    inv: Inventory,
    pool_util_pct: float | None,
    pool_covered: bool,
    idle: IdleTracker,
    stale_s: float,
    slots: int,
    flights: MigFlights,
) -> tuple[list[MigCandidate], list[Alternative]]:
    """Nodes to convert now (at most ``slots``), and why others were not."""
    rejected: list[Alternative] = []
    if slots <= 0:
        return [], rejected
    threshold = spec.convert_below * 100.0
    if pool_util_pct is None or not pool_covered:
        return [], [Alternative("convert", f"pool {spec.from_pool} not observed for convertAfter")]
    if pool_util_pct >= threshold:
        return [], rejected
    if inv.pending_whole_gpus > 0:
        return [], [Alternative("convert", "pods are waiting for whole GPUs")]
    # Whole nodes that serve whole cards: neither cordoned nor on their way to MIG.
    whole_nodes = [
        n
        for n in inv.pool_nodes.get(spec.from_pool, [])
        if not n.is_mig and not n.cordoned and not flights.busy(n)
    ]
    spare = len(whole_nodes) - spec.min_whole_nodes
    out: list[MigCandidate] = []
    demand = dict(inv.pending_mig)
    for node in whole_nodes:
        if len(out) >= min(slots, spare):
            break
        name = node.name
        names = spec.layouts_for(node.gpu_model)
        if not names or not node.gpus:
            continue
        if disrupt_forbidden(node.annotations) or not _drain(inv, node).empty:
            continue
        since = idle.idle_since(name, len(node.gpus), now, stale_s)
        if since is None or now - since < spec.convert_after:
            if len(rejected) < 4 and since is not None:
                rejected.append(Alternative(f"convert {name}", f"idle for {now - since:.0f}s only"))
            continue
        strategy = strategy_of(node.labels)
        layouts = [
            layout
            for layout in (layout_of(n, spec.configs) for n in names)
            if unservable(layout, strategy) is None
        ]
        if not layouts:
            if len(rejected) < 4:
                why = f"no layout of {', '.join(names)} serves mig.strategy={strategy}"
                rejected.append(Alternative(f"convert {name}", why))
            continue
        layout = choose_layout(layouts, demand, len(node.gpus))
        for profile, n in layout.per_gpu.items():  # the next node serves what this one does not
            demand[profile] = max(0, demand.get(profile, 0) - n * len(node.gpus))
        out.append(
            MigCandidate(
                node,
                layout.name,
                {
                    "pool_util_pct": round(pool_util_pct, 2),
                    "node_idle_s": round(now - since, 1),
                    "gpus": len(node.gpus),
                    "gpu_model": node.gpu_model,
                    "whole_nodes": len(whole_nodes),
                    "pending_mig_instances": sum(inv.pending_mig.values()),
                },
            )
        )
    return out, rejected


def plan_reverts(
    *,
    now: float,
    spec: MigSpec,
    inv: Inventory,
    demand_since: float | None,
    slots: int,
    flights: MigFlights,
    training_wants: int = 0,
) -> tuple[list[MigCandidate], int]:
    """MIG nodes to revert now (at most ``slots``), and the unmet whole-GPU demand: pending
    pods' whole GPUs plus ``training_wants`` (what elastic training would grow back into)."""
    unmet = inv.pending_whole_gpus + training_wants - inv.free.get(spec.from_pool, 0)
    if unmet <= 0 or demand_since is None or now - demand_since < spec.revert_after:
        return [], max(0, unmet)
    drains: dict[str, DrainPlan] = {}
    for n in inv.pool_nodes.get(spec.to_pool, []):
        if n.is_mig and not flights.busy(n) and not disrupt_forbidden(n.annotations):
            drain = _drain(inv, n)
            if drain.refusal is None:
                drains[n.name] = drain
    nodes = sorted(
        (inv.nodes[name] for name in drains), key=lambda n: (len(drains[n.name].evict), n.name)
    )
    out: list[MigCandidate] = []
    covered = 0
    for node in nodes:
        if covered >= unmet or len(out) >= slots:
            break
        out.append(
            MigCandidate(
                node,
                node.mig_config or "",
                {
                    "pending_whole_gpus": inv.pending_whole_gpus,
                    "free_whole_gpus": inv.free.get(spec.from_pool, 0),
                    "demand_s": round(now - demand_since, 1),
                    "mig_pods_on_node": len(drains[node.name].evict),
                },
            )
        )
        covered += len({g.index for g in node.gpus})  # cards: a mixed layout lists each per profile
    return out, unmet
