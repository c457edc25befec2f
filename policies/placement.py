"""Where a replica can land: the node-fit rules both runtimes follow, and per-node room.

Design:

* A pool's free GPU count says nothing about whether a replica fits: four nodes with one free
  GPU each cannot take a two-GPU replica. Every placement question is asked per node, with the
  same rules kube-scheduler applies to GPU pods: the node carries the pod's ``nodeSelector``
  labels (the GPU model is one, ``nvidia.com/gpu.product``) and meets its required node
  affinity (:mod:`policies.nodeaffinity`: ``gpu.product In [H100, H200]`` is one), the pod
  tolerates each of the node's ``NoSchedule``/``NoExecute`` taints, the node is neither
  cordoned nor reconfiguring, and it has the whole GPUs (or MIG instances of each profile) free.
* :func:`admits` is the label, affinity and taint half, shared by the engine
  (:mod:`policies.preemption`, :mod:`policies.rules`, :mod:`policies.inventory`) and the
  simulated cluster's scheduler (:mod:`controller.simcluster.nodeindex`), so a plan the engine
  believes
  in is one the simulated scheduler carries out. A placement Ebbtide cannot read
  (:attr:`~policies.snapshot.Placement.unknown`) is admitted nowhere: no room is counted for it
  and no training is freed for it.
* :func:`room` lists free whole GPUs per node that admits a replica; :func:`slots` counts the
  replicas that fit; :func:`place` takes replicas out of that room best-fit (fullest node
  first, as the simulated scheduler places them), so rules later in a round see what earlier
  ones took; :func:`node_order` ranks nodes to free for one more replica: victim order first
  (the most important pod it takes), then the fewest GPUs evicted, then a node left entirely
  empty before one left with holes, then one whose NVLink domain (``nvidia.com/gpu.clique``)
  has the most GPUs free already, then by name.
* :func:`give_back` is the other direction: which replicas a scale-down removes so the GPUs it
  frees empty whole nodes (and gather in one NVLink domain) rather than leave a hole on each;
  only an empty node can be converted to MIG or taken whole by a large replica.
* :func:`could_land` asks whether any node could ever take a pending pod once a MIG flow moved
  it into a pool (the pool's labels and taints): a pod no node could take is no demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from policies.snapshot import Node, Placement, Taint, Toleration

__all__ = [
    "NVLINK_DOMAIN_LABEL",
    "admits",
    "could_land",
    "give_back",
    "node_order",
    "place",
    "room",
    "slots",
    "tolerated",
]

#: Node label naming its NVLink domain (GPU Feature Discovery's clique id on NVL systems).
NVLINK_DOMAIN_LABEL = "nvidia.com/gpu.clique"

_REPELS = ("NoSchedule", "NoExecute")


def tolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> bool:
    """Every taint that keeps pods off the node is tolerated."""
    return all(
        t.effect not in _REPELS or any(tol.tolerates(t) for tol in tolerations) for t in taints
    )


def admits(node: Node, where: Placement) -> bool:
    """``node`` may run a pod placed by ``where``, GPUs aside (kube-scheduler's NodeAffinity
    and TaintToleration filters)."""
    return _labels_admit(node.labels, node.name, where) and tolerated(
        node.taints, where.tolerations
    )


def _labels_admit(labels: Mapping[str, str], name: str, where: Placement) -> bool:
    """A node named ``name`` with ``labels`` carries ``where``'s ``nodeSelector`` and meets its
    required node affinity; an unknown placement is admitted nowhere."""
    if where.unknown is not None:
        return False
    return all(labels.get(k) == v for k, v in where.node_selector.items()) and (
        where.affinity is None or where.affinity.matches(labels, name)
    )


def could_land(
    nodes: Iterable[Node],
    pools: Sequence[tuple[Mapping[str, str], Sequence[Taint]]],
    where: Placement,
    gpus: int,
) -> bool:
    """Some node with at least ``gpus`` GPUs would admit ``where`` once in one of the ``pools``
    (each: node selector, taints): carrying that pool's labels and taints and none of the other
    pools' taints, as a MIG conversion or revert moves it. What freeing or reverting capacity
    could ever serve: a pod asking for a GPU model, a toleration or a node size no node offers
    is nobody's demand."""
    moved = {(t.key, t.effect) for _, taints in pools for t in taints}
    for node in nodes:
        if len(node.gpus) < gpus:
            continue
        kept = [t for t in node.taints if (t.key, t.effect) not in moved]
        for labels, taints in pools:
            have = node.labels
            if any(have.get(k) != v for k, v in labels.items()):
                have = {**have, **labels}
            if _labels_admit(have, node.name, where) and tolerated(
                [*kept, *taints], where.tolerations
            ):
                return True
    return False


def room(
    nodes: Iterable[Node], free: Mapping[str, int], where: Placement, *, gpus: int
) -> dict[str, int]:
    """Free whole GPUs on each schedulable whole-card node that admits ``where`` and could hold
    a ``gpus``-GPU replica at all (``free``: free whole GPUs by node)."""
    return {
        n.name: free.get(n.name, 0)
        for n in nodes
        if not n.cordoned and not n.mig_flow and n.whole_gpus >= gpus and admits(n, where)
    }


def slots(free: Mapping[str, int], gpus: int) -> int:
    """Replicas of ``gpus`` GPUs that fit, each on one node."""
    if gpus <= 0:
        return 0
    return sum(f // gpus for f in free.values() if f > 0)


def node_order(
    free: Mapping[str, int],
    victims: Mapping[str, Sequence[tuple[tuple[float | str, ...], int]]],
    total: Mapping[str, int],
    *,
    gpus: int,
    domains: Mapping[str, str] | None = None,
) -> list[str]:
    """Nodes to free for one more ``gpus``-GPU replica, best first, as kube-scheduler picks a
    node to preempt on; only nodes where it is possible. ``victims``: per node, the evictable
    pods' victim-order keys (ties by name dropped) and GPUs, in victim order; ``free``: free
    GPUs, ``total``: whole GPUs per node; ``domains``: NVLink domain per node. Ranked by the
    most important victim needed, then GPUs evicted, then whether the node is left empty, then
    the free GPUs already in its NVLink domain (whole nodes and domains beat scattered holes)."""
    domains = domains or {}
    domain_free: dict[str, int] = {}
    for name, have in free.items():
        if name in domains:
            domain_free[domains[name]] = domain_free.get(domains[name], 0) + have
    ranked: list[tuple[tuple[float | str, ...], int, bool, int, str]] = []
    for name, have in free.items():
        short = gpus - have % gpus
        got = 0
        worst: tuple[float | str, ...] = ()
        for key, n in victims.get(name, ()):
            if got >= short:
                break
            got, worst = got + n, max(worst, key)
        if got < short:
            continue
        emptied = have + got >= total.get(name, 0)
        beside = domain_free.get(domains[name], 0) - have if name in domains else 0
        ranked.append((worst, got, not emptied, -beside, name))
    ranked.sort()
    return [r[-1] for r in ranked]


def place(free: Mapping[str, int], gpus: int, replicas: int) -> dict[str, int]:
    """GPUs taken per node when ``replicas`` of ``gpus`` GPUs land best fit in ``free``."""
    left = dict(free)
    taken: dict[str, int] = {}
    for _ in range(replicas if gpus > 0 else 0):
        fits = [(f, name) for name, f in left.items() if f >= gpus]
        if not fits:
            break
        _, name = min(fits)
        left[name] -= gpus
        taken[name] = taken.get(name, 0) + gpus
    return taken


def give_back(
    ours: Mapping[str, Sequence[str]],
    others: Mapping[str, int],
    free: Mapping[str, int],
    count: int,
    *,
    gpus: int = 1,
    domains: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``count`` replicas (of ``ours``: per node, the workload's pods there) to remove so
    nodes empty, in removal order. Node by node: fewest other GPU pods first (``others``), then
    one whose pods all fit in what is left to remove before one that would keep a hole, then
    the fewest of ours (so more nodes empty), then the most GPUs already free in its NVLink
    domain (``domains``, ``free``: free GPUs per node), then by name; GPUs freed count as free
    for the nodes that follow (``gpus`` per pod), so holes gather in one domain."""
    domains = domains or {}
    domain_free: dict[str, int] = {}
    for name, have in free.items():
        if name in domains:
            domain_free[domains[name]] = domain_free.get(domains[name], 0) + have
    left = {name: sorted(pods) for name, pods in ours.items() if pods}
    chosen: list[str] = []

    def rank(name: str, need: int) -> tuple[int, bool, int, int, str]:
        n = len(left[name])
        beside = domain_free.get(domains[name], 0) if name in domains else 0
        return (others.get(name, 0), n > need, n, -beside, name)

    while len(chosen) < count and left:
        need = count - len(chosen)
        best = min(left, key=lambda name: rank(name, need))
        taken = left.pop(best)[:need]
        chosen.extend(taken)
        if best in domains:
            domain_free[domains[best]] = domain_free.get(domains[best], 0) + len(taken) * gpus
    return chosen
