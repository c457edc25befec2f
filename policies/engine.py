"""The decision engine: events in, windows updated; snapshot in, explained decisions out.

Design: a thin façade over three parts, each in its own module, sharing one
:class:`~policies.servicetrack.ServiceTrack` per service.

* **Intake** (:mod:`policies.intake`): ``observe(event)``, the hot path, into the services'
  latency windows and the GPUs' and pools' utilization windows, bounded by the engine's clock
  (clock skew), by the snapshot's nodes and by devices per node; merged partials from sharded
  ingest (``put_latency``, ``put_utilization``, ``merge_idle``).
* **Scheduling** (:mod:`policies.scheduling`): which SLOs a tick steps, which services' rules
  it runs, whether the pool rules run, and whether a whole tick is quiet (:meth:`Engine.idle`).
  A tick costs what changed; the decisions are those of ticking everything
  (``Engine(…, incremental=False)``, kept for the tests and benchmarks that check exactly that).
  Whether a rule would only hold is the rule's own answer, beside it.
* **Deciding** (:mod:`policies.deciding`): one round of the rules in a fixed order (breach
  responses, scale-downs, training growth, MIG), budgets and cooldowns spent inside it, and
  feedback (:meth:`Engine.not_done`, :meth:`Engine.record`) into the same
  :class:`~policies.budgets.Ledger` the caller may share with its safety gate.
* The snapshot's indexes (:class:`~policies.inventory.Inventory`) are cached on the snapshot:
  hand the same object (or an equal one) again and nothing is rebuilt.
* ``reload(policy)`` refuses a policy with problems and keeps the old one; an accepted policy
  re-indexes the last snapshot at once (nodes join or leave pools before the next event) and
  keeps the windows and SLO state of services whose SLO settings did not change, what budgets
  spent, and cooldowns.
* Pure: no clock (``now`` is passed in), no I/O, deterministic (everything iterates in sorted
  order), so replay and ``policy test`` reuse it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.budgets import BudgetState, Ledger, LogRecord
from policies.deciding import Decider
from policies.decisions import Decision
from policies.intake import DEFAULT_UTIL_WINDOW_S, MAX_DEVICES_PER_NODE, UTIL_SLOTS, Intake
from policies.inventory import Inventory
from policies.model import Policy, format_loc
from policies.scheduling import Scheduler
from policies.servicetrack import ServiceTrack
from policies.slo import Level, SloState, State
from policies.snapshot import Snapshot

__all__ = [
    "DEFAULT_UTIL_WINDOW_S",
    "MAX_DEVICES_PER_NODE",
    "UTIL_SLOTS",
    "Engine",
    "PoolStatus",
    "ReloadResult",
    "ServiceStatus",
]


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """One service's SLO, for metrics and reports."""

    key: str
    state: State
    since: float | None
    breaches: int
    level: Level
    samples: int
    percentile: float
    quantile_ms: float | None
    objective_ms: float


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One pool's GPUs, for metrics and reports."""

    name: str
    kind: str
    nodes: int
    capacity_gpus: int
    free_gpus: int
    util_pct: float | None
    reclaimable_gpus: int = 0
    """GPUs held by pods but idle (windowed utilization under the idle threshold for the whole
    utilization window): an over-provisioned replica's GPUs, reclaimable by scaling it in."""


@dataclass(frozen=True, slots=True)
class ReloadResult:
    accepted: bool
    errors: tuple[str, ...] = ()


class Engine:
    """Decides; never acts. See the module docstring."""

    def __init__(
        self, policy: Policy, *, ledger: Ledger | None = None, incremental: bool = True
    ) -> None:
        problems = policy.problems()
        if problems:
            raise ValueError("; ".join(f"{format_loc(p.loc)}: {p.message}" for p in problems))
        self._policy = policy
        self._services: dict[str, ServiceTrack] = {}
        self._ordered: list[ServiceTrack] = []
        self._intake = Intake()
        self._schedule = Scheduler(self._intake, incremental=incremental)
        self._decide = Decider(ledger if ledger is not None else Ledger(policy.spec.budgets))
        #: The intake's own methods, without a façade's call in between (``observe`` is the
        #: hot path); ``put_*`` and ``merge_idle`` take merged partials (policies.partials).
        self.observe = self._intake.observe
        self.observe_many = self._intake.observe_many
        self.put_latency = self._intake.put_latency
        self.put_utilization = self._intake.put_utilization
        self.merge_idle = self._intake.merge_idle
        #: ``idle(now, snapshot)``: whether ``evaluate(now, snapshot)`` would be a quiet tick:
        #: the snapshot and policy of the last evaluation, the SLOs due (events for a service
        #: since, a wake time come) stepping to the same state with rules that would only hold,
        #: no other service's rules to run and the pool rules quiet. If so, the tick is
        #: recorded as ``evaluate`` would record it (it returned no decision, changed no SLO
        #: state, and the due services were ticked) and the caller may skip the rest of its
        #: tick; if not, nothing changed and the caller evaluates. Always ``False`` when not
        #: incremental. A run of quiet ticks costs little: after one, the next is quiet as long
        #: as no wake time or pool timer came and the pool's mean did not drop (anything else,
        #: an evaluation, a reload, feedback, drops what was known), the services events made
        #: due only stepped. The schedule's own method: a replay asks it every tick.
        self.idle = self._schedule.idle
        #: ``advance(now)``: the caller's clock reads ``now``: no event may move a window past
        #: ``now`` plus one resolution from here on (:mod:`policies.intake`). An older ``now``
        #: changes nothing. The intake's own too: a replay calls it every tick.
        self.advance = self._intake.advance
        #: ``disrupted`` as the cached inventory was built with it.
        self._indexed_disrupted: dict[str, tuple[float, ...]] = {}
        self._inventory: Inventory | None = None
        self._inventory_for: tuple[Snapshot, Policy] | None = None
        self._apply(policy)

    # -- policy ------------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    def reload(self, policy: Policy) -> ReloadResult:
        """Adopt ``policy`` if it has no problems; otherwise keep the current one."""
        problems = policy.problems()
        if problems:
            return ReloadResult(False, tuple(f"{format_loc(p.loc)}: {p.message}" for p in problems))
        self._apply(policy)
        return ReloadResult(True)

    def _apply(self, policy: Policy) -> None:
        spec = policy.spec
        services: dict[str, ServiceTrack] = {}
        for name in sorted(spec.services):
            svc_spec = spec.services[name]
            key = f"{svc_spec.namespace}/{name}"
            existing = self._services.get(key)
            if existing is not None:
                existing.respec(svc_spec)
                services[key] = existing
            else:
                services[key] = ServiceTrack(name, svc_spec)
        self._services = services
        self._ordered = [services[k] for k in sorted(services)]
        for i, svc in enumerate(self._ordered):
            svc.index = i
        self._schedule.configure(policy, self._ordered)
        self._decide.configure(policy, set(services) | {f"pool:{p}" for p in spec.pools})
        self._intake.configure(policy, services)
        self._policy = policy
        last = self._inventory_for
        self._inventory_for = None
        if last is not None:
            # Re-index the last snapshot now: the node -> pool map must name only this policy's
            # pools before the next event (a removed pool's window is gone: KeyError, and the
            # consumer would retry the batch, counting its first events twice).
            self._index(last[0])

    # -- events (``observe``, ``observe_many`` and ``advance`` are the intake's own) -----------

    @property
    def observed(self) -> int:
        """Events (and merged readings) taken."""
        return self._intake.observed

    @property
    def late(self) -> int:
        """Events too old for their window."""
        return self._intake.late

    @property
    def unknown(self) -> int:
        """Events (or partials) for a service the policy does not name."""
        return self._intake.unknown

    @property
    def other_metric(self) -> int:
        """Latency events of a metric the service's objective is not on (not counted)."""
        return self._intake.other_metric

    @property
    def skewed(self) -> int:
        """Events stamped more than one resolution past the engine's clock (taken at it)."""
        return self._intake.skewed

    @property
    def dropped(self) -> dict[str, int]:
        """GPU readings dropped, by reason (:attr:`policies.intake.Intake.dropped`)."""
        return self._intake.dropped

    @property
    def unresolved(self) -> dict[str, float]:
        """Services whose latency histograms end below the objective -> that last bound."""
        return self._intake.unresolved

    @property
    def load_dropped(self) -> dict[str, int]:
        """``inference.load`` events not used, by reason (:attr:`policies.intake.Intake.
        load_dropped`)."""
        return self._intake.load_dropped

    def work_bound(self) -> dict[str, str | None]:
        """Services with the work-bound check (``scale.workBound``) -> why their latency is
        taken as set by the work while it is, else ``None`` (:mod:`policies.loadsignals`)."""
        out: dict[str, str | None] = {}
        for key, sig in sorted(self._intake.signals.items()):
            scale = sig.spec.scale
            if scale is not None and scale.work_bound is not None:
                wb = sig.work_bound
                out[key] = wb.evidence if wb.active else None
        return out

    # -- decisions ---------------------------------------------------------------------------

    def _index(self, snapshot: Snapshot) -> Inventory:
        cached = self._inventory_for
        disrupted = self._decide.disrupted
        if cached is not None and cached[1] is self._policy and self._inventory is not None:
            if cached[0] is snapshot:
                return self._inventory
            if cached[0] == snapshot and disrupted == self._indexed_disrupted:
                # rebuilt unchanged (and so is what Ebbtide disrupted): keep the indexes
                self._inventory_for = (snapshot, self._policy)
                return self._inventory
        known = {p.workload for p in snapshot.pods} | {w.key for w in snapshot.workloads}
        for gone_wl in [k for k in disrupted if k not in known]:
            del disrupted[gone_wl]
        inv = Inventory(snapshot, self._policy, disrupted=disrupted)
        self._indexed_disrupted = dict(disrupted)
        self._inventory, self._inventory_for = inv, (snapshot, self._policy)
        self._intake.index(inv)
        return inv

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Step the SLOs due (every SLO, as far as anyone can tell: :mod:`policies.scheduling`)
        and return this round's decisions, in the order they were taken."""
        self._intake.advance(now)
        schedule = self._schedule
        schedule.quiet = None
        inv = self._index(snapshot)
        schedule.step_slos(now, inv, snapshot)
        if self._policy.spec.kill_switch:
            for sig in self._intake.signals.values():
                sig.tick(now)  # further objectives keep their state, as the primary does
            return []
        ruled, last_round = schedule.take_ruled(now)
        # a work-bound service's breach wants no GPUs (replicas do not help it): it does not
        # hold training growth or MIG conversion back (policies.loadsignals)
        signals = self._intake.signals
        bound = {k for k, sig in signals.items() if sig.work_bound.active}
        busy_pools = {pool for key, pool in schedule.busy.items() if key not in bound}
        # a further objective breaching (or recovering) is the service's breach too
        busy_pools |= {
            sig.spec.pool
            for key, sig in signals.items()
            if key not in bound
            and any(t.state.state in ("breaching", "recovering") for t in sig.objectives)
        }
        seen = (inv, self._policy, busy_pools)
        if not ruled and schedule.pools_quiet(now, seen):
            return []  # a quiet tick: every rule would decide nothing and change nothing
        decide = self._decide
        rnd = decide.round(now, self._policy, inv, self._intake)
        for svc, until in decide.rule_services(rnd, ruled, last_round):
            schedule.settle(svc, until)
        if rnd.decisions or not schedule.pools_quiet(now, seen):
            until, unmet = decide.rule_pools(rnd, self._intake, busy_pools)
            schedule.pools_ran(bool(rnd.decisions), seen, until, unmet)
        return rnd.decisions

    @property
    def ledger(self) -> Ledger:
        """The budgets' ledger (share it with the safety gate: one verdict per decision)."""
        return self._decide.ledger

    def record(self, rec: LogRecord) -> None:
        """A decisions-log record, read back at start-up or from another replica live: an
        action that happened counts against its budget and the cooldowns it started (its
        service's and the service's pool's, or a grow's pool's) run from its time; one that
        did not gives both back; the workload an eviction or shrink took a pod from is marked,
        as when decided here. Reading a record twice changes nothing."""
        self._schedule.forget_pools()  # the pool rules' budgets or cooldowns may have moved
        self._decide.record(rec, self._policy, self._services)

    def not_done(
        self,
        decision: Decision,
        *,
        reason: str,
        retry_at: float | None = None,
        hold_until: float | None = None,
    ) -> None:
        """Feedback: ``decision`` was not carried out (refused, blocked, failed). Its budget
        unit is given back, so budgets count actions that happened, and the cooldowns it
        started (its service's and the service's pool's, or a grow's pool's) are taken back:
        the next try comes at ``retry_at`` (default: at once), never later than the cooldown
        would have allowed. With ``hold_until``, an eviction's pod (a PodDisruptionBudget
        answered 429) is not picked as a victim again before then: the next one in victim
        order is taken instead; a MIG flow's node is not planned for before then; a training
        shrink's workload (its resize failed) is not shrunk again before then: other victims
        are taken instead."""
        self._schedule.forget_pools()  # a budget unit, a cooldown or a MIG slot came back
        self._decide.not_done(
            decision,
            self._policy,
            self._services,
            reason=reason,
            retry_at=retry_at,
            hold_until=hold_until,
        )

    # -- state for metrics and reports -------------------------------------------------------

    def service_status(self, now: float) -> list[ServiceStatus]:
        """Every service's SLO state and windowed percentile (merges each sketch: for reports
        and metrics scrapes, not the decision loop)."""
        out = []
        for svc in self._ordered:
            slo = svc.spec.slo
            n, _, _ = svc.exceed.counts(now)
            out.append(
                ServiceStatus(
                    key=svc.key,
                    state=svc.slo.state,
                    since=svc.slo.since,
                    breaches=svc.slo.breaches,
                    level=svc.slo.last_level,
                    samples=n,
                    percentile=slo.percentile,
                    quantile_ms=svc.latency.quantile(now, slo.percentile / 100.0),
                    objective_ms=slo.objective_ms,
                )
            )
        return out

    def quantile(self, service_key: str, now: float) -> float | None:
        """The windowed percentile of ``namespace/service`` at ``now`` (its SLO's percentile),
        within the sketch's relative accuracy; ``None`` when its window is empty. Merges the
        window's intervals incrementally: cheap to call once per tick, not free."""
        svc = self._services[service_key]
        return svc.latency.quantile(now, svc.q)

    def changed(self) -> list[str]:
        """The services (``namespace/service``) whose SLO state the last :meth:`evaluate`
        changed (in no particular order; every service when it ticked everything): every other
        service's :meth:`slo_state` is the same object as before it."""
        return [svc.key for svc in self._schedule.changed]

    def cooldown_left(self, service_key: str, now: float) -> float:
        """Seconds before ``namespace/service`` may be acted for again (0: it may now), from
        its own cooldown or the policy's, and any hold-off after a refused try (``ebbtide
        status``). A scale-up with ``readyEndsCooldown`` may end it earlier, once its replicas
        run."""
        svc = self._services[service_key]
        quiet = svc.spec.cooldown
        length = self._policy.spec.cooldowns.service if quiet is None else quiet
        return self._decide.cooldowns.remaining_s(service_key, now, length)

    def slo_state(self, service_key: str) -> SloState:
        """The SLO state of ``namespace/service``."""
        return self._services[service_key].slo

    def pool_status(self, now: float) -> list[PoolStatus]:
        """Per pool: nodes, whole GPUs, free GPUs (from the last snapshot) and utilization."""
        inv = self._inventory
        intake = self._intake
        reclaimable = self.reclaimable(now)
        out = []
        for name in sorted(self._policy.spec.pools):
            pool = self._policy.spec.pools[name]
            window = intake.pool_windows.get(name)
            out.append(
                PoolStatus(
                    name=name,
                    kind=pool.kind,
                    nodes=len(inv.pool_nodes.get(name, [])) if inv else 0,
                    capacity_gpus=inv.capacity.get(name, 0) if inv else 0,
                    free_gpus=inv.free.get(name, 0) if inv else 0,
                    util_pct=window.mean(now) if window is not None else None,
                    reclaimable_gpus=reclaimable[name],
                )
            )
        return out

    def reclaimable(self, now: float) -> dict[str, int]:
        """Per pool (in name order), :attr:`PoolStatus.reclaimable_gpus` alone: what a replay
        samples once per timeline bucket, without the pools' means :meth:`pool_status` reads."""
        inv = self._inventory
        names = sorted(self._policy.spec.pools)
        if inv is None:
            return dict.fromkeys(names, 0)
        intake = self._intake
        idle = intake.idle.idle_gpus(now, intake.util_window_s, intake.stale_s)
        return {name: _reclaimable(inv, name, idle) for name in names}

    def budget_states(self, now: float) -> list[BudgetState]:
        """Each budget's limit, use and what remains in its window (for metrics)."""
        return self._decide.budgets.states(now)


def _reclaimable(inv: Inventory, pool: str, idle: Mapping[str, int]) -> int:
    """Per node of ``pool``: held GPUs idle for the window (``idle``, per node). Which GPU a
    pod holds is not known, so only idle GPUs beyond the node's free ones count."""
    free = inv.node_free
    total = 0
    for n in inv.pool_nodes.get(pool, ()):
        spare = idle.get(n.name, 0) - free.get(n.name, 0)
        if spare > 0:  # else none (a node's whole GPUs are read only where some may count)
            total += max(0, min(spare, n.whole_gpus - free[n.name]))
    return total
