"""Pure victim selection: which training to shrink, then which pods to evict, to free GPUs.

Design (Kueue's ``GetTargets`` in spirit: decide on an in-memory view, actuate elsewhere):

1. **Shrink first.** Elastic training workloads with pods in the pool are taken in victim order
   and scaled down, each to no less than ``max(minReplicas, gang minimum)``, until enough GPUs
   are freed. One scale step per workload. A workload whose shrink failed lately (the owner's
   webhook refused it, the API kept failing) is not shrunk again while it is held off: another
   try would fail the same way and block the breach, so the plan moves on to the next
   workload and to evictions (which may take its pods), and says why in the explanation.
2. **Evict only when shrinking is not enough.** Training pods in the pool are taken in victim
   order (lowest priority first, then newest / oldest / least progress, as the policy says;
   ties by name). A pod of a gang whose eviction would leave the gang below its minimum takes
   the whole gang with it, or is skipped when the eviction budget cannot pay for all of it.
   Workloads being shrunk in the same plan are not evicted from: which pods their controller
   removes is not known yet, so counting them twice could free fewer GPUs than planned.
3. **Per node** (with a :class:`Fit`): a replica of N GPUs needs N free on one node, so four
   scattered free GPUs are no room for a two-GPU replica. Shrink steps are credited to the
   nodes of the workload's highest-named pods (StatefulSet ordinals and job indexes go first);
   evictions then go node by node, best first by :func:`policies.placement.node_order` (the
   least important victims, the fewest GPUs evicted, a node left empty, the most GPUs free in
   its NVLink domain), each node's pods in victim order, until the replicas fit.
4. **Checkpoint notices** (:mod:`policies.checkpoint`): evicting a pod opted in to the
   handshake first gives it a notice and waits for its checkpoint. A need gives one such
   notice at a time: while its notice stands on a pod, or once this plan took a pod that needs
   one, no other pod that would need a notice is taken (pods that need none still are), so a
   breach does not notice a new pod at every try while the first one checkpoints.
5. **A pod its owner recreates is not evicted for pods that do not outrank it.** The
   ReplicaSet (or any workload controller) replaces an evicted pod at once, and the replacement
   races the replicas the GPUs were freed for: the kube-scheduler pops pending pods by priority,
   then by the time they were queued (``PrioritySort.Less``,
   kubernetes ``pkg/scheduler/framework/plugins/queuesort/priority_sort.go``), a time it
   refreshes after every failed attempt (``AddUnschedulableIfNotPresent``,
   ``pkg/scheduler/backend/queue/scheduling_queue.go``), and the replacement may even be bound
   before the new replicas exist (the victim exits before the scale-up is written). So:

   * a **Deployment** that Ebbtide sizes and grows back (:attr:`TrainingView.grows_back`) is
     *shrunk instead*: its pods the plan would evict are taken by one shrink of the owner,
     naming them (``Scale.remove``: the ReplicaSet removes them first), below its elastic floor
     as far as the evictions would have gone (they would have left as few pods running), never
     below its owner's own bounds. Nothing is recreated, so nothing races the new replicas;
     the workload grows back to its maximum when GPUs are idle.
   * otherwise its pods are evicted only for pods of strictly higher priority
     (``claimant_priority``): they are popped first, and should the replacement get there
     first, the kube-scheduler's DefaultPreemption takes the GPU back for them and nominates
     them to the node (``status.nominatedNodeName``), which pods of lower priority may not
     take. At equal or lower priority the eviction only moves the pod: it is refused, with
     the reason. It is refused too when the claimant's pods will not be queued until the
     GPUs are free (``scale.shrinkFirst``, ``claimant_waits``): nothing outranks the
     replacement then, which takes the GPU back at once, and the next try evicts again.
6. **Restartable tasks before a DDP job** (``training.restarts.tasksFirst``): a DDP/elastic
   job (any kind but ``Job``) restarts every worker from its last checkpoint on any membership
   change (TorchElastic, ``torch/distributed/elastic/agent/server/api.py``,
   ``SimpleElasticAgent._invoke_run`` → ``_restart_workers``), while a ``Job``'s pod is a task
   that restarts alone. When the plan above would resize or evict from a DDP job, a second plan
   without any DDP job is priced against it (:func:`membership_price`, :func:`task_price`:
   GPU-seconds lost) and taken when it frees what is needed for less.
7. **Never**: inference pods (not in the training view at all), protected namespaces,
   ``ebbtide.io/do-not-disrupt``. Each skipped candidate is reported as an
   :class:`~policies.decisions.Alternative` with the reason.

The function takes budgets as plain numbers and returns a :class:`Plan`; it does not mutate its
inputs and reads no clock, so the engine, ``policy test`` and a what-if tool share it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from policies.checkpoint import Notices, opted_in, since_checkpoint
from policies.decisions import Alternative
from policies.drain import protection
from policies.inventory import TrainingView
from policies.model import RestartsSpec, VictimKey
from policies.placement import node_order, slots
from policies.snapshot import FrozenMap, Pod

__all__ = [
    "TASK_KINDS",
    "Fit",
    "Plan",
    "ShrinkStep",
    "Victim",
    "membership_price",
    "plan_capacity",
    "restarts_on_change",
    "task_price",
    "victim_sort_key",
    "work_at_stake",
]

#: At most this many rejected alternatives are kept in a plan (explanations stay short).
MAX_ALTERNATIVES = 8


#: Kinds whose controller can be told which pods a shrink removes (a ReplicaSet's
#: ``controller.kubernetes.io/pod-deletion-cost``): a shrink of one can stand in for evictions.
NAMED_REMOVAL_KINDS = frozenset({"Deployment"})

#: Kinds whose pods are independent tasks (a sweep's): one leaving or joining restarts no other.
TASK_KINDS = frozenset({"Job"})


@dataclass(frozen=True, slots=True)
class ShrinkStep:
    workload: str
    kind: str
    from_replicas: int
    to_replicas: int
    gpus_freed: int
    remove: tuple[str, ...] = ()
    """Pods (``namespace/name``) it removes; set when it stands in for evicting them."""


@dataclass(frozen=True, slots=True)
class Victim:
    pod: Pod
    workload: str | None
    gpus_freed: int
    whole_gang: bool
    """Evicted because its gang would drop below its minimum otherwise."""


@dataclass(frozen=True, slots=True)
class Plan:
    shrinks: tuple[ShrinkStep, ...]
    evictions: tuple[Victim, ...]
    freed: int
    rejected: tuple[Alternative, ...]
    by_node: Mapping[str, int]
    """GPUs freed per node (a shrink's at the nodes of its highest-named pods)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """Replicas that must each land on one node: plan per node, not per pool."""

    gpus: int
    """GPUs per replica."""
    replicas: int
    """Replicas wanted."""
    free: Mapping[str, int]
    """Free whole GPUs on each node that admits a replica (:func:`policies.placement.room`)."""
    total: Mapping[str, int]
    """Whole GPUs of those nodes."""
    domains: Mapping[str, str] = field(default_factory=dict)
    """NVLink domain of those nodes that have one."""


def victim_sort_key(
    order: Sequence[VictimKey], *, priority: int, created: float, progress: float, name: str
) -> tuple[float | str, ...]:
    """Sort key putting the first victim first."""
    parts: list[float | str] = []
    for key in order:
        if key == "priority":
            parts.append(priority)
        elif key == "newest":
            parts.append(-created)
        elif key == "oldest":
            parts.append(created)
        else:
            parts.append(progress)
    parts.append(name)
    return tuple(parts)


def _view_key(view: TrainingView, order: Sequence[VictimKey]) -> tuple[float | str, ...]:
    w = view.workload
    return victim_sort_key(
        order, priority=w.priority, created=w.created, progress=view.progress, name=view.key
    )


def restarts_on_change(view: TrainingView) -> bool:
    """A membership change of ``view`` restarts all its workers (a DDP/elastic job)."""
    return view.workload.kind not in TASK_KINDS


def work_at_stake(
    view: TrainingView, *, now: float, spec: RestartsSpec, changed: float | None = None
) -> float:
    """Seconds of work since the last checkpoint of DDP job ``view`` at ``now``: since the
    checkpoint its pods report, else estimated from its last (re)start: its newest pod or
    ``changed`` (when Ebbtide last shrank it), plus ``restartCost`` (it trains, and counts
    checkpoints, from the end of its restart)."""
    started = max((p.created for p in view.pods), default=view.workload.created)
    if changed is not None:
        started = max(started, changed)
    return since_checkpoint(
        (p.annotations for p in view.pods),
        started=started + spec.restart_cost,
        now=now,
        every=spec.checkpoint_every,
    )


def membership_price(
    view: TrainingView, *, now: float, spec: RestartsSpec, changed: float | None = None
) -> float:
    """GPU-seconds a membership change of ``view`` at ``now`` loses: every GPU it holds idle
    for the restart, plus the work since its last checkpoint redone (:func:`work_at_stake`)."""
    since = work_at_stake(view, now=now, spec=spec, changed=changed)
    return sum(view.pool_gpus.values()) * (spec.restart_cost + since)


def task_price(pods: Iterable[Pod], *, now: float, spec: RestartsSpec) -> float:
    """GPU-seconds preempting these tasks at ``now`` loses: each its own work since its last
    checkpoint."""
    return sum(
        p.gpus
        * since_checkpoint(
            (p.annotations,), started=p.created, now=now, every=spec.checkpoint_every
        )
        for p in pods
    )


def plan_capacity(
    *,
    needed: int,
    pool: str,
    training: Iterable[TrainingView],
    loose_pods: Iterable[Pod] = (),
    pod_pool: dict[str, str | None],
    victim_order: Sequence[VictimKey],
    protected_namespaces: frozenset[str],
    scale_budget: int,
    eviction_budget: int,
    taken: frozenset[str] = frozenset(),
    held: Mapping[str, str] | None = None,
    resize_held: Mapping[str, str] | None = None,
    notices: Notices | None = None,
    fit: Fit | None = None,
    claimant_priority: int | None = None,
    claimant_waits: bool = False,
) -> Plan:
    """Free at least ``needed`` whole GPUs in ``pool`` (as many as possible when it cannot);
    with ``fit``, free until ``fit.replicas`` replicas each fit on one node instead.

    The arguments are :func:`_plan`'s. With ``training.restarts.tasksFirst`` (carried on the
    views) and a plan that would resize a DDP job, a plan of tasks only is priced against it
    (module docstring, 6); the plan's clock is ``notices.now`` (a plan reads no clock)."""
    training = tuple(training)
    loose_pods = tuple(loose_pods)

    def run(views: tuple[TrainingView, ...]) -> Plan:
        return _plan(
            needed=needed,
            pool=pool,
            training=views,
            loose_pods=loose_pods,
            pod_pool=pod_pool,
            victim_order=victim_order,
            protected_namespaces=protected_namespaces,
            scale_budget=scale_budget,
            eviction_budget=eviction_budget,
            taken=taken,
            held=held,
            resize_held=resize_held,
            notices=notices,
            fit=fit,
            claimant_priority=claimant_priority,
            claimant_waits=claimant_waits,
        )

    plan = run(training)
    spec = next((v.restarts for v in training if v.restarts is not None), None)
    if spec is None or not spec.tasks_first or notices is None:
        return plan
    ddp = {v.key for v in training if restarts_on_change(v) and v.pool_gpus.get(pool, 0) > 0}
    touched = ddp & {*(st.workload for st in plan.shrinks), *(e.workload for e in plan.evictions)}
    if not touched:
        return plan
    tasks = run(tuple(v for v in training if v.key not in ddp))
    names = ", ".join(sorted(touched))
    if not _frees(tasks, needed, fit):
        return _noted(
            plan, f"preempt tasks instead of resizing {names}", "tasks alone free too little"
        )
    now = notices.now
    views = {v.key: v for v in training}
    cost_ddp, cost_tasks = (_price(p, views, now=now, spec=spec) for p in (plan, tasks))
    if cost_tasks >= cost_ddp:
        return _noted(
            plan,
            f"preempt tasks instead of resizing {names}",
            f"loses {cost_tasks / 3600:.1f} GPU-h, the restart {cost_ddp / 3600:.1f}",
        )
    return _noted(
        tasks,
        f"resize {names}",
        f"restarts every worker: {cost_ddp / 3600:.1f} GPU-h lost, preempting tasks "
        f"{cost_tasks / 3600:.1f}",
    )


def _frees(plan: Plan, needed: int, fit: Fit | None) -> bool:
    """``plan`` frees what was asked (``needed`` GPUs, or room for ``fit``'s replicas)."""
    if fit is None:
        return plan.freed >= needed
    merged = {n: f + plan.by_node.get(n, 0) for n, f in fit.free.items()}
    return slots(merged, fit.gpus) >= fit.replicas


def _noted(plan: Plan, option: str, why: str) -> Plan:
    """``plan`` with the alternative it was chosen over (first: it is the choice made)."""
    rejected = (Alternative(option, why), *plan.rejected)[:MAX_ALTERNATIVES]
    return Plan(plan.shrinks, plan.evictions, plan.freed, rejected, plan.by_node)


def _price(
    plan: Plan, views: Mapping[str, TrainingView], *, now: float, spec: RestartsSpec
) -> float:
    """GPU-seconds ``plan`` loses: one restart of each DDP job it touches, plus each task's
    own work since its checkpoint (a task shrink's pods: the highest-named, as its
    controller removes them)."""
    restarted: set[str] = set()
    lost = 0.0
    for st in plan.shrinks:
        view = views[st.workload]
        if restarts_on_change(view):
            restarted.add(view.key)
        else:
            gone = st.from_replicas - st.to_replicas
            lost += task_price(tuple(reversed(view.pods))[:gone], now=now, spec=spec)
    for e in plan.evictions:
        owner = views.get(e.workload or "")
        if owner is not None and restarts_on_change(owner):
            restarted.add(owner.key)
        else:
            lost += task_price((e.pod,), now=now, spec=spec)
    return lost + sum(membership_price(views[k], now=now, spec=spec) for k in restarted)


def _plan(
    *,
    needed: int,
    pool: str,
    training: Sequence[TrainingView],
    loose_pods: Sequence[Pod],
    pod_pool: Mapping[str, str | None],
    victim_order: Sequence[VictimKey],
    protected_namespaces: frozenset[str],
    scale_budget: int,
    eviction_budget: int,
    taken: frozenset[str],
    held: Mapping[str, str] | None,
    resize_held: Mapping[str, str] | None,
    notices: Notices | None,
    fit: Fit | None,
    claimant_priority: int | None,
    claimant_waits: bool = False,
) -> Plan:
    """Free at least ``needed`` whole GPUs in ``pool`` (as many as possible when it cannot);
    with ``fit``, free until ``fit.replicas`` replicas each fit on one node instead.

    ``pod_pool`` maps node names to pools; ``taken`` holds workload and pod keys already claimed
    by an earlier plan in the same evaluation; ``held`` maps pods the cluster recently refused to
    evict (a PodDisruptionBudget) to the reason, so the next victim in order is taken instead;
    ``resize_held`` maps workloads whose shrink failed lately to the reason: not shrunk again;
    ``notices`` (the need's view of the checkpoint handshake) keeps it to one notice at a time;
    ``claimant_priority`` is the priority of the pods the GPUs are freed for (None: no rule
    about pods their owner recreates, see the module docstring); ``claimant_waits``: those pods
    are created only once the GPUs are free (``scale.shrinkFirst``).
    """
    held = held or {}
    resize_held = resize_held or {}
    training = tuple(training)
    loose_pods = tuple(loose_pods)
    #: the pod this need's checkpoint notice stands on (or that this plan will give it)
    noticing = (
        None
        if notices is None
        else next(
            (
                p.key
                for p in (*(q for v in training for q in v.pods), *loose_pods)
                if notices.ours(p.annotations)
            ),
            None,
        )
    )
    rejected: list[Alternative] = []
    instead: set[str] = set()
    """Workloads whose pods are taken by shrinking them instead of evicting (filled below)."""

    def refusal(pod: Pod, view: TrainingView | None) -> str | None:
        """Why ``pod`` may not be evicted: held after a refusal, protected, or recreated by its
        owner to race pods that do not outrank it. Asked of every pod an eviction takes, a
        gang's other members included."""
        why = held.get(pod.key) or _protection(pod, view, protected_namespaces)
        if why is None and view is not None and view.key not in instead:
            why = _replaced(pod, view, claimant_priority, waits=claimant_waits)
        return why

    def reject(option: str, why: str) -> None:
        if len(rejected) < MAX_ALTERNATIVES:
            rejected.append(Alternative(option, why))

    views = sorted(
        (v for v in training if v.pool_gpus.get(pool, 0) > 0 and v.key not in taken),
        key=lambda v: _view_key(v, victim_order),
    )
    freed = 0
    gained: dict[str, int] = {}

    def credit(node: str | None, gpus: int) -> None:
        nonlocal freed
        freed += gpus
        if node is not None and gpus:
            gained[node] = gained.get(node, 0) + gpus

    def enough() -> bool:
        if fit is None:
            return freed >= needed
        merged = {n: f + gained.get(n, 0) for n, f in fit.free.items()}
        return slots(merged, fit.gpus) >= fit.replicas

    shrinks: list[ShrinkStep] = []
    shrunk: set[str] = set()
    for view in views:
        if enough():
            break
        w = view.workload
        floor = max(view.min_replicas, view.gang_min)
        if view.protected is not None:
            reject(f"shrink {view.key}", view.protected)
            continue
        if view.scaled_by is not None:
            reject(f"shrink {view.key}", f"{view.scaled_by} scales it (training.owner: others)")
            continue
        if w.replicas <= floor or w.gpus_per_replica <= 0:
            continue
        if (failed := resize_held.get(view.key)) is not None:
            reject(f"shrink {view.key}", f"held off after its resize failed: {failed}")
            continue
        if scale_budget <= 0:
            reject(f"shrink {view.key}", "scale-step budget is spent")
            continue
        # the controller removes the highest ordinals / indexes first
        leaving = [p for p in reversed(view.pods) if pod_pool.get(p.node or "") == pool]
        k, gain = 0, 0
        most = min(w.replicas - floor, math.ceil((needed - freed) / w.gpus_per_replica))
        while k < most and not enough():
            k += 1
            step = min(k * w.gpus_per_replica, view.pool_gpus.get(pool, 0)) - gain
            gain += step
            credit(leaving[k - 1].node if k <= len(leaving) else None, step)
        shrinks.append(ShrinkStep(view.key, w.kind, w.replicas, w.replicas - k, gain))
        shrunk.add(view.key)
        scale_budget -= 1

    evictions: list[Victim] = []
    replaced: dict[str, list[Pod]] = {}
    """Per workload shrunk instead, the pods it gives up, in the order taken."""
    candidates: list[tuple[tuple[float | str, ...], Pod, TrainingView | None]] = []
    if claimant_priority is not None:
        # one scale step each, in victim order, while the budget lasts
        for view in views:
            if len(instead) >= scale_budget:
                break
            if view.key not in shrunk and view.key not in resize_held and _shrinks_instead(view):
                instead.add(view.key)
    if not enough():
        for view in views:
            if view.key in shrunk:
                reject(f"evict pods of {view.key}", "it is being shrunk in this plan")
                continue
            for pod in view.pods:
                key = victim_sort_key(
                    victim_order,
                    priority=pod.priority,
                    created=pod.created,
                    progress=view.progress,
                    name=pod.key,
                )
                candidates.append((key, pod, view))
        for pod in loose_pods:
            if pod.key in taken:
                continue
            key = victim_sort_key(
                victim_order, priority=pod.priority, created=pod.created, progress=0.0, name=pod.key
            )
            candidates.append((key, pod, None))
        candidates.sort(key=lambda c: c[0])
    gone: set[str] = set()
    took: list[Pod] = []
    """Every pod taken, evicted or shrunk away, in order."""

    def take(pod: Pod, cview: TrainingView | None) -> bool:
        """Evict ``pod`` (and its gang when it would drop below its minimum), or say why not."""
        nonlocal eviction_budget, noticing
        if pod.key in gone or pod.node is None or pod_pool.get(pod.node) != pool:
            return False
        why = refusal(pod, cview)
        if why is not None:
            reject(f"evict {pod.key}", why)
            return False
        group = [pod]
        whole = False
        if cview is not None and cview.gang_min > 0:
            left = [p for p in cview.pods if p.key not in gone]
            if len(left) - 1 < cview.gang_min:
                group = left
                whole = True
                others = [p for p in group if p.key != pod.key]
                blocked = next((r for p in others if (r := refusal(p, cview))), None)
                if blocked is not None:
                    reject(f"evict gang {cview.key}", blocked)
                    return False
        asks = notices is not None and any(notices.asks(p.annotations) for p in group)
        if asks and noticing is not None:
            reject(
                f"evict {pod.key}",
                f"one checkpoint notice per need at a time: waiting on {noticing}",
            )
            return False
        shrink = cview is not None and cview.key in instead
        if not shrink and len(group) > eviction_budget:
            what = f"gang {cview.key}" if whole and cview else pod.key
            reject(
                f"evict {what}",
                f"needs {len(group)} evictions; the eviction budget has {eviction_budget} left",
            )
            return False
        for victim in group:
            gone.add(victim.key)
            took.append(victim)
            gain = victim.gpus if pod_pool.get(victim.node or "") == pool else 0
            credit(victim.node, gain)
            if shrink and cview is not None:
                replaced.setdefault(cview.key, []).append(victim)
                continue
            evictions.append(Victim(victim, cview.key if cview else victim.workload, gain, whole))
            eviction_budget -= 1
        if asks:
            noticing = pod.key
        return True

    if fit is None:
        for _, pod, cview in candidates:
            if enough():
                break
            take(pod, cview)
    else:
        # per node, its evictable candidates in victim order (refusals do not change in a plan)
        per_node: dict[str, list[tuple[tuple[float | str, ...], Pod, TrainingView | None]]] = {}
        said: set[str] = set()
        for c in candidates:
            node = c[1].node
            if node is None or node not in fit.free:
                continue
            if (why := refusal(c[1], c[2])) is None:
                per_node.setdefault(node, []).append(c)
            elif (who := c[2].key if c[2] else c[1].key) not in said:
                said.add(who)  # once per workload: its pods share the reason
                reject(f"evict pods of {who}" if c[2] else f"evict {who}", why)
        victims = {n: [(k[:-1], p.gpus) for k, p, _ in cs] for n, cs in per_node.items()}
        tried: set[str] = set()
        while not enough():
            now_free = {n: f + gained.get(n, 0) for n, f in fit.free.items() if n not in tried}
            order = node_order(now_free, victims, fit.total, gpus=fit.gpus, domains=fit.domains)
            if not order:
                break
            node = order[0]
            tried.add(node)
            want = slots({node: now_free[node]}, fit.gpus) + 1
            before = len(took)
            for _, pod, cview in per_node[node]:
                take(pod, cview)
                if slots({node: fit.free[node] + gained.get(node, 0)}, fit.gpus) >= want:
                    tried.discard(node)
                    break
            moved = {p.node for p in took[before:] if p.node is not None}
            for touched in sorted(moved & per_node.keys()):
                left = [c for c in per_node[touched] if c[1].key not in gone]
                per_node[touched] = left
                victims[touched] = [(k[:-1], p.gpus) for k, p, _ in left]
    by_key = {v.key: v for v in views}
    for wkey, pods in replaced.items():
        shrinks.append(_shrink_instead(by_key[wkey], pods, pool=pool, pod_pool=pod_pool))
    return Plan(tuple(shrinks), tuple(evictions), freed, tuple(rejected), FrozenMap(gained))


def _shrinks_instead(view: TrainingView) -> bool:
    """A shrink of ``view`` can take the pods an eviction would (module docstring, 5): its
    controller is told which pods go, Ebbtide sizes it and grows it back, its owner sets no
    bounds of its own (a Kueue-admitted workload is fixed: it is preempted whole), and its pods
    do not ask for the checkpoint handshake (a shrink gives them no notice)."""
    w = view.workload
    return (
        w.kind in NAMED_REMOVAL_KINDS
        and view.grows_back
        and view.protected is None
        and w.min_replicas is None
        and w.gpus_per_replica > 0
        and not any(opted_in(p.annotations) for p in view.pods)
    )


def _shrink_instead(
    view: TrainingView, pods: Sequence[Pod], *, pool: str, pod_pool: Mapping[str, str | None]
) -> ShrinkStep:
    """The shrink that removes ``pods`` of ``view``. Pods not holding GPUs (pending) go first
    whatever is named (a ReplicaSet removes unscheduled pods first), so the count is taken
    from the pods holding GPUs, not from the replicas asked for."""
    w = view.workload
    to = max(0, min(w.replicas, len(view.pods)) - len(pods))
    gain = sum(p.gpus for p in pods if pod_pool.get(p.node or "") == pool)
    return ShrinkStep(view.key, w.kind, w.replicas, to, gain, tuple(p.key for p in pods))


_TAKES_BACK: Final = (
    "the replacement could take the GPU back (a Deployment with ebbtide.io/max-replicas is "
    "shrunk instead)"
)


def _replaced(
    pod: Pod, view: TrainingView, claimant_priority: int | None, *, waits: bool = False
) -> str | None:
    """Why evicting ``pod`` frees nothing for pods of ``claimant_priority``: its owner
    recreates it, and the replacement does not lose the scheduler's queue to them, or (with
    ``waits``) finds no claimant queued at all."""
    if claimant_priority is None:
        return None
    kind = view.workload.kind
    if waits:
        return (
            f"its {kind} would recreate it at once, and the replicas the GPUs are for are "
            f"created only once they are free (shrinkFirst): {_TAKES_BACK}"
        )
    if claimant_priority > pod.priority:
        return None
    return (
        f"its {kind} would recreate it at priority {pod.priority}, not below the "
        f"{claimant_priority} of the pods the GPUs are for: {_TAKES_BACK}"
    )


def _protection(
    pod: Pod, view: TrainingView | None, protected_namespaces: frozenset[str]
) -> str | None:
    if view is not None and view.protected is not None:
        return view.protected
    return protection(pod, protected_namespaces)
