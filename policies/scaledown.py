"""Giving capacity back: scaling an inference service down when it is comfortably fast.

Design (the Kubernetes HPA's scale-down, decided from the latency stream):

* **Recommendation, every tick.** While the service is ``ok`` with a verdict and its windowed
  percentile ``p`` is below ``down.below`` of the objective, the recommendation is the HPA's
  ``desired = ceil(replicas * p / objective)`` (the formula the breach response uses upwards),
  never below ``replicas.min``. Every other tick (breaching, recovering, stale, no verdict,
  ``p`` at or above ``below * objective``) recommends the current replicas: hold. The band
  between ``below * objective`` and the objective is where the service settles.
* **Stabilization.** A scale-down goes only to the *highest* recommendation over the last
  ``down.stabilization`` (the HPA's ``stabilizationWindowSeconds``, 300 s by default), so a
  brief dip never scales down and a breach, a recovery or a silence inside the window holds
  the replicas for the whole window after it. The highest value over a sliding window is kept
  in a monotonic deque (:class:`Recommendations`): O(1) amortised per tick, memory bounded by
  the ticks in one window. No scale-down before the recommendations cover a whole window (a
  restart, the kill switch lifted or a gap in evaluation waits one window before giving
  anything back).
* **Crowds** (``down.crowd``). A long window keeps the replicas a recurring load comes back
  to, and also a flash crowd's for a whole window after it. A recommendation above every one
  made over ``crowd.memory`` before the window (with two windows of history: with less,
  nothing is called new) is a crowd's: it counts in the stabilized count only ``crowd.after``
  after it was made, and the replicas above the highest level needed before go back in one
  step (``maxStep`` paces the levels below it). Levels before the window are kept per minute
  (a monotonic deque over the memory), so classifying is O(1) amortised too.
* **Bounds.** At most ``down.maxStep`` replicas per decision (a number, or a percentage of the
  current replicas, at least one), never below ``replicas.min``, at most one scale-down per
  ``down.cooldown`` (default: the service's cooldown), none within the service's cooldown after
  any other action for it, none within ``recoverAfter`` of entering ``ok`` (a recovery, or the
  first verdict after a silence), and none when the scale-steps budget is spent.
* **No verdict, no scale-down.** Too few requests to judge (``minSamples``) gives no
  recommendation, so replicas hold: an empty stream may be a broken pipeline (an agent down, a
  topic lagging) rather than an idle service, and removing its replicas then would be a guess.
* A scale-down is a :class:`~policies.decisions.Scale` of role ``inference`` with
  ``to_replicas < from_replicas`` and ``cause`` the service, emitted through
  :meth:`~policies.rules.Round.emit` (it spends a scale step). Like every action for a
  service it starts the service's cooldown: the decisions log, read back live and at start-up
  (:meth:`~policies.engine.Engine.record`), marks the cooldown of every decision's cause, so
  marking it here too keeps the engine, a restarted replica and replay in agreement. The GPUs
  it frees show up in later snapshots, where training growth and MIG conversion find them.
* **Which replicas go.** Left to the ReplicaSet controller, the newest pods go wherever they
  run, so a night's freed GPUs end up one per node and no node empties for MIG conversion or a
  large replica. A Deployment's scale-down names the pods to remove (``Scale.remove``): pods
  not yet running first (the ReplicaSet removes those first anyway), then the running ones
  :func:`policies.placement.give_back` picks so whole nodes (and NVLink domains) empty. The
  Kubernetes actuator marks them with a low ``controller.kubernetes.io/pod-deletion-cost``
  before the ``/scale`` write; the simulated cluster removes exactly them. A StatefulSet
  cannot be told: it removes its highest ordinals, and the explanation says so.
"""

from __future__ import annotations

import math
from collections import deque

from policies.decisions import Alternative, Explanation, Scalar, Scale
from policies.headroom import ServiceLoad
from policies.indicators import LeadingAsk, leading_ask
from policies.loadsignals import Verdicts
from policies.model import CrowdSpec, ServiceSpec, format_duration
from policies.placement import NVLINK_DOMAIN_LABEL, give_back
from policies.pool_rules import gave_back_key
from policies.rules import Round, leading_inputs
from policies.slo import ExceedanceWindow, SloState
from policies.snapshot import Workload
from policies.windows import LatencyWindow

__all__ = [
    "RULE",
    "Recommendations",
    "scale_down",
    "scale_down_quiet_read",
    "scale_down_quiet_static",
    "scale_down_quiet_until",
    "scale_down_reads_window",
    "step_limit",
]

RULE = "slo-scale-down"


class Recommendations:
    """One service's replica recommendations: the highest over a sliding window, when they
    started, and when the service was last scaled down; with ``scale.down.crowd``, also the
    levels it needed over the crowd memory (module docstring, "Crowds")."""

    __slots__ = (
        "_crowds",
        "_last",
        "_minutes",
        "_noted_since",
        "_old",
        "_queue",
        "_recent",
        "last_down",
        "started",
    )

    def __init__(self) -> None:
        #: (time, replicas), replicas strictly decreasing from the front: the front is the
        #: highest still in the window. With a crowd spec, only the recommendations of levels
        #: needed before (a crowd's are in ``_recent`` alone).
        self._queue: deque[tuple[float, int]] = deque()
        #: With a crowd spec: every recommendation, the same way, over ``crowd.after``; and
        #: those of levels not needed before (a crowd's), over the window.
        self._recent: deque[tuple[float, int]] = deque()
        self._crowds: deque[tuple[float, int]] = deque()
        #: With a crowd spec: (minute, highest) of the minutes not yet a window old, oldest
        #: first, and of those older (up to ``crowd.memory``) strictly decreasing from the
        #: front, so the front is the highest level needed before the window.
        self._minutes: deque[tuple[int, int]] = deque()
        self._old: deque[tuple[int, int]] = deque()
        #: When the levels began to be kept (a reload may turn the crowd spec on later).
        self._noted_since: float | None = None
        self._last: float | None = None
        self.started: float | None = None
        self.last_down: float | None = None

    def add(
        self, now: float, replicas: int, *, window_s: float, crowd: CrowdSpec | None = None
    ) -> None:
        """Record the recommendation of the tick at ``now``. After a gap longer than the window
        (no evaluation, the kill switch on) the window starts again from here."""
        if self._last is None or now - self._last > window_s:
            self.started = now
        self._last = now
        if crowd is None:
            if self._noted_since is not None:
                self._forget_levels()
            _push(self._queue, now, replicas)
            return
        if self._noted_since is None:
            self._noted_since = now
        self._note(now, replicas, window_s, crowd.memory)
        _push(self._recent, now, replicas)
        if self._needed_before(now, replicas, window_s):
            _push(self._queue, now, replicas)
        else:
            _push(self._crowds, now, replicas)

    def _note(self, now: float, replicas: int, window_s: float, memory_s: float) -> None:
        """``replicas`` recommended in the minute of ``now``; minutes a window old move to the
        levels needed before, and those older than ``memory_s`` are forgotten."""
        minute = math.floor(now / 60.0)
        minutes = self._minutes
        if minutes and minutes[-1][0] == minute:
            if replicas > minutes[-1][1]:
                minutes[-1] = (minute, replicas)
        else:
            minutes.append((minute, replicas))
        old = self._old
        while minutes and (minutes[0][0] + 1) * 60.0 <= now - window_s:
            m, top = minutes.popleft()
            while old and old[-1][1] <= top:
                old.pop()
            old.append((m, top))
        while old and (old[0][0] + 1) * 60.0 < now - memory_s:
            old.popleft()

    def _needed_before(self, now: float, replicas: int, window_s: float) -> bool:
        """Whether ``replicas`` is a level needed before this window (or too little is known
        to call it new: less than two windows of recommendations, or of levels kept)."""
        if self.started is None or self._noted_since is None:
            return True
        if now - max(self.started, self._noted_since) < 2 * window_s:
            return True
        return bool(self._old) and self._old[0][1] >= replicas

    def _forget_levels(self) -> None:
        """The crowd spec is gone (a reload): a crowd's recommendations count in the window
        again, as every one does without it."""
        merged = sorted((*self._queue, *self._crowds))
        self._queue.clear()
        for at, replicas in merged:
            _push(self._queue, at, replicas)
        for q in (self._recent, self._crowds, self._minutes, self._old):
            q.clear()
        self._noted_since = None

    def hold(self, until: float, *, window_s: float, crowd: CrowdSpec | None = None) -> None:
        """The latest recommendation was made again at every tick up to ``until``, none of them
        more than the window apart (what :meth:`add` would have recorded tick by tick): an
        engine that skipped a service's quiet ticks catches up in one call (to the minute:
        the levels needed before are kept per minute)."""
        if crowd is None:
            queue = self._queue
            if queue:
                queue[-1] = (until, queue[-1][1])
                self._last = until
            return
        if not self._recent or self._last is None:
            return
        replicas = self._recent[-1][1]
        at = (math.floor(self._last / 60.0) + 1) * 60.0
        while at < until:  # every skipped minute held the level
            self._note(at, replicas, window_s, crowd.memory)
            at += 60.0
        self._last = until  # ticks all along: no gap
        self.add(until, replicas, window_s=window_s, crowd=crowd)

    def highest(self, now: float, window_s: float, crowd: CrowdSpec | None = None) -> int | None:
        """The highest recommendation made within ``window_s`` before ``now``; with ``crowd``,
        of the levels needed before, and of any level within ``crowd.after``."""
        before = self.needed(now, window_s)
        if crowd is None:
            return before
        recent = _front(self._recent, now - crowd.after)
        if recent is None or before is None:
            return before if recent is None else recent
        return max(before, recent)

    def needed(self, now: float, window_s: float) -> int | None:
        """The highest recommendation within ``window_s`` before ``now`` of a level the service
        needed before (every one, without a crowd spec)."""
        return _front(self._queue, now - window_s)

    def before(self) -> int | None:
        """The highest level needed over the crowd memory before the window (as of the last
        recommendation; ``None``: none kept, or no crowd spec)."""
        return self._old[0][1] if self._old else None

    def crowd(self, now: float, window_s: float) -> int | None:
        """The highest recommendation within ``window_s`` before ``now`` of a level the service
        had not needed before (a crowd's; ``None`` without one or without a crowd spec)."""
        return _front(self._crowds, now - window_s)

    def covers(self, now: float, window_s: float) -> bool:
        """Whether recommendations were made over the whole window before ``now``."""
        return self.started is not None and now - self.started >= window_s

    def reset(self) -> None:
        """Forget every recommendation (the service has no workload to recommend for)."""
        for q in (self._queue, self._recent, self._crowds, self._minutes, self._old):
            q.clear()
        self.started = self._last = self._noted_since = None


def _front(queue: deque[tuple[float, int]], since: float) -> int | None:
    """The highest recommendation of a monotonic deque made at or after ``since`` (what is
    older is dropped: the window only moves forward)."""
    while queue and queue[0][0] < since:
        queue.popleft()
    return queue[0][1] if queue else None


def _push(queue: deque[tuple[float, int]], now: float, replicas: int) -> None:
    """Append to a monotonic deque whose front is the highest: later, higher-or-equal
    recommendations make earlier ones irrelevant."""
    while queue and queue[-1][1] <= replicas:
        queue.pop()
    queue.append((now, replicas))


def step_limit(max_step: int | float, replicas: int) -> int:
    """Most replicas one decision removes: ``max_step`` itself when a number, else that
    fraction of ``replicas`` rounded down, and at least one."""
    if isinstance(max_step, int):
        return max_step
    return max(1, math.floor(replicas * max_step))


def _show_step(max_step: int | float) -> str | int:
    return max_step if isinstance(max_step, int) else f"{max_step:.0%}"


def _reads_percentile(slo: SloState, replicas: int, min_replicas: int) -> bool:
    """Whether a tick may recommend fewer than ``replicas``: ``ok`` with a verdict below the
    recovery threshold, above ``replicas.min``. Any other tick recommends the replicas."""
    return slo.state == "ok" and slo.last_level in ("below", "between") and replicas > min_replicas


def scale_down_quiet_until(
    spec: ServiceSpec, slo: SloState, workload: Workload | None, window: LatencyWindow, now: float
) -> float:
    """Until when :func:`scale_down` can only hold, recommending the current replicas, while
    ``slo``, the window's contents and the snapshot (``workload``) stay as they are: for ever
    (``math.inf``) without ``scale.down`` or a workload, or when this tick's recommendation
    (:func:`_recommend`, the rule's own) is the current replicas, so
    :meth:`Recommendations.hold` may record the skipped ticks later; else ``-math.inf``. With a
    leading indicator the request rate moves with the clock, so only a tick that reads no
    percentile holds for ever. The rule asks the same questions, so the engine's incremental
    schedule (:mod:`policies.scheduling`) cannot drift from it. In two parts, so the schedule
    works the first out once per spec: :func:`scale_down_quiet_static` and
    :func:`scale_down_quiet_read`."""
    if workload is None:
        return math.inf
    static = scale_down_quiet_static(spec)
    if static is not None:
        return static
    return scale_down_quiet_read(spec, slo, workload, window, now)


def scale_down_quiet_static(spec: ServiceSpec) -> float | None:
    """:func:`scale_down_quiet_until`'s answer for a service with a workload where ``spec``
    alone decides it (``math.inf`` without ``scale.down``, ``-math.inf`` with signals), or
    ``None`` where the state must be read (:func:`scale_down_quiet_read`)."""
    scale, bounds = spec.scale, spec.replicas
    if scale is None or scale.down is None or bounds is None:
        return math.inf
    if spec.has_signals():
        return -math.inf  # load gauges and further objectives move without the window
    return None


def scale_down_floor(spec: ServiceSpec) -> float | None:
    """The latency (ms) at or above which the window's percentile makes the scale-down rule
    hold whatever else it reads (it recommends fewer replicas only below ``scale.down.below``
    of the objective), for a rule that reads nothing but the percentile (no leading
    indicator); ``None`` for any other. The SLO counters count the requests above it
    (:meth:`~policies.slo.ExceedanceWindow.above_floor`), so a hold can be told from counts."""
    scale = spec.scale
    if scale is None or scale.down is None or scale.leading is not None:
        return None
    return scale.down.below * spec.slo.objective_ms


def scale_down_quiet_read(
    spec: ServiceSpec,
    slo: SloState,
    workload: Workload,
    window: LatencyWindow,
    now: float,
    counts: ExceedanceWindow | None = None,
) -> float:
    """:func:`scale_down_quiet_until` for a service with a workload whose
    :func:`scale_down_quiet_static` is ``None``: read from its SLO state, replicas and window;
    from ``counts`` first, when they count above :func:`scale_down_floor` and show the
    percentile at or above it (then no percentile is read)."""
    scale = spec.scale
    assert scale is not None
    current = workload.replicas
    if not scale_down_reads_window(spec, slo, workload):
        return math.inf
    if scale.leading is not None:
        return -math.inf
    if counts is not None and counts.above_floor(now, spec.slo.percentile / 100.0):
        return math.inf
    recommended, p, _ = _recommend(spec, slo, window, now, current, samples=0, load=None)
    return math.inf if p is None or recommended >= current else -math.inf


def scale_down_reads_window(spec: ServiceSpec, slo: SloState, workload: Workload) -> bool:
    """Whether :func:`scale_down_quiet_read` reads the window for ``slo`` and ``workload`` (a
    spec whose :func:`scale_down_quiet_static` is ``None``): otherwise its answer, for ever,
    stands whatever the window holds."""
    bounds = spec.replicas
    assert bounds is not None
    return _reads_percentile(slo, workload.replicas, bounds.min)


def _recommend(
    spec: ServiceSpec,
    slo: SloState,
    window: LatencyWindow,
    now: float,
    current: int,
    *,
    samples: int,
    load: ServiceLoad | None,
) -> tuple[int, float | None, LeadingAsk | None]:
    """This tick's recommendation for a service at ``current`` replicas (``spec`` has
    ``scale.down`` and ``replicas``), with the percentile and the leading indicator's ask it
    read (``None`` when it read none)."""
    scale, bounds = spec.scale, spec.replicas
    assert scale is not None
    assert scale.down is not None
    assert bounds is not None
    objective = spec.slo.objective_ms
    p: float | None = None
    recommended = current
    lead: LeadingAsk | None = None
    # At (or below) replicas.min nothing lower can be recommended: no percentile to read.
    if _reads_percentile(slo, current, bounds.min):
        p = window.quantile(now, spec.slo.percentile / 100.0)
        lead = leading_ask(spec, samples, window, now, margin=scale.tolerance, load=load, down=True)
        if p is not None and lead is not None and p < spec.slo.recover_below * objective:
            recommended = min(current, max(bounds.min, lead.replicas))  # what the rate needs
        elif p is not None and p < scale.down.below * objective:
            desired = max(bounds.min, math.ceil(max(current, 1) * p / objective))
            recommended = min(current, desired)
    return recommended, p, lead


def _agree(
    spec: ServiceSpec,
    slo: SloState,
    window: LatencyWindow,
    now: float,
    current: int,
    seen: Verdicts,
    *,
    samples: int,
    load: ServiceLoad | None,
) -> tuple[int, float | None, LeadingAsk | None, list[tuple[str, int]]]:
    """The recommendation of a service with signals (:mod:`policies.loadsignals`): the most
    that any vote asks for, where every objective (unless the latency is work-bound) and every
    configured load signal votes, and a signal without a fresh reading or an objective not well
    within itself votes for the current replicas (the HPA's rule for several metrics:
    ``horizontal.go``, ``computeReplicasForMetrics``). Returns the recommendation, the primary
    percentile, the request rate's ask and each vote as ``(name, replicas)``."""
    scale, bounds = spec.scale, spec.replicas
    assert scale is not None
    assert bounds is not None
    votes: list[tuple[str, int]] = []
    p: float | None = None
    lead: LeadingAsk | None = None
    if current <= bounds.min:
        return current, None, None, []
    if not seen.work_bound:
        latency, p, lead = _recommend(spec, slo, window, now, current, samples=samples, load=load)
        if p is None or seen.held:
            latency = current  # no verdict, or a further objective not well within itself
        votes.append((f"p{spec.slo.percentile:g}", latency))
    elif scale.leading is not None:
        lead = leading_ask(spec, samples, window, now, margin=scale.tolerance, load=load, down=True)
        votes.append(("request_rate", current if lead is None else lead.replicas))
    if seen.work_bound and scale.leading is None and not seen.asks:
        return current, p, lead, []  # nothing left to size it by: hold
    for a in seen.asks:
        votes.append((a.signal, a.replicas))
    for name in seen.missing:
        votes.append((name, current))
    recommended = min(current, max(bounds.min, max(n for _, n in votes)))
    return recommended, p, lead, votes


def _evidence(seen: Verdicts, rnd: Round, key: str) -> str:
    sig = rnd.signals.get(key)
    return sig.work_bound.evidence if sig is not None and seen.work_bound else ""


def scale_down(
    rnd: Round,
    key: str,
    spec: ServiceSpec,
    slo: SloState,
    window: LatencyWindow,
    history: Recommendations,
    *,
    samples: int,
    load: ServiceLoad | None = None,
) -> bool:
    """Record this tick's recommendation for ``key`` and scale it down when the stabilized
    recommendation, bounded, is below its replicas (the leading indicator's learned capacity
    and headroom from ``load``). See the module docstring.

    ``True`` when the tick only held (nothing to recommend, or the current replicas): until the
    SLO state, the windowed percentile or the snapshot change, later ticks would do the same,
    which lets the engine skip them (:meth:`Recommendations.hold`)."""
    scale, bounds = spec.scale, spec.replicas
    if scale is None or scale.down is None or bounds is None:
        return True
    down = scale.down
    workload = rnd.inv.service_workload.get(key)
    if workload is None:
        history.reset()
        return True
    now, current = rnd.now, workload.replicas
    objective = spec.slo.objective_ms
    seen = rnd.verdicts(key, spec, current, margin=scale.tolerance)
    if seen is None:
        recommended, p, lead = _recommend(
            spec, slo, window, now, current, samples=samples, load=load
        )
        agreed: list[tuple[str, int]] = []
    else:
        recommended, p, lead, agreed = _agree(
            spec, slo, window, now, current, seen, samples=samples, load=load
        )
    history.add(now, recommended, window_s=down.stabilization, crowd=down.crowd)
    if recommended >= current or (p is None and not agreed):
        return True
    stab = down.stabilization
    if not history.covers(now, stab):
        return False
    if slo.since is not None and now - slo.since < spec.slo.recover_after:
        return False
    pspec = rnd.policy.spec
    service_cooldown = spec.cooldown if spec.cooldown is not None else pspec.cooldowns.service
    own_cooldown = down.cooldown if down.cooldown is not None else service_cooldown
    if not rnd.cooldowns.ready(key, now, service_cooldown):
        return False
    if history.last_down is not None and now - history.last_down < own_cooldown:
        return False
    if rnd.budgets.scale_steps.remaining(now) < 1:
        return False
    stabilized = history.highest(now, stab, down.crowd)
    if stabilized is None or stabilized >= current:
        return False
    step = step_limit(down.max_step, current)
    paced = target = max(stabilized, current - step, bounds.min)
    crowd, needed, crowd_gone = down.crowd, None, False
    if crowd is not None:
        needed = history.needed(now, stab)
        # replicas above every level needed before were a crowd's: they go back at once to
        # the highest level needed before; maxStep paces the levels below it
        known = max(history.before() or 0, needed or 0)
        crowd_gone = history.crowd(now, stab) is not None and current - step > known
        if crowd_gone:
            target = max(stabilized, known, bounds.min)
    if target >= current:
        return False
    ratio = (p or 0.0) / objective
    pct = f"p{spec.slo.percentile:g}_ms"
    span = format_duration(stab)
    alternatives: list[Alternative] = []
    if stabilized > recommended:
        alternatives.append(
            Alternative(
                f"scale to {recommended}",
                f"the highest recommendation over the last {span} was {stabilized}",
            )
        )
    if crowd is not None and crowd_gone:
        alternatives.append(
            Alternative(
                f"scale to {paced}",
                f"maxStep {_show_step(down.max_step)} paces the levels {key} needed within "
                f"crowd.memory {format_duration(crowd.memory)}, not a crowd's",
            )
        )
    if target > stabilized:
        why = (
            f"replicas.min is {bounds.min}"
            if target == bounds.min
            else f"maxStep {_show_step(down.max_step)} removes at most {step}"
        )
        alternatives.append(Alternative(f"scale to {stabilized}", why))
    inputs: dict[str, Scalar] = {
        pct: None if p is None else round(p, 2),
        "ratio": round(ratio, 3),
        "samples": samples,
        "replicas": current,
        "desired": recommended,
        "stabilized": stabilized,
        "ok_since": slo.since,
    }
    if crowd is not None:
        inputs["needed_before"] = needed
    thresholds: dict[str, Scalar] = {
        "objective_ms": objective,
        "below": f"{down.below:.0%}",
        "below_ms": round(down.below * objective, 2),
        "stabilization": span,
        "max_step": _show_step(down.max_step),
        "min_replicas": bounds.min,
        "cooldown": format_duration(own_cooldown),
        "recover_after": format_duration(spec.slo.recover_after),
    }
    why = (
        f"{key} well within its objective (P{spec.slo.percentile:g} {p or 0:.0f}ms < "
        f"{down.below:.0%} of {objective:g}ms): desired ceil({current} * {ratio:.2f}) "
        f"= {recommended}"
    )
    if seen is not None:
        votes = ", ".join(f"{name} {n}" for name, n in agreed)
        latency = (
            f"latency set by the work, not counted ({_evidence(seen, rnd, key)})"
            if seen.work_bound
            else f"P{spec.slo.percentile:g} {p or 0:.0f}ms"
        )
        why = (
            f"{key}: every signal agrees on fewer replicas ({votes}; {latency}): desired = the "
            f"most any asks = {recommended}"
        )
        for name, n in agreed:
            inputs[f"{name}_replicas"] = n
        inputs["work_bound"] = seen.work_bound
    elif lead is not None:
        leading_inputs(lead, inputs, thresholds)
        why = (
            f"{key} within its objective (P{spec.slo.percentile:g} {p:.0f}ms), request rate "
            f"{lead.rate:.1f}/s: desired ceil({lead.planned:.1f} * {1 + lead.margin:g} / "
            f"{lead.per_replica:.3g}) = {recommended}"
        )
    remove, which = _removal(rnd, workload, current - target)
    if remove:
        inputs["remove"] = ", ".join(remove)
    rnd.emit(
        Scale(
            now,
            workload.key,
            scale.kind,
            current,
            target,
            "inference",
            Explanation.of(
                RULE,
                f"{why}, highest over {span} = {stabilized}{_crowd_note(crowd, crowd_gone)}; "
                f"scale {current}→{target}; {which}",
                inputs=inputs,
                thresholds=thresholds,
                alternatives=tuple(alternatives),
            ),
            cause=key,
            dry_run=rnd.dry_run,
            remove=remove,
        )
    )
    history.last_down = now
    rnd.cooldowns.mark(key, now)
    rnd.cooldowns.mark(gave_back_key(spec.pool), now)
    return False


def _crowd_note(crowd: CrowdSpec | None, gone: bool) -> str:
    """How the stabilized count treated a crowd, for the reason (empty without one)."""
    if crowd is None or not gone:
        return ""
    return (
        f" (levels not needed within crowd.memory {format_duration(crowd.memory)} held only "
        f"crowd.after {format_duration(crowd.after)}: a crowd's replicas go at once)"
    )


def _removal(rnd: Round, workload: Workload, count: int) -> tuple[tuple[str, ...], str]:
    """The ``count`` pods a scale-down of ``workload`` removes, and why those (see the module
    docstring): none named for kinds whose controller cannot be told which."""
    if workload.kind == "StatefulSet":
        return (), "a StatefulSet removes its highest ordinals: it cannot be told which go"
    if workload.kind != "Deployment":
        return (), f"the {workload.kind}'s controller picks which replicas go"
    inv = rnd.inv
    mine = inv.pods_by_workload.get(workload.key, ())
    waiting = sorted((p.node is not None, p.key) for p in mine if p.phase == "Pending")
    chosen = [key for _, key in waiting[:count]]
    ours: dict[str, list[str]] = {}
    for p in mine:
        if p.node is not None and p.phase in ("Running", "Unknown"):
            ours.setdefault(p.node, []).append(p.key)
    others = {
        name: sum(
            1
            for p in inv.pods_by_node.get(name, ())
            if p.workload != workload.key and (p.gpus or p.mig)
        )
        for name in ours
    }
    domains = {
        n.name: n.labels[NVLINK_DOMAIN_LABEL]
        for n in inv.nodes.values()
        if NVLINK_DOMAIN_LABEL in n.labels
    }
    gpus = workload.gpus_per_replica
    chosen += give_back(
        ours, others, inv.node_free, count - len(chosen), gpus=gpus, domains=domains
    )
    gone = set(chosen)
    emptied = sorted(
        n for n, keys in ours.items() if not others[n] and all(k in gone for k in keys)
    )
    where = f"empties {', '.join(emptied)}" if emptied else "empties no node"
    return tuple(chosen), (
        f"removes {', '.join(chosen)} ({where}: nodes with the fewest other GPU pods first)"
    )
