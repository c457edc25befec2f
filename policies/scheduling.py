"""The engine's schedule: which SLOs a tick steps, which rules it runs, and which ticks are quiet.

Design:

* **A tick costs what changed.** On a sparse stream most ticks change nothing, so a tick steps
  a service's SLO only when it is due: it received events since it was last stepped, an
  interval left (or entered) its window (:meth:`~policies.slo.ExceedanceWindow.steady_until`),
  or one of its SLO timers runs out (:func:`~policies.slo.steady_until`: breachAfter,
  recoverAfter, staleAfter); a min-heap holds the next of these per service, worked out at the
  tick after it was stepped and only if no event made it due again. A service whose quiet
  step left it "below" with rules that only hold whatever its window holds is not made due by
  an event of requests all under its recovery threshold (``ServiceTrack.below_slack``): they
  only add to what keeps it there, so its level cannot change before the wake worked out; one
  whose scale-down rule held by its percentile is not either, for as many such requests as
  its counters show the percentile stays at or above the rule's floor with
  (:meth:`~policies.slo.ExceedanceWindow.floor_slack`).
* **Rules ask their own rules.** Whether a service's rules would only hold is each rule's own
  answer, beside the rule (:func:`~policies.rules.breach_quiet_until`,
  :func:`~policies.scaledown.scale_down_quiet_until`), as is until when the pool rules would
  decide nothing (:func:`~policies.pool_rules.grow_quiet_until`,
  :func:`~policies.pool_rules.mig_quiet_until`, asked by :mod:`policies.deciding`): the
  schedule keeps no copy of a rule's conditions, so a rule changed is a schedule changed.
* A service's rules run when its SLO was stepped since its rules last ran (unless the step
  changed nothing and they would only hold), or every tick while it is unsettled (its breach
  response may act at any tick, or its scale-down did not only hold: cooldowns, budgets and
  the stabilization window decide), or when the time its rules said they would hold until
  comes (a breaching service's cooldown ends: :func:`~policies.rules.breach_wait_until`;
  feedback that may give a cooldown back runs them at the next tick instead); a settled
  service's skipped ticks would each only have
  recorded its current replicas as its recommendation, and :meth:`Recommendations.hold
  <policies.scaledown.Recommendations.hold>` records them in one call when it next runs. A new
  snapshot, a reload, or a gap between ticks longer than the shortest stabilization window
  steps every service.
* The pool rules are skipped while they provably decide nothing: they decided nothing last
  time, with the same snapshot, policy and busy pools, no outcome or log record came back, none
  of their timers ran out and, where MIG may convert, the whole-card pool's mean is not below
  ``convertBelow``.
* :meth:`Scheduler.idle` answers whether a whole tick would be quiet, so a driver may skip it;
  after one quiet tick, a run of them costs a few comparisons, and one whose only news is
  services made due by events steps them without checking the rest again.
* The decisions are those of stepping everything (``Engine(…, incremental=False)``, kept for
  the tests and benchmarks that check exactly that).
"""

from __future__ import annotations

import heapq
import math
from typing import Final

from policies.intake import Intake
from policies.inventory import Inventory
from policies.model import Policy
from policies.pool_rules import convert_margin
from policies.rules import breach_quiet_read
from policies.scaledown import scale_down_quiet_read, scale_down_reads_window
from policies.servicetrack import ServiceTrack
from policies.slo import UNBOUNDED, steady_until, step
from policies.snapshot import Snapshot
from policies.windows import UtilizationWindow

__all__ = ["PoolsSeen", "Scheduler"]

#: A service is ticked this much (relative to the time) before a computed deadline, so float
#: rounding never makes it late; ticking early only costs the tick.
_EARLY: Final = 1e-12

#: What the pool rules saw: the snapshot's inventory, the policy and the busy pools.
PoolsSeen = tuple[Inventory, Policy, set[str]]


#: Window changes a wake looks ahead through when events alone will not step the service
#: (more than any ring holds: every one).
_FAR: Final = 1 << 30


def early(until: float) -> float:
    """``until`` moved a hair earlier (see ``_EARLY``); infinities stay."""
    return until - _EARLY * abs(until) if until < math.inf else until


def holds_only(svc: ServiceTrack, inv: Inventory, now: float) -> bool:
    """Whether a service whose SLO step at ``now`` changed nothing would, ruled, only hold: it
    was ruled before and each of its rules says it can only hold with this SLO state, window
    and snapshot (until its next step: the window's contents change only then). The rules'
    answers are :func:`~policies.rules.breach_quiet_until` and
    :func:`~policies.scaledown.scale_down_quiet_until`, their parts that depend on the spec
    alone kept on the service (``breach_quiet``, ``down_quiet``)."""
    hold = _holds_unread(svc, inv)
    return _holds_read(svc, inv, now) if hold is None else hold


def _holds_read(svc: ServiceTrack, inv: Inventory, now: float) -> bool:
    """:func:`holds_only` where :func:`_holds_unread` has no answer: the scale-down rule reads
    the window's percentile."""
    workload = inv.service_workload.get(svc.key)
    assert workload is not None  # else the hold would not read the window
    return (
        scale_down_quiet_read(svc.spec, svc.slo, workload, svc.latency, now, svc.exceed) == math.inf
    )


def _holds_unread(svc: ServiceTrack, inv: Inventory) -> bool | None:
    """:func:`holds_only` where the service's SLO state and workload decide it whatever its
    window holds; ``None`` where the scale-down rule reads the window's percentile."""
    if svc.ruled_at is None or svc.breach_quiet is not None:  # never quiet: any tick may act
        return False
    workload = inv.service_workload.get(svc.key)
    spec, slo = svc.spec, svc.slo
    if breach_quiet_read(spec, slo, workload) != math.inf:
        return False
    if workload is None:
        return True
    down = svc.down_quiet
    if down is None:
        return None if scale_down_reads_window(spec, slo, workload) else True
    return down == math.inf


class Scheduler:
    """What each tick must do. See the module docstring."""

    def __init__(self, intake: Intake, *, incremental: bool) -> None:
        self._intake = intake
        self.incremental = incremental
        self._policy: Policy | None = None
        self._ordered: list[ServiceTrack] = []
        #: Services due for an SLO step (events arrived): the intake's list, shared.
        self._due = intake.due
        #: (wake, index) deadlines.
        self._wakes: list[tuple[float, int]] = []
        #: The services stepped at the last evaluation: their wake time is worked out at the
        #: next one, and only when no event made them due again (on a busy stream, never).
        self._settling: list[ServiceTrack] = []
        #: Indexes of services whose rules run at the next round: stepped since their rules
        #: last ran, or unsettled; and (rules_at, index) of those whose rules run again at a
        #: time.
        self._rules: set[int] = set()
        self._unsettled: set[int] = set()
        self._rule_wakes: list[tuple[float, int]] = []
        #: key -> pool of the services breaching or recovering.
        self.busy: dict[str, str] = {}
        #: What the last tick saw; a change steps every service.
        self._seen: tuple[Inventory, Policy] | None = None
        #: The snapshot the last evaluation indexed (its inventory is ``_seen``'s).
        self._indexed: Snapshot | None = None
        #: The services whose SLO state the last evaluation changed.
        self.changed: list[ServiceTrack] = []
        #: ``now`` of the last round that ran the rules.
        self.last_round: float | None = None
        #: The shortest scale-down stabilization window: a longer gap between rounds steps all.
        self._gap_s = math.inf
        #: What the pool rules last saw when they decided nothing (else ``None``: run them),
        #: and until when they would go on so.
        self._pools_seen: PoolsSeen | None = None
        self._pools_wake = -math.inf
        #: Whether whole-card demand was unmet then (with the same snapshot: MIG converts
        #: nothing, so the pool's mean need not be read).
        self._pools_unmet = False
        #: Whether the whole-card pool's mean was at or above ``convertBelow`` (or unknown),
        #: and while it stays so: for the window, its epoch and the slot read, up to how many
        #: events taken (:func:`~policies.pool_rules.convert_margin`).
        self._mean_for: tuple[UtilizationWindow, int, int, int] | None = None
        self._mean_high = False
        #: After :meth:`idle` found a quiet tick: its snapshot, until when nothing the engine
        #: follows can wake (a service's wake time, the pool rules' timers) and whether the
        #: whole-card pool's mean is read; ``None`` once anything else may have changed.
        self.quiet: tuple[Snapshot, float, bool] | None = None

    def configure(self, policy: Policy, ordered: list[ServiceTrack]) -> None:
        """Adopt a policy and its services (in order): the next tick steps every service."""
        self.quiet = None
        self._rule_wakes = []
        self._indexed = None
        self._policy = policy
        self._ordered = ordered
        self._seen = None
        self._pools_seen = None
        self._mean_for = None
        self.busy = {}
        self._gap_s = min(
            (
                s.scale.down.stabilization
                for s in policy.spec.services.values()
                if s.scale is not None and s.scale.down is not None
            ),
            default=math.inf,
        )

    def forget_pools(self) -> None:
        """Feedback came (an outcome, a log record): a budget unit, a cooldown or a MIG slot
        may have come back, so the pool rules run at the next tick, and so do the rules of the
        services waiting for a cooldown to end."""
        self._pools_seen = None
        self.quiet = None
        for _, i in self._rule_wakes:
            self._rules.add(i)
        self._rule_wakes = []

    # -- one evaluation ------------------------------------------------------------------------

    def step_slos(self, now: float, inv: Inventory, snapshot: Snapshot) -> None:
        """Step the SLOs due at ``now`` (every SLO, as far as anyone can tell; ``inv`` indexes
        ``snapshot``) and note whose rules the round runs."""
        self.quiet = None
        self._indexed = snapshot
        due = self._slo_due(now, inv)
        changed = self.changed = []
        full = not self.incremental or due is self._ordered
        busy = self.busy
        for svc in due:
            level, n = svc.exceed.level(now, svc.q, svc.min_samples)
            before = svc.slo
            slo = svc.slo = step(before, level, now, svc.spec.slo)
            svc.samples = n
            svc.due = False
            svc.below_slack = 0
            if slo.state == "breaching" or slo.state == "recovering":
                busy[svc.key] = svc.spec.pool
            else:
                busy.pop(svc.key, None)
            svc.ticked_at = now
            if slo is not before or full:
                changed.append(svc)
                self._rules.add(svc.index)
            elif svc.index not in self._unsettled and not holds_only(svc, inv, now):
                self._rules.add(svc.index)
        self._settling = due

    def take_ruled(self, now: float) -> tuple[list[ServiceTrack], float | None]:
        """The services whose rules this round runs, in order, and ``now`` of the last round
        (this one is ``now``)."""
        wakes, rules = self._rule_wakes, self._rules
        while wakes and wakes[0][0] <= now:
            at, i = heapq.heappop(wakes)
            if self._ordered[i].rules_at == at:
                rules.add(i)
        ruled = [self._ordered[i] for i in sorted(rules | self._unsettled)]
        self._rules = set()
        last_round, self.last_round = self.last_round, now
        return ruled, last_round

    def settle(self, svc: ServiceTrack, until: float) -> None:
        """After ``svc``'s rules ran: until when, with the same SLO state and snapshot, they
        would only hold (``math.inf``: settled; ``-math.inf``: they run every tick; else they
        run again then)."""
        svc.rules_at = -math.inf
        svc.below_slack = 0
        if until == -math.inf:
            self._unsettled.add(svc.index)
            return
        self._unsettled.discard(svc.index)
        if until < math.inf:
            svc.rules_at = at = early(until)
            heapq.heappush(self._rule_wakes, (at, svc.index))

    def pools_ran(self, decided: bool, seen: PoolsSeen, until: float, unmet: bool) -> None:
        """The pool rules ran: whether anything was decided, and (from the rules) until when
        they would decide nothing with these inputs and whether whole-card demand is unmet."""
        self._pools_seen = None if decided else seen
        self._pools_wake = early(until)
        self._pools_unmet = unmet

    def pools_quiet(self, now: float, seen: PoolsSeen) -> bool:
        """Whether the pool rules (training growth, MIG) would decide nothing and change
        nothing at ``now``: they did not the last time, with the same snapshot, policy and busy
        pools, no outcome or log record came back since, none of their timers has run out, and
        the whole-card pool's utilization (read only while MIG may convert) is not below
        ``convertBelow``."""
        last = self._pools_seen
        if (
            not self.incremental
            or last is None
            or last[0] is not seen[0]
            or last[1] is not seen[1]
            or last[2] != seen[2]
            or now >= self._pools_wake
        ):
            return False
        mig = seen[1].spec.mig
        if mig is None or not mig.enabled or seen[2] or self._pools_unmet:
            return True
        return self._mean_high_at(now)

    def _mean_high_at(self, now: float) -> bool:
        """Whether the whole-card pool's mean is at or above ``convertBelow`` (or unknown) at
        ``now``: read again only when the slot read or the window's epoch changed, or more
        events came than the readings it could take and stay so (none when it was below)."""
        intake = self._intake
        slot = int(now // intake.util_interval)  # the slot a read at now covers last
        seen = self._mean_for
        if (
            seen is not None
            and intake.observed <= seen[3]
            and seen[2] == slot
            and seen[1] == seen[0].epoch
        ):
            return self._mean_high
        assert self._policy is not None
        mig = self._policy.spec.mig
        assert mig is not None
        window = intake.pool_windows[mig.from_pool]
        margin = convert_margin(mig, window, now)
        self._mean_high = margin >= 0
        # each event adds at most one reading to the window
        self._mean_for = (window, window.epoch, slot, intake.observed + max(margin, 0))
        return self._mean_high

    def _slo_due(self, now: float, inv: Inventory) -> list[ServiceTrack]:
        """The services whose SLO this tick must step (in no particular order: each steps
        alone, and their rules run in order): all of them after a new snapshot or policy, a
        long gap or when not incremental; else those with events since and those whose wake
        time has come."""
        policy = self._policy
        last = self.last_round
        gap = last is not None and now - last > self._gap_s
        if (
            not self.incremental
            or gap
            or self._seen is None
            or self._seen[0] is not inv
            or self._seen[1] is not policy
        ):
            assert policy is not None
            self._seen = (inv, policy)
            self._due.clear()
            self._wakes = []
            self._settling = []
            self._rules = set(range(len(self._ordered)))
            self._unsettled = set()
            self._rule_wakes = []
            return self._ordered
        self._wake_due(now)
        due = self._due[:]
        self._due.clear()
        return due

    def _wake_due(self, now: float) -> None:
        """Add to the due list the services whose wake time has come by ``now``, working out
        the wake of those stepped at the last evaluation first."""
        self._push_wakes(self._settling, now)
        self._settling = []
        due = self._due
        wakes = self._wakes
        ordered = self._ordered
        while wakes and wakes[0][0] <= now:
            wake, i = heapq.heappop(wakes)
            svc = ordered[i]
            if svc.wake == wake and not svc.due:
                svc.due = True
                due.append(svc)

    def _push_wakes(
        self,
        stepped: list[ServiceTrack],
        now: float,
        unread: list[bool] | None = None,
        *,
        quiet: bool = False,
    ) -> None:
        """Work out when each of ``stepped`` (stepped, and not written since) must be stepped
        again: due at once when that is ``now`` already, else on the heap. ``unread``: for
        each, whether its rules would only hold whatever its window holds, where the step
        that stepped them just asked (:meth:`_reads_level_only`)."""
        due = self._due
        wakes = self._wakes
        for j, svc in enumerate(stepped):
            svc.below_slack = 0
            if svc.due:
                continue  # events again: no need to know when it would have changed
            # No write since it was stepped: when its reads or its SLO timers change next; for
            # a service whose rules read only its level, when its level may first differ from
            # its SLO state's (the level every step leaves), looking one window change ahead
            # (each look reads its counters; the next event mostly comes first). A step before
            # then would return the state itself.
            if self._reads_level_only(svc, None if unread is None else unread[j]):
                level = svc.slo.last_level
                # Requests below the recovery threshold only push a change from "below" later
                # (n grows, those above it do not): events of only such requests need no step
                # before this wake. Set after a quiet step only: an evaluation's rules run next.
                # Such a service is stepped at its wake, not at its next event: look as far
                # ahead as its window goes.
                held = quiet and level == "below"
                svc.below_slack = UNBOUNDED if held else 0
                until = svc.exceed.level_steady_until(
                    svc.ticked_at, svc.q, svc.min_samples, level, ahead=_FAR if held else 1
                )
            else:
                until = svc.exceed.steady_until(svc.ticked_at)
                if quiet and svc.slo.last_level == "below" and self._settled(svc):
                    # Its rules held by its percentile (the quiet step read it, or its counts
                    # above the scale-down rule's floor): such requests keep its level, and as
                    # many as the counts' slack keep its percentile at or above that floor.
                    # Stepped at its next window change still (the wake here).
                    svc.below_slack = max(0, svc.exceed.floor_slack(svc.ticked_at, svc.q))
            timers = steady_until(svc.slo, svc.spec.slo)
            svc.wake = wake = early(until if until < timers else timers)
            if wake <= now:
                svc.due = True
                due.append(svc)
            elif wake < math.inf:
                heapq.heappush(wakes, (wake, svc.index))

    def _reads_level_only(self, svc: ServiceTrack, unread: bool | None) -> bool:
        """Whether a step of ``svc`` that leaves its level as it is changes nothing and its
        rules would only hold whatever its window holds (:func:`holds_only`, reading no
        percentile: ``unread`` when the caller knows, else read here), its rules not run every
        tick nor waiting for a time: then only its level, not its every read, tells when it
        must be stepped again."""
        seen = self._seen
        if seen is None or not self._settled(svc):
            return False
        return _holds_unread(svc, seen[0]) is True if unread is None else unread

    def _settled(self, svc: ServiceTrack) -> bool:
        """Whether ``svc``'s rules neither run every tick nor wait for a time."""
        return svc.rules_at == -math.inf and svc.index not in self._unsettled

    # -- quiet ticks ---------------------------------------------------------------------------

    def idle(self, now: float, snapshot: Snapshot) -> bool:
        """See :attr:`policies.engine.Engine.idle` (this method itself: a driver asks it every
        tick)."""
        seen, last = self._seen, self.last_round
        quiet = self.quiet
        if (
            quiet is not None
            and quiet[0] is snapshot
            and now < quiet[1]
            and not self._settling
            and last is not None
            and now - last <= self._gap_s
        ):
            # Since the quiet tick that set ``quiet`` nothing the full check reads has changed
            # (whatever would, resets it), no wake has come and the pool rules stay quiet but
            # for their mean: only the services events made due are left to step.
            if quiet[2] and not self._mean_high_at(now):
                return False
            if not self._due:
                self._record_quiet(now)
                return True
            assert seen is not None
            return self._step_quiet(now, seen[0], snapshot)
        policy = self._policy
        if (
            not self.incremental
            or seen is None
            or self._indexed is not snapshot
            or seen[1] is not policy
            or policy is None
            or policy.spec.kill_switch
            or self._rules
            or self._unsettled
            or self._rules_due(now)
            or last is None
            or now - last > self._gap_s
        ):
            return False
        inv = seen[0]
        self._wake_due(now)
        if not self.pools_quiet(now, (inv, policy, set(self.busy.values()))):
            return False
        return self._step_quiet(now, inv, snapshot)

    def _step_quiet(self, now: float, inv: Inventory, snapshot: Snapshot) -> bool:
        """:meth:`idle` once nothing but the due services may make the tick at ``now`` more
        than quiet: steps them when each would hold (``False`` otherwise, nothing done), and
        notes until when the next quiet tick is a short one."""
        due = self._due
        steps = self._steps_hold(now, due, inv)
        if steps is None:
            return False
        self._record_quiet(now)
        if due:  # stepped as evaluate steps them: their state stays, their rules would hold
            for svc, (n, _) in zip(due, steps, strict=True):
                svc.samples = n
                svc.due = False
                svc.ticked_at = now
            stepped = due[:]
            due.clear()
            # A quiet tick: their wake times now, not at the next tick (as after an evaluation,
            # where a busy stream would make them moot), so the next quiet tick is a short one.
            # An event before the wake leaves a stale heap entry: at worst one more step.
            self._push_wakes(stepped, now, [unread for _, unread in steps], quiet=True)
            if due:
                self.quiet = None
                return True
        wakes, rule_wakes = self._wakes, self._rule_wakes
        until = min(wakes[0][0], self._pools_wake) if wakes else self._pools_wake
        if rule_wakes and rule_wakes[0][0] < until:
            until = rule_wakes[0][0]
        policy = self._policy
        assert policy is not None
        mig = policy.spec.mig
        self.quiet = (
            snapshot,
            until,
            mig is not None and mig.enabled and not self.busy and not self._pools_unmet,
        )
        return True

    def _rules_due(self, now: float) -> bool:
        """Whether a service's rules must run at ``now`` by its time (dropping the stale
        entries in front: a service ruled since, for another reason)."""
        wakes, ordered = self._rule_wakes, self._ordered
        while wakes and ordered[wakes[0][1]].rules_at != wakes[0][0]:
            heapq.heappop(wakes)
        return bool(wakes) and wakes[0][0] <= now

    def _record_quiet(self, now: float) -> None:
        """Record a tick at ``now`` as ``evaluate`` records one that decided nothing."""
        self._intake.advance(now)
        if self.changed:
            self.changed = []
        self.last_round = now

    def _steps_hold(
        self, now: float, due: list[ServiceTrack], inv: Inventory
    ) -> list[tuple[int, bool]] | None:
        """For each of ``due``, the samples in its window and whether its rules would only hold
        whatever its window holds (:func:`_holds_unread`), when stepping each SLO at ``now``
        would leave its state the same object and its rules would only hold
        (:func:`holds_only`), so ``evaluate`` would change nothing but when it was stepped;
        ``None`` otherwise. Reads only: :func:`~policies.slo.step` is pure."""
        steps = []
        for svc in due:
            level, n = svc.exceed.level(now, svc.q, svc.min_samples)
            if step(svc.slo, level, now, svc.spec.slo) is not svc.slo:
                return None
            unread = _holds_unread(svc, inv)
            if not (_holds_read(svc, inv, now) if unread is None else unread):
                return None
            steps.append((n, unread is True))
        return steps
