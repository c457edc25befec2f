"""``/status``: per service and per pool, what the controller sees and what blocks it right now.

Modelled on what ``kubectl describe hpa`` answers (its conditions AbleToScale, ScalingActive and
ScalingLimited, each with a reason: k8s.io/api autoscaling/v2 ``HorizontalPodAutoscalerCondition``
and pkg/controller/podautoscaler/horizontal.go) and KEDA's ScaledObject status: per service the
SLO state, the percentile against its objective, replicas current/desired/min/max, the last
decision with its reason, and ``blockedBy``: every reason no action would be taken for it now
(breachAfter still running, cooldown left, a budget spent, too few samples, stale, at
replicas.max); globally the kill switch, dry-run, "not the leader", a decisions log not yet read
back, a cluster cache not synced. Per pool: utilization, free (idle) and reclaimable GPUs, and
the MIG flows on its nodes with their phase. With ServiceObjectives watched, each service says
where it comes from (``source``: the policy file or its object), a pause set on its object is
what blocks it first, and ``objectives`` lists every object watched and whether it joined the
policy (:func:`controller.kube.objective_crd.with_objectives`'s verdicts); the objects' own
status is written from these entries (:mod:`controller.process.objective_status`).

Every replica answers, the followers too: their engines are fed the same events, and the last
decisions come from the shared decisions log (:meth:`StatusBoard.note`, told of each record
by the decisions journal, the leader's own included), so a follower's answer matches the
leader's but says ``role: follower``. Reading is on demand (a request merges each percentile
sketch, as a metrics scrape does), never on the decision path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.kube.migannotation import FLOW_ANNOTATION, FlowRecord
from controller.kube.objective_crd import PAUSED_ANNOTATION, Admission
from controller.loop.port import Cluster
from policies.decisions import Decision
from policies.engine import Engine
from policies.model import Policy, ServiceSpec, format_duration
from policies.snapshot import Node, Snapshot

__all__ = ["StatusBoard", "StatusSources"]

#: Decision fields kept as a service's last decision.
_LAST = ("id", "ts", "action", "target", "from", "to", "rule", "reason", "outcome", "detail")
#: Budgets by the camelCase name the policy gives them.
_BUDGET_KEYS = {
    "evictions": "evictions",
    "scale_steps": "scaleSteps",
    "mig_conversions": "migConversions",
}


@dataclass(frozen=True, slots=True)
class StatusSources:
    """Where the board reads from (callables: the engine and cluster change on reload)."""

    engine: Callable[[], Engine]
    cluster: Callable[[], Cluster]
    is_leader: Callable[[], bool]
    unrestored: Callable[[], str | None]
    """Why the decisions log has not been read back (no action until it has)."""
    dry_run: Callable[[], bool]
    """The controller's ``--dry-run`` (the policy's own ``spec.dryRun`` is read too)."""
    identity: str
    clock: Callable[[], float]
    paused_objectives: Callable[[], Mapping[str, str]] = dict
    """Services paused on their ServiceObjective (``ebbtide.io/paused``), by service key, with
    the words to show."""
    objectives: Callable[[], Sequence[Admission]] = tuple
    """Every ServiceObjective watched and whether it joined the policy (none without them)."""


class StatusBoard:
    """Answers ``/status``; remembers each service's last decision."""

    def __init__(self, sources: StatusSources) -> None:
        self._s = sources
        self._last: dict[str, dict[str, object]] = {}

    def note(self, record: Mapping[str, object]) -> None:
        """A decision record (this replica's, or any replica's read from the decisions log):
        the latest per service (its ``cause``; a scale's target too) is kept; a later record
        of the same decision (its outcome after the intent) replaces it."""
        brief = {k: record[k] for k in _LAST if k in record}
        for key in {record.get("cause"), record.get("target")} - {None}:
            kept = self._last.get(str(key))
            if kept is None or _newer(brief, kept):
                self._last[str(key)] = brief

    def paused(self, decision: Decision) -> str | None:
        """Why ``decision`` must not be carried out: its service's ServiceObjective or its
        workload carries ``ebbtide.io/paused: "true"`` (as KEDA's
        ``autoscaling.keda.sh/paused``); ``None`` when it may. Checked on the caches at the
        moment of acting."""
        cluster = self._s.cluster()
        if not cluster.synced:
            return None
        objectives = self._s.paused_objectives()
        paused = _paused_workloads(cluster.snapshot())
        if not paused and not objectives:
            return None
        policy = self._s.engine().policy
        for name, svc in policy.spec.services.items():
            key = policy.service_key(name)
            workload = _workload_key(key, svc)
            if decision.cause == key or decision.target == workload:
                if key in objectives:
                    return objectives[key]
                if workload in paused:
                    return f"paused: {workload} carries {PAUSED_ANNOTATION}=true"
        return None

    def status(self) -> dict[str, Any]:
        """The whole answer, as JSON data."""
        s = self._s
        now = s.clock()
        engine = s.engine()
        policy = engine.policy
        cluster = s.cluster()
        snapshot = cluster.snapshot() if cluster.synced else None
        leading = s.is_leader()
        budgets = {b.name: b for b in engine.budget_states(now)}
        spec = policy.spec
        blocking: list[str] = []
        if spec.kill_switch:
            blocking.append("kill switch on (spec.killSwitch): no decisions are made")
        dry_run = s.dry_run()
        if dry_run or spec.dry_run:
            where = (
                "spec.dryRun" if spec.dry_run else "the controller's --dry-run, the chart's dryRun"
            )
            blocking.append(f"dry-run ({where}): decisions are reported, never carried out")
        if not leading:
            blocking.append("not the leader: this replica follows; the leader acts")
        if (why := s.unrestored()) is not None:
            blocking.append(why)
        if snapshot is None:
            blocking.append("cluster cache not synced")
        statuses = {st.key: st for st in engine.service_status(now)}
        paused = _paused_workloads(snapshot) if snapshot is not None else set()
        verdicts = self._s.objectives()
        joined = {v.key for v in verdicts if v.accepted}
        objectives = self._s.paused_objectives()
        services = []
        for name, svc in sorted(spec.services.items()):
            key = policy.service_key(name)
            entry = self._service(engine, key, svc, statuses[key], snapshot, budgets, paused, now)
            entry["source"] = f"ServiceObjective {key}" if key in joined else "policy file"
            if key in objectives:
                entry["paused"] = True
                entry["blockedBy"].insert(0, objectives[key])
            services.append(entry)
        return {
            "replica": s.identity,
            "role": "leader" if leading else "follower",
            "at": datetime.fromtimestamp(now, UTC).isoformat(),
            "policy": {
                "name": policy.metadata.name,
                "digest": policy.digest(),
                "dryRun": dry_run or spec.dry_run,
                "killSwitch": spec.kill_switch,
            },
            "blockedBy": blocking,
            "budgets": [
                {
                    "name": _BUDGET_KEYS.get(b.name, b.name),
                    "max": b.max,
                    "perSeconds": b.per_s,
                    "used": b.used,
                    "remaining": b.remaining,
                }
                for b in budgets.values()
            ],
            "services": services,
            "objectives": [
                {"object": v.key, "accepted": v.accepted, "reason": v.reason, "message": v.message}
                for v in verdicts
            ],
            "pools": self._pools(engine, policy, snapshot, now),
        }

    def _service(
        self,
        engine: Engine,
        key: str,
        svc: ServiceSpec,
        st: Any,
        snapshot: Snapshot | None,
        budgets: Mapping[str, Any],
        paused: set[str],
        now: float,
    ) -> dict[str, Any]:
        slo = svc.slo
        state = engine.slo_state(key)
        workload_key = _workload_key(key, svc)
        current = None
        if snapshot is not None:
            found = [w for w in snapshot.workloads if w.key == workload_key]
            current = found[0].replicas if found else None
        last = self._last.get(key) or self._last.get(workload_key)
        desired = None
        if (
            last is not None
            and last.get("action") == "scale"
            and last.get("target") == workload_key
        ):
            desired = last.get("to")
        blocked: list[str] = []
        if workload_key in paused:
            blocked.append(f"paused: {workload_key} carries {PAUSED_ANNOTATION}=true")
        if st.level == "none":
            blocked.append(
                f"too few samples: {st.samples} in the window, minSamples {slo.min_samples}"
            )
        if state.state == "ok" and state.pending_since is not None and st.level == "above":
            blocked.append(
                f"breachAfter running: above the objective for "
                f"{format_duration(max(0.0, now - state.pending_since))} of "
                f"{format_duration(slo.breach_after)}"
            )
        if state.state == "stale":
            blocked.append("stale: a breach without a verdict expired; waiting for traffic")
        if (left := engine.cooldown_left(key, now)) > 0:
            blocked.append(f"cooldown: {format_duration(round(left, 1))} left")
        acts = svc.scale is not None or state.state == "breaching"
        for name in ("scale_steps", "evictions"):
            b = budgets.get(name)
            if acts and b is not None and b.remaining <= 0:
                blocked.append(
                    f"budget {_BUDGET_KEYS[name]} spent: {b.used} of {b.max} per "
                    f"{format_duration(b.per_s)}"
                )
        if (
            state.state == "breaching"
            and svc.replicas is not None
            and current is not None
            and current >= svc.replicas.max
        ):
            blocked.append(f"at replicas.max ({svc.replicas.max})")
        return {
            "service": key,
            "pool": svc.pool,
            "workload": workload_key,
            "scaledBy": "ebbtide" if svc.scale is not None else "others",
            "paused": workload_key in paused,
            "state": state.state,
            "since": state.since,
            "breaches": state.breaches,
            "objectives": [
                {
                    "percentile": slo.percentile,
                    "objectiveMs": slo.objective_ms,
                    "currentMs": None if st.quantile_ms is None else round(st.quantile_ms, 1),
                    "samples": st.samples,
                    "level": st.level,
                }
            ],
            "replicas": {
                "current": current,
                "desired": desired,
                "min": svc.replicas.min if svc.replicas else None,
                "max": svc.replicas.max if svc.replicas else None,
            },
            "lastDecision": last,
            "blockedBy": blocked,
        }

    @staticmethod
    def _pools(
        engine: Engine, policy: Policy, snapshot: Snapshot | None, now: float
    ) -> list[dict[str, Any]]:
        flows: dict[str, list[dict[str, Any]]] = {}
        for node in snapshot.nodes if snapshot is not None else ():
            if FLOW_ANNOTATION not in node.annotations:
                continue
            pool = _pool_of(node, policy) or ""
            flows.setdefault(pool, []).append(_flow(node))
        out = []
        for p in engine.pool_status(now):
            out.append(
                {
                    "name": p.name,
                    "kind": p.kind,
                    "nodes": p.nodes,
                    "capacityGpus": p.capacity_gpus,
                    "freeGpus": p.free_gpus,
                    "reclaimableGpus": p.reclaimable_gpus,
                    "utilizationPct": None if p.util_pct is None else round(p.util_pct, 1),
                    "migFlows": flows.pop(p.name, []),
                }
            )
        if leftover := [f for fs in flows.values() for f in fs]:
            out.append({"name": "", "kind": "", "migFlows": leftover})
        return out


def _workload_key(service_key: str, svc: ServiceSpec) -> str:
    """``namespace/workload`` of a service (its workload defaults to the service's name)."""
    return f"{svc.namespace}/{svc.workload or service_key.split('/', 1)[1]}"


def _paused_workloads(snapshot: Snapshot) -> set[str]:
    return {w.key for w in snapshot.workloads if w.annotations.get(PAUSED_ANNOTATION) == "true"}


def _newer(a: Mapping[str, object], b: Mapping[str, object]) -> bool:
    """``a`` replaces ``b``: a later decision, or the same decision's later record."""
    ta, tb = a.get("ts"), b.get("ts")
    if a.get("id") is not None and a.get("id") == b.get("id"):
        return True
    if isinstance(ta, int | float) and isinstance(tb, int | float):
        return ta >= tb
    return True


def _pool_of(node: Node, policy: Policy) -> str | None:
    for name, pool in sorted(policy.spec.pools.items()):
        if all(node.labels.get(k) == v for k, v in pool.node_selector.items()):
            return name
    return None


def _flow(node: Node) -> dict[str, Any]:
    try:
        record = FlowRecord.from_json(node.annotations[FLOW_ANNOTATION])
    except ValueError as exc:
        return {"node": node.name, "error": f"unreadable {FLOW_ANNOTATION}: {exc}"}
    return {
        "node": node.name,
        "direction": record.direction,
        "phase": record.phase,
        "target": record.target,
        "profile": record.profile,
        "started": record.started,
        "deadline": record.deadline,
    }
