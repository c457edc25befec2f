"""The decision engine: events in, windows updated; snapshot in, explained decisions out.

Design:

* ``observe(event)`` is the hot path. A latency event goes to its service's
  :class:`~policies.windows.LatencyWindow` (the quantile sketch) and
  :class:`~policies.slo.ExceedanceWindow` (threshold counters); a utilization event to its GPU's
  :class:`~policies.windows.UtilizationWindow`, its pool's window (node→pool from the last
  snapshot) and the MIG idle tracker. Memory is bounded by the policy's services and the
  cluster's GPUs, never by the event rate; events for services the policy does not name are
  counted and dropped. A GPU reading makes a window only for a node the last snapshot lists
  (before the first snapshot every node counts, so a restart's rewind refills the windows, and
  the first snapshot drops the nodes it does not list) and only up to
  :data:`MAX_DEVICES_PER_NODE` devices per node; any other reading is dropped and counted in
  :attr:`Engine.dropped` by reason (``unknown_node``, ``device_limit``). A node that joins
  after its readings began is read from the first snapshot that lists it.
* **Clock skew.** The engine has no clock, but it keeps the latest ``now`` it was given
  (``evaluate(now, …)`` or ``advance(now)``; it never goes back). An event stamped more than one
  resolution past that ``now`` (its window's interval: the SLO's ``resolution``, or a
  utilization window's slot) comes from a fast clock: it is counted in ``skewed`` and taken as
  if stamped ``now``. It is clamped rather than held, so memory stays bounded and its data still
  counts, in the interval where it most likely happened (on arrival). Never letting it advance a
  window's ring is the point: a window's head 300 s ahead would make every on-time event after
  it late, blinding that service's SLO. Before the first ``now`` nothing is known and no event
  is bounded; a caller with a wall clock calls ``advance`` before each batch so the bound is
  the clock, not the last tick.
* ``evaluate(now, snapshot)`` runs the rules in a fixed order, each in its own module: SLO ticks
  for every service from the O(1) counters (:mod:`policies.slo`); for each breaching service out
  of cooldown, the HPA-style ``desired = ceil(replicas * p / objective)`` (the sketch is merged
  only here and for scale-down), and the GPUs that needs freed by :func:`plan_capacity` (shrink,
  then evict); giving replicas back when a service is comfortably within its objective
  (:mod:`policies.scaledown`: HPA-style, stabilized, step-limited; its recommendations are
  recorded every tick, even while nothing may be decided); growing elastic training back into idle
  GPUs; MIG revert and conversion (:mod:`policies.mig`). Budgets and cooldowns
  (:mod:`policies.budgets`) are checked before each decision and spent right after, inside the
  engine, so no caller can exceed them. The budgets live in a :class:`~policies.budgets.Ledger`
  that the caller may share with its safety gate; outcomes come back through
  :meth:`Engine.not_done` and the decisions log through :meth:`Engine.record`, so the engine, the
  gate and every replica count one verdict per decision.
* The snapshot's indexes (:class:`~policies.inventory.Inventory`) are cached on the snapshot:
  hand the same object (or an equal one) again and nothing is rebuilt.
* **A tick costs what changed.** On a sparse stream most ticks change nothing, so ``evaluate`` ticks
  a service's SLO only when it is due: it received events since it was last ticked, an interval left
  (or entered) its window (:meth:`~policies.slo.ExceedanceWindow.steady_until`), or one of its SLO
  timers runs out (:func:`~policies.slo.steady_until`: breachAfter, recoverAfter, staleAfter); a
  min-heap holds the next of these per service, worked out at the tick after it was ticked and only
  if no event made it due again. A service's rules run when its SLO was ticked since its rules last
  ran (unless the step changed nothing and they would only hold: :func:`_holds_only`), or every tick
  while it is unsettled (breaching below ``replicas.max``, or a scale-down recommendation below its
  replicas, where cooldowns, budgets and the stabilization window decide); a settled service's
  skipped ticks would each only have recorded its current replicas as its recommendation, and
  :meth:`Recommendations.hold <policies.scaledown.Recommendations.hold>` records them in one call
  when it next runs. A new snapshot, a reload, or a gap between ticks longer than the shortest
  stabilization window ticks every service. The pool rules (training growth, MIG) are skipped while
  they provably decide nothing: they decided nothing last time, with the same snapshot, policy and
  busy pools, no outcome or log record came back, none of their timers ran out (growAfter, the
  pool's cooldown, a MIG node's hold; while a timer the engine does not follow may run, they run
  every tick) and, where MIG may convert, the whole-card pool's mean is not below ``convertBelow``.
  The decisions are those of ticking everything (``Engine(…, incremental=False)``, kept for the
  tests and benchmarks that check exactly that).
* ``reload(policy)`` refuses a policy with problems and keeps the old one; an accepted policy
  re-indexes the last snapshot at once (nodes join or leave pools before the next event) and
  keeps the windows and SLO state of services whose SLO settings did not change, what budgets
  spent, and cooldowns.
* Pure: no clock (``now`` is passed in), no I/O, deterministic (everything iterates in sorted
  order), so replay and ``policy test`` reuse it unchanged.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, cast

from ddsketch.store import CollapsingLowestDenseStore

from policies.budgets import BudgetState, Cooldowns, Ledger, LogRecord
from policies.decisions import Decision, Evict, MigConvert, MigRevert, Scale
from policies.inventory import Inventory, note_disrupted
from policies.mig import IdleTracker, MigFlights
from policies.model import Policy, ServiceSpec, format_loc
from policies.rules import Round, grow_training, respond_to_breach, run_mig, training_wants
from policies.scaledown import Recommendations, scale_down
from policies.slo import ExceedanceWindow, Level, SloState, State, steady_until, step
from policies.snapshot import Snapshot
from policies.windows import LatencyWindow, UtilizationWindow
from streams.events import Event, GpuUtilization, InferenceLatency

__all__ = ["Engine", "PoolStatus", "ReloadResult", "ServiceStatus"]

#: Utilization windows (per GPU, per pool) when the policy has no MIG section.
DEFAULT_UTIL_WINDOW_S = 300.0
#: Slots in a utilization window.
UTIL_SLOTS = 30
#: Utilization windows one node may have: the largest GPU nodes carry 16 GPUs (HGX A100
#: 16-GPU), each split into at most 7 MIG instances, and a GPU being converted reports as a
#: whole card and as instances: 16 + 16 x 7 = 128. Readings past it are dropped and counted.
MAX_DEVICES_PER_NODE: Final = 128
#: The engine's clock before any ``now`` was given: no event is bounded.
_NO_CLOCK: Final = math.inf
#: A service is ticked this much (relative to the time) before a computed deadline, so float
#: rounding never makes it late; ticking early only costs the tick.
_EARLY: Final = 1e-12


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


class _Service:
    __slots__ = (
        "down",
        "due",
        "exceed",
        "index",
        "interval",
        "key",
        "latency",
        "min_samples",
        "name",
        "namespace",
        "q",
        "ruled_at",
        "samples",
        "slo",
        "spec",
        "ticked_at",
        "wake",
    )

    def __init__(self, name: str, spec: ServiceSpec) -> None:
        #: Position in the engine's sorted order.
        self.index = 0
        #: Events arrived since the SLO was last ticked.
        self.due = True
        #: When the SLO must be ticked again without events (see the module docstring).
        self.wake = -math.inf
        #: When the SLO was last ticked.
        self.ticked_at = -math.inf
        #: Samples in the window when the SLO was last ticked.
        self.samples = 0
        #: When the rules last ran for the service.
        self.ruled_at: float | None = None
        self.name = name
        self.namespace = spec.namespace
        self.key = f"{spec.namespace}/{name}"
        self.spec = spec
        s = spec.slo
        self.q = s.percentile / 100.0
        self.min_samples = s.min_samples
        self.interval = s.resolution
        self.latency = LatencyWindow(window_s=s.window, interval_s=s.resolution)
        self.exceed = self._counters(spec)
        self.slo = SloState()
        self.down = self._recommendations(spec, None)

    @staticmethod
    def _recommendations(spec: ServiceSpec, kept: Recommendations | None) -> Recommendations | None:
        """Scale-down recommendations for a service that has ``scale.down`` (kept across a
        reload that keeps it), else none."""
        if spec.scale is None or spec.scale.down is None:
            return None
        return kept if kept is not None else Recommendations()

    @staticmethod
    def _counters(spec: ServiceSpec) -> ExceedanceWindow:
        s = spec.slo
        return ExceedanceWindow(
            window_s=s.window,
            interval_s=s.resolution,
            high=s.objective_ms,
            low=s.objective_ms * s.recover_below,
        )

    def respec(self, spec: ServiceSpec) -> None:
        """Adopt a reloaded spec, keeping whatever data the new SLO can still use."""
        old = self.spec.slo
        new = spec.slo
        if (old.window, old.resolution) != (new.window, new.resolution):
            self.latency = LatencyWindow(window_s=new.window, interval_s=new.resolution)
            self.exceed = self._counters(spec)
        elif (old.objective_ms, old.recover_below) != (new.objective_ms, new.recover_below):
            self.exceed = self._counters(spec)
        self.spec = spec
        self.down = self._recommendations(spec, self.down)
        self.q = new.percentile / 100.0
        self.min_samples = new.min_samples
        self.interval = new.resolution


def _at_max(key: str, spec: ServiceSpec, inv: Inventory) -> bool:
    """Whether a breaching service's response is settled: scaled by the percentile alone and
    already at ``replicas.max``, it decides nothing until its SLO or the snapshot change (both
    rule it again), whatever its cooldown."""
    scale, bounds = spec.scale, spec.replicas
    if scale is None or scale.leading is not None or bounds is None:
        return False
    workload = inv.service_workload.get(key)
    return workload is not None and workload.replicas >= bounds.max


def _holds_only(svc: _Service, inv: Inventory) -> bool:
    """Whether a settled service whose SLO step changed nothing would, ruled, only hold: no
    breach response (not breaching, no leading indicator) and no percentile to recommend by
    (no scale-down, no workload, or not ``ok`` below the recovery threshold above
    ``replicas.min``), so its recommendation stays its replicas and
    :meth:`Recommendations.hold <policies.scaledown.Recommendations.hold>` records it later."""
    spec, slo = svc.spec, svc.slo
    scale, bounds = spec.scale, spec.replicas
    if svc.ruled_at is None or slo.state == "breaching":
        return False
    if scale is None or scale.down is None or bounds is None:
        return scale is None or scale.leading is None
    if scale.leading is not None:
        return False
    workload = inv.service_workload.get(svc.key)
    return workload is None or not (
        slo.state == "ok"
        and slo.last_level in ("below", "between")
        and workload.replicas > bounds.min
    )


class _Device:
    """What one GPU (or MIG instance) reading updates: its window, its pool's window (from the
    last snapshot), and whether (and as which GPU) the idle tracker follows it."""

    __slots__ = ("gpu", "node", "pool", "whole", "window")

    def __init__(
        self,
        window: UtilizationWindow,
        pool: UtilizationWindow | None,
        node: str,
        gpu: str,
        whole: bool,
    ) -> None:
        self.window, self.pool, self.node, self.gpu, self.whole = window, pool, node, gpu, whole


class Engine:
    """Decides; never acts. See the module docstring."""

    def __init__(
        self, policy: Policy, *, ledger: Ledger | None = None, incremental: bool = True
    ) -> None:
        problems = policy.problems()
        if problems:
            raise ValueError("; ".join(f"{format_loc(p.loc)}: {p.message}" for p in problems))
        self._policy = policy
        self._services: dict[str, _Service] = {}
        self._by_name: dict[str, _Service] = {}
        self._ordered: list[_Service] = []
        #: (node, gpu[, mig instance]) as the event spells it -> what a reading updates; rebuilt
        #: lazily whenever the windows or the node -> pool map change.
        self._devices: dict[tuple[str, int | str, int | None] | tuple[str, int | str], _Device] = {}
        self._ledger = ledger if ledger is not None else Ledger(policy.spec.budgets)
        self._budgets = self._ledger.budgets
        self._cooldowns = Cooldowns()
        self._flights = MigFlights()
        self._free_since: dict[str, float] = {}
        self._held: dict[str, tuple[float, str]] = {}
        #: training workload -> (until, why): its shrink failed, so it is not shrunk again
        #: before then (another try would fail the same way); its pods may still be evicted
        self._resize_held: dict[str, tuple[float, str]] = {}
        #: workload -> when Ebbtide last evicted from or shrank it (its replacements are no demand)
        self._disrupted: dict[str, tuple[float, ...]] = {}
        #: ``_disrupted`` as the cached inventory was built with it.
        self._indexed_disrupted: dict[str, tuple[float, ...]] = {}
        self._demand_since: list[float | None] = [None]
        self._gpu_windows: dict[str, UtilizationWindow] = {}
        #: Windows in ``_gpu_windows`` per node (bounded by MAX_DEVICES_PER_NODE).
        self._node_devices: dict[str, int] = {}
        #: When each node's windows were last swept for devices with no live reading.
        self._reclaimed: dict[str, float] = {}
        self._pool_windows: dict[str, UtilizationWindow] = {}
        self._node_pool: dict[str, str | None] = {}
        self._idle = IdleTracker(100.0)
        self._util_window_s = 0.0
        self._util_interval = 0.0
        self._clock: float = _NO_CLOCK
        self._inventory: Inventory | None = None
        self._inventory_for: tuple[Snapshot, Policy] | None = None
        self.observed = 0
        self.late = 0
        self.unknown = 0
        #: Latency events of a metric the service's objective is not on (``ttft`` for an
        #: ``e2e`` objective, say): not counted in its window.
        self.other_metric = 0
        #: Events stamped more than one resolution past the engine's clock (taken at the clock).
        self.skewed = 0
        #: GPU readings dropped, by reason: ``unknown_node`` (a node the last snapshot does not
        #: list), ``device_limit`` (past MAX_DEVICES_PER_NODE devices on one node).
        self.dropped: dict[str, int] = {}
        #: Services whose latency histograms end below the objective -> that last bound: their
        #: overflow counts as over the objective, so the objective cannot be judged.
        self.unresolved: dict[str, float] = {}
        self._incremental = incremental
        #: Services due for an SLO tick (events arrived), and (wake, index) deadlines.
        self._due: list[_Service] = []
        self._wakes: list[tuple[float, int]] = []
        #: The services ticked at the last evaluation: their wake time is worked out at the next
        #: one, and only when no event made them due again (on a busy stream, never).
        self._settling: list[_Service] = []
        #: Indexes of services whose rules run at the next round: ticked since their rules last
        #: ran, or unsettled.
        self._rules: set[int] = set()
        self._unsettled: set[int] = set()
        #: key -> pool of the services breaching or recovering.
        self._busy: dict[str, str] = {}
        #: What the last tick saw; a change ticks every service.
        self._seen: tuple[Inventory, Policy] | None = None
        #: The services whose SLO state the last evaluation changed.
        self._changed: list[_Service] = []
        #: ``now`` of the last round that ran the rules.
        self._last_round: float | None = None
        #: The shortest scale-down stabilization window: a longer gap between rounds ticks all.
        self._gap_s = math.inf
        #: What the pool rules last saw when they decided nothing (else ``None``: run them),
        #: and until when they would go on so (see :meth:`_pools_steady_until`).
        self._pools_seen: tuple[Inventory, Policy, set[str]] | None = None
        self._pools_wake = -math.inf
        #: Whether whole-card demand was unmet then (with the same snapshot: MIG converts
        #: nothing, so the pool's mean need not be read).
        self._pools_unmet = False
        #: Whether the whole-card pool's mean was at or above ``convertBelow`` (or unknown),
        #: for (events taken, the window's slot): neither changed, nor did the mean.
        self._mean_for = (-1, 0)
        self._mean_high = False
        #: The latest hold on a MIG node after a failed flow.
        self._mig_held_until = -math.inf
        #: After :meth:`idle` found a quiet tick: its snapshot, until when nothing the engine
        #: follows can wake (a service's wake time, the pool rules' timers) and whether the
        #: whole-card pool's mean is read; ``None`` once anything else may have changed.
        self._quiet: tuple[Snapshot, float, bool] | None = None
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
        self._quiet = None
        spec = policy.spec
        services: dict[str, _Service] = {}
        for name in sorted(spec.services):
            svc_spec = spec.services[name]
            key = f"{svc_spec.namespace}/{name}"
            existing = self._services.get(key)
            if existing is not None:
                existing.respec(svc_spec)
                services[key] = existing
            else:
                services[key] = _Service(name, svc_spec)
        self._services = services
        self.unresolved = {}  # said afresh under the new objectives, by the next histogram
        self._by_name = {svc.name: svc for svc in services.values()}
        self._ordered = [services[k] for k in sorted(services)]
        for i, svc in enumerate(self._ordered):
            svc.index = i
        self._seen = None  # every service is ticked at the next evaluation
        self._pools_seen = None
        self._mean_for = (-1, 0)
        self._busy = {}
        self._gap_s = min(
            (
                s.scale.down.stabilization
                for s in spec.services.values()
                if s.scale is not None and s.scale.down is not None
            ),
            default=math.inf,
        )
        self._devices = {}
        self._ledger.reconfigure(spec.budgets)
        keep = set(services) | {f"pool:{p}" for p in spec.pools}
        self._cooldowns.forget(keep)
        mig = spec.mig
        util_window = mig.convert_after if mig is not None else DEFAULT_UTIL_WINDOW_S
        if util_window != self._util_window_s:
            self._util_window_s = util_window
            self._util_interval = util_window / UTIL_SLOTS
            self._gpu_windows = {}
            self._node_devices = {}
            self._reclaimed = {}
            self._pool_windows = {}
        for pool in spec.pools:
            self._pool_windows.setdefault(pool, self._util_window())
        for pool in [p for p in self._pool_windows if p not in spec.pools]:
            del self._pool_windows[pool]
        threshold = (mig.node_idle_below * 100.0) if mig is not None else 0.0
        if threshold != self._idle.threshold_pct:
            self._idle = IdleTracker(threshold)
        self._policy = policy
        last = self._inventory_for
        self._inventory_for = None
        if last is not None:
            # Re-index the last snapshot now: the node -> pool map must name only this policy's
            # pools before the next event (a removed pool's window is gone: KeyError, and the
            # consumer would retry the batch, counting its first events twice).
            self._index(last[0])

    def _util_window(self) -> UtilizationWindow:
        return UtilizationWindow(
            window_s=self._util_window_s, interval_s=self._util_window_s / UTIL_SLOTS
        )

    # -- events ------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """The caller's clock reads ``now``: no event may move a window past ``now`` plus one
        resolution from here on (see the module docstring). An older ``now`` changes nothing."""
        if self._clock == _NO_CLOCK or now > self._clock:
            self._clock = now

    def observe(self, event: Event) -> bool:
        """Feed one event; ``False`` when it was late or names no known service."""
        if type(event) is GpuUtilization:
            ev = event
            dev = self._devices.get(
                (ev.node, ev.gpu) if ev.mig_profile is None else (ev.node, ev.gpu, ev.mig_instance)
            )
            if dev is None:
                dev = self._device(ev)
                if dev is None:
                    return False
            ts = cast(float, ev.ts)
            if ts > self._clock + self._util_interval:
                self.skewed += 1
                ts = self._clock
            util = ev.util_pct
            if not dev.window.add(ts, util):
                self.late += 1
                return False
            if dev.whole:
                self._idle.add(dev.node, dev.gpu, ts, util)
            if dev.pool is not None:
                dev.pool.add(ts, util)
            self.observed += 1
            return True
        return self._observe_latency(cast(InferenceLatency, event))

    def observe_many(self, events: Iterable[Event]) -> int:
        """Feed events in order, as :meth:`observe` one by one would; returns how many were
        taken (neither late nor for an unknown service)."""
        observe = self.observe
        taken = 0
        for event in events:
            if observe(event):
                taken += 1
        return taken

    def _observe_latency(self, event: InferenceLatency) -> bool:
        svc = self._by_name.get(event.service)
        if svc is None or svc.namespace != event.namespace:
            self.unknown += 1
            return False
        if event.objective != svc.spec.slo.metric:
            self.other_metric += 1
            return False
        ts = cast(float, event.ts)
        if ts > self._clock + svc.interval:
            self.skewed += 1
            ts = self._clock
        value = event.latency_ms
        if value is not None:
            if not svc.latency.add(ts, value):
                self.late += 1
                return False
            svc.exceed.add(ts, value)
        elif event.samples_ms is not None:
            if not svc.latency.add_many(ts, event.samples_ms):
                self.late += 1
                return False
            svc.exceed.add_many(ts, event.samples_ms)
        elif event.histogram is not None:
            h = event.histogram
            if not svc.latency.add_histogram(ts, h.bounds_ms, h.counts):
                self.late += 1
                return False
            svc.exceed.add_histogram(ts, h.bounds_ms, h.counts)
            if svc.exceed.unresolved is not None and svc.key not in self.unresolved:
                self.unresolved[svc.key] = svc.exceed.unresolved
        if not svc.due:
            svc.due = True
            self._due.append(svc)
        self.observed += 1
        return True

    def _device(self, ev: GpuUtilization) -> _Device | None:
        """Resolve (and cache) what a reading of this GPU or MIG instance updates; ``None``
        when the reading is dropped (:meth:`_window`)."""
        gpu = str(ev.gpu)
        whole = ev.mig_profile is None
        key = f"{ev.node}/{gpu}" if whole else f"{ev.node}/{gpu}/{ev.mig_instance}"
        window = self._window(ev.node, key, 1, at=ev.time)
        if window is None:
            return None
        pool = self._node_pool.get(ev.node)
        dev = _Device(
            window, self._pool_windows[pool] if pool is not None else None, ev.node, gpu, whole
        )
        self._devices[(ev.node, ev.gpu) if whole else (ev.node, ev.gpu, ev.mig_instance)] = dev
        return dev

    def _window(self, node: str, key: str, readings: int, *, at: float) -> UtilizationWindow | None:
        """Device ``key``'s window, made at its first reading (at ``at``); ``None`` for a node
        the last snapshot does not list or one with :data:`MAX_DEVICES_PER_NODE` windows with
        live readings already, the ``readings`` counted in :attr:`dropped` (module docstring)."""
        window = self._gpu_windows.get(key)
        if window is not None:
            return window
        inv = self._inventory
        devices = self._node_devices.get(node, 0)
        if inv is not None and node not in inv.nodes:
            reason = "unknown_node"
        elif devices >= MAX_DEVICES_PER_NODE and self._reclaim(node, at) >= MAX_DEVICES_PER_NODE:
            reason = "device_limit"
        else:
            self._node_devices[node] = self._node_devices.get(node, 0) + 1
            window = self._gpu_windows[key] = self._util_window()
            return window
        self.dropped[reason] = self.dropped.get(reason, 0) + readings
        return None

    def _reclaim(self, node: str, at: float) -> int:
        """Forget ``node``'s windows with no reading left in the window at ``at`` (the devices
        of a MIG layout the node no longer has: every conversion names new instances); how many
        it keeps. Once an interval at most per node, so a node past the limit costs one scan."""
        if at - self._reclaimed.get(node, -math.inf) < self._util_interval:
            return self._node_devices[node]
        self._reclaimed[node] = at
        prefix = f"{node}/"
        stale = [
            k for k, w in self._gpu_windows.items() if k.startswith(prefix) and w.mean(at) is None
        ]
        for k in stale:
            del self._gpu_windows[k]
        if stale:
            self._devices = {}  # cached devices may hold a forgotten window
        kept = self._node_devices[node] = self._node_devices[node] - len(stale)
        return kept

    # -- decisions ---------------------------------------------------------------------------

    def _index(self, snapshot: Snapshot) -> Inventory:
        cached = self._inventory_for
        if cached is not None and cached[1] is self._policy and self._inventory is not None:
            if cached[0] is snapshot:
                return self._inventory
            if cached[0] == snapshot and self._disrupted == self._indexed_disrupted:
                # rebuilt unchanged (and so is what Ebbtide disrupted): keep the indexes
                self._inventory_for = (snapshot, self._policy)
                return self._inventory
        known = {p.workload for p in snapshot.pods} | {w.key for w in snapshot.workloads}
        for gone_wl in [k for k in self._disrupted if k not in known]:
            del self._disrupted[gone_wl]
        inv = Inventory(snapshot, self._policy, disrupted=self._disrupted)
        self._indexed_disrupted = dict(self._disrupted)
        self._inventory, self._inventory_for = inv, (snapshot, self._policy)
        self._node_pool = inv.node_pool
        self._devices = {}
        self._idle.forget(inv.nodes)
        gone = [k for k in self._gpu_windows if k.split("/", 1)[0] not in inv.nodes]
        for k in gone:
            del self._gpu_windows[k]
        for node in [n for n in self._node_devices if n not in inv.nodes]:
            del self._node_devices[node]
            self._reclaimed.pop(node, None)
        return inv

    def evaluate(self, now: float, snapshot: Snapshot) -> list[Decision]:
        """Tick the SLOs due (every SLO, as far as anyone can tell; see the module docstring)
        and return this round's decisions, in the order they were taken."""
        self.advance(now)
        self._quiet = None
        inv = self._index(snapshot)
        due = self._slo_due(now, inv)
        changed = self._changed = []
        full = not self._incremental or due is self._ordered
        for svc in due:
            level, n = svc.exceed.level(now, svc.q, svc.min_samples)
            before = svc.slo
            slo = svc.slo = step(before, level, now, svc.spec.slo)
            svc.samples = n
            svc.due = False
            if slo.state == "breaching" or slo.state == "recovering":
                self._busy[svc.key] = svc.spec.pool
            else:
                self._busy.pop(svc.key, None)
            svc.ticked_at = now
            if slo is not before or full:
                changed.append(svc)
                self._rules.add(svc.index)
            elif svc.index not in self._unsettled and not _holds_only(svc, inv):
                self._rules.add(svc.index)
        self._settling = due
        spec = self._policy.spec
        if spec.kill_switch:
            return []
        ruled = [self._ordered[i] for i in sorted(self._rules | self._unsettled)]
        self._rules = set()
        last_round, self._last_round = self._last_round, now
        busy_pools = set(self._busy.values())
        seen = (inv, self._policy, busy_pools)
        if not ruled and self._pools_quiet(now, seen):
            return []  # a quiet tick: every rule would decide nothing and change nothing
        self._held = {pod: hold for pod, hold in self._held.items() if hold[0] > now}
        self._resize_held = {w: hold for w, hold in self._resize_held.items() if hold[0] > now}
        rnd = Round(
            now=now,
            policy=self._policy,
            inv=inv,
            budgets=self._budgets,
            cooldowns=self._cooldowns,
            held={pod: why for pod, (_, why) in self._held.items()},
            resize_held={w: why for w, (_, why) in self._resize_held.items()},
            disrupted=self._disrupted,
        )
        for svc in ruled:
            scale = svc.spec.scale
            if svc.slo.state == "breaching" or (scale is not None and scale.leading is not None):
                respond_to_breach(
                    rnd, svc.key, svc.spec, svc.slo, svc.latency, requests=svc.samples
                )
        for svc in ruled:
            down = svc.down
            settled = True
            if down is not None:
                if (
                    svc.ruled_at is not None
                    and last_round is not None
                    and svc.ruled_at < last_round
                ):
                    down.hold(last_round)  # the rounds that skipped it, each a hold
                settled = scale_down(
                    rnd, svc.key, svc.spec, svc.slo, svc.latency, down, samples=svc.samples
                )
            svc.ruled_at = now
            if settled and (svc.slo.state != "breaching" or _at_max(svc.key, svc.spec, inv)):
                self._unsettled.discard(svc.index)
            else:
                self._unsettled.add(svc.index)
        if rnd.decisions or not self._pools_quiet(now, seen):
            grow_training(rnd, busy_pools=busy_pools, free_since=self._free_since)
            if spec.mig is not None and spec.mig.enabled:
                pool_window = self._pool_windows[spec.mig.from_pool]
                run_mig(
                    rnd,
                    mig=spec.mig,
                    pool_window=pool_window,
                    idle=self._idle,
                    flights=self._flights,
                    demand_since=self._demand_since,
                    stale_s=self._stale_s,
                    breaching=bool(busy_pools),
                )
            self._pools_seen = None if rnd.decisions else seen
            self._pools_wake = self._pools_steady_until(now, inv, busy_pools)
        return rnd.decisions

    def idle(self, now: float, snapshot: Snapshot) -> bool:
        """Whether ``evaluate(now, snapshot)`` would be a quiet tick: the snapshot and policy
        of the last evaluation, the SLOs due (events for a service since, a wake time come)
        stepping to the same state with rules that would only hold (:func:`_holds_only`), no
        other service's rules to run and the pool rules quiet. If so, the tick is recorded as
        ``evaluate`` would record it (it returned no decision, changed no SLO state, and the
        due services were ticked) and the caller may skip the rest of its tick; if not,
        nothing changed and the caller evaluates. Always ``False`` when not incremental.

        A run of quiet ticks costs little: after one, the next is quiet as long as no event
        made a service due, no wake time or pool timer came and the pool's mean did not drop
        (anything else, an evaluation, a reload, feedback, drops what was known)."""
        seen, last = self._seen, self._last_round
        quiet = self._quiet
        if (
            quiet is not None
            and quiet[0] is snapshot
            and now < quiet[1]
            and not self._due
            and not self._settling
            and last is not None
            and now - last <= self._gap_s
        ):
            if quiet[2] and not self._mean_high_at(now):
                return False
            self._record_quiet(now)
            return True
        cached = self._inventory_for
        if (
            not self._incremental
            or seen is None
            or cached is None
            or cached[0] is not snapshot
            or cached[1] is not self._policy
            or seen[0] is not self._inventory
            or seen[1] is not self._policy
            or self._policy.spec.kill_switch
            or self._rules
            or self._unsettled
            or last is None
            or now - last > self._gap_s
        ):
            return False
        self._wake_due(now)
        due = self._due
        samples = self._steps_hold(now, due, seen[0])
        if samples is None or not self._pools_quiet(
            now, (seen[0], seen[1], set(self._busy.values()))
        ):
            return False
        self._record_quiet(now)
        if due:  # stepped as evaluate steps them: their state stays, their rules would hold
            for svc, n in zip(due, samples, strict=True):
                svc.samples = n
                svc.due = False
                svc.ticked_at = now
            self._settling = due
            self._due = []
            self._quiet = None  # their wake times are worked out at the next tick
            return True
        wakes = self._wakes
        mig = self._policy.spec.mig
        self._quiet = (
            snapshot,
            min(wakes[0][0], self._pools_wake) if wakes else self._pools_wake,
            mig is not None and mig.enabled and not self._busy and not self._pools_unmet,
        )
        return True

    def _record_quiet(self, now: float) -> None:
        """Record a tick at ``now`` as ``evaluate`` records one that decided nothing."""
        self.advance(now)
        self._changed = []
        self._last_round = now

    def _steps_hold(self, now: float, due: list[_Service], inv: Inventory) -> list[int] | None:
        """The samples in each of ``due``'s windows when stepping each SLO at ``now`` would
        leave its state the same object and its rules would only hold (:func:`_holds_only`),
        so ``evaluate`` would change nothing but when it was ticked; ``None`` otherwise.
        Reads only: :func:`~policies.slo.step` is pure."""
        samples = []
        for svc in due:
            level, n = svc.exceed.level(now, svc.q, svc.min_samples)
            if step(svc.slo, level, now, svc.spec.slo) is not svc.slo or not _holds_only(svc, inv):
                return None
            samples.append(n)
        return samples

    def _pools_quiet(self, now: float, seen: tuple[Inventory, Policy, set[str]]) -> bool:
        """Whether the pool rules (training growth, MIG) would decide nothing and change
        nothing at ``now``: they did not the last time, with the same snapshot, policy and busy
        pools, no outcome or log record came back since, none of their timers has run out, and
        the whole-card pool's utilization (read only while MIG may convert) is not below
        ``convertBelow``."""
        last = self._pools_seen
        if (
            not self._incremental
            or last is None
            or last[0] is not seen[0]
            or last[1] is not seen[1]
            or last[2] != seen[2]
            or now >= self._pools_wake
        ):
            return False
        mig = self._policy.spec.mig
        if mig is None or not mig.enabled or seen[2] or self._pools_unmet:
            return True
        return self._mean_high_at(now)

    def _mean_high_at(self, now: float) -> bool:
        """Whether the whole-card pool's mean is at or above ``convertBelow`` (or unknown) at
        ``now``: read again only when a reading came or the window moved a slot."""
        key = (self.observed, int(now // self._util_interval))  # what the mean depends on
        if key != self._mean_for:
            mig = self._policy.spec.mig
            assert mig is not None
            mean = self._pool_windows[mig.from_pool].mean(now)
            self._mean_for = key
            self._mean_high = mean is None or mean >= mig.convert_below * 100.0
        return self._mean_high

    def _pools_steady_until(self, now: float, inv: Inventory, busy_pools: set[str]) -> float:
        """Until when the pool rules, having just decided nothing, would go on deciding nothing
        with the same inputs: the first of training growth's timers (``growAfter`` from when a
        pool's GPUs went free, the pool's cooldown) and of a MIG node's hold to run out;
        ``-inf`` (every tick) while a timer the engine does not follow may run: the scale-step
        budget is spent (growth waits for it), a MIG flight is under way, whole-card demand
        (pending pods, elastic training below its maximum) has been unmet for ``revertAfter``
        while a MIG node could be reverted (the MIG budget and slots), or utilization is below
        ``convertBelow`` (nodes' idle times). Unmet demand converts nothing, so it also tells
        :meth:`_pools_quiet` not to read the pool's mean."""
        spec = self._policy.spec
        until = math.inf
        self._pools_unmet = False
        if spec.mig is not None and spec.mig.enabled:
            mig = spec.mig
            if self._flights.count({}):
                return -math.inf
            demand = inv.pending_whole_gpus + training_wants(inv, mig.from_pool)
            if demand > inv.free.get(mig.from_pool, 0):
                # No conversion while demand is unmet (the mean does not matter); a revert
                # needs a MIG node to revert and revertAfter of unmet demand.
                self._pools_unmet = True
                if any(n.is_mig for n in inv.pool_nodes.get(mig.to_pool, ())):
                    unmet_since = self._demand_since[0]
                    if unmet_since is None or now - unmet_since >= mig.revert_after:
                        return -math.inf  # the MIG budget and the slots may free up any time
                    until = unmet_since + mig.revert_after
            elif not busy_pools:
                mean = self._pool_windows[mig.from_pool].mean(now)
                if mean is not None and mean < mig.convert_below * 100.0:
                    return -math.inf
                until = self._pool_windows[mig.from_pool].steady_until(now)
            if self._mig_held_until > now:
                until = min(until, self._mig_held_until)
        if spec.training is not None:
            if self._budgets.scale_steps.remaining(now) < 1:
                return -math.inf
            grow_after = spec.training.elastic.grow_after
            cooldown = spec.cooldowns.training_grow
            for pool, since in self._free_since.items():
                if since + grow_after > now:
                    until = min(until, since + grow_after)
                left = self._cooldowns.remaining_s(f"pool:{pool}", now, cooldown)
                if left > 0:
                    until = min(until, now + left)
        return until - _EARLY * abs(until) if until < math.inf else until

    def _slo_due(self, now: float, inv: Inventory) -> list[_Service]:
        """The services whose SLO this tick must step (in no particular order: each steps
        alone, and their rules run in order): all of them after a new snapshot or policy, a
        long gap or when not incremental; else those with events since and those whose wake
        time has come."""
        seen = (inv, self._policy)
        last = self._last_round
        gap = last is not None and now - last > self._gap_s
        if (
            not self._incremental
            or gap
            or self._seen is None
            or self._seen[0] is not seen[0]
            or self._seen[1] is not seen[1]
        ):
            self._seen = seen
            self._due = []
            self._wakes = []
            self._settling = []
            self._rules = set(range(len(self._ordered)))
            self._unsettled = set()
            return self._ordered
        self._wake_due(now)
        due = self._due
        if due:
            self._due = []
        return due

    def _wake_due(self, now: float) -> None:
        """Add to ``_due`` the services whose wake time has come by ``now``, working out the
        wake of those ticked at the last evaluation first."""
        due = self._due
        wakes = self._wakes
        for svc in self._settling:
            if svc.due:
                continue  # events again: no need to know when it would have changed
            # no write since it was ticked: when its reads or its SLO timers change next
            wake = min(svc.exceed.steady_until(svc.ticked_at), steady_until(svc.slo, svc.spec.slo))
            svc.wake = wake = wake - _EARLY * abs(wake) if wake < math.inf else wake
            if wake <= now:
                svc.due = True
                due.append(svc)
            elif wake < math.inf:
                heapq.heappush(wakes, (wake, svc.index))
        self._settling = []
        ordered = self._ordered
        while wakes and wakes[0][0] <= now:
            wake, i = heapq.heappop(wakes)
            svc = ordered[i]
            if svc.wake == wake and not svc.due:
                svc.due = True
                due.append(svc)

    @property
    def ledger(self) -> Ledger:
        """The budgets' ledger (share it with the safety gate: one verdict per decision)."""
        return self._ledger

    def record(self, rec: LogRecord) -> None:
        """A decisions-log record, read back at start-up or from another replica live: an
        action that happened counts against its budget and the cooldowns it started (its
        service's and the service's pool's, or a grow's pool's) run from its time; one that
        did not gives both back; the workload an eviction or shrink took a pod from is marked,
        as when decided here. Reading a record twice changes nothing."""
        self._pools_seen = None  # the pool rules' budgets or cooldowns may have moved
        self._quiet = None
        if not self._ledger.record(rec):
            return
        done = self._ledger.verdict(rec.id) != "not_done"
        if rec.disrupts is not None and done:
            note_disrupted(self._disrupted, rec.disrupts, rec.at)  # replacements: no demand
        for key, _ in self._cooldowns_of(rec.cause, rec.pool):
            if done:
                self._cooldowns.mark(key, rec.at)
            else:
                self._cooldowns.retry(key, rec.at, not_before=rec.at)

    def _cooldowns_of(self, cause: str | None, pool: str | None) -> list[tuple[str, float]]:
        """The cooldowns an action started, with their length: a service's response starts
        the service's and its pool's (:func:`~policies.rules.respond_to_breach`), a training
        grow its pool's."""
        spec = self._policy.spec
        keys = []
        svc = None if cause is None else self._services.get(cause)
        if svc is not None:
            quiet = svc.spec.cooldown
            keys.append((svc.key, spec.cooldowns.service if quiet is None else quiet))
            pool = svc.spec.pool
        if pool is not None:
            keys.append((f"pool:{pool}", spec.cooldowns.training_grow))
        return keys

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
        self._pools_seen = None  # a budget unit, a cooldown or a MIG slot came back
        self._quiet = None
        self._ledger.settle(decision.id, action=decision.action, done=False, at=decision.at)
        retry = decision.at if retry_at is None else retry_at
        pool = decision.pool if isinstance(decision, Scale) else None
        for key, quiet in self._cooldowns_of(decision.cause, pool):
            not_before = min(retry, decision.at + quiet)
            self._cooldowns.retry(key, decision.at, not_before=not_before)
        if isinstance(decision, MigConvert | MigRevert):
            self._flights.drop(decision.node, hold_until=hold_until)
            if hold_until is not None:
                self._mig_held_until = max(self._mig_held_until, hold_until)
        if hold_until is not None and isinstance(decision, Evict):
            self._held[decision.pod] = (hold_until, reason)
        if (
            hold_until is not None
            and isinstance(decision, Scale)
            and decision.role == "training"
            and decision.to_replicas < decision.from_replicas
        ):
            self._resize_held[decision.workload] = (hold_until, reason)

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
        return [svc.key for svc in self._changed]

    def slo_state(self, service_key: str) -> SloState:
        """The SLO state of ``namespace/service``."""
        return self._services[service_key].slo

    def pool_status(self, now: float) -> list[PoolStatus]:
        """Per pool: nodes, whole GPUs, free GPUs (from the last snapshot) and utilization."""
        inv = self._inventory
        idle = self._idle.idle_gpus(now, self._util_window_s, self._stale_s) if inv else {}
        out = []
        for name in sorted(self._policy.spec.pools):
            pool = self._policy.spec.pools[name]
            window = self._pool_windows.get(name)
            out.append(
                PoolStatus(
                    name=name,
                    kind=pool.kind,
                    nodes=len(inv.pool_nodes.get(name, [])) if inv else 0,
                    capacity_gpus=inv.capacity.get(name, 0) if inv else 0,
                    free_gpus=inv.free.get(name, 0) if inv else 0,
                    util_pct=window.mean(now) if window is not None else None,
                    reclaimable_gpus=_reclaimable(inv, name, idle) if inv else 0,
                )
            )
        return out

    @property
    def _stale_s(self) -> float:
        """A GPU silent this long is not known idle (one missed reading is tolerated)."""
        return max(60.0, 2 * self._util_window_s / UTIL_SLOTS)

    def budget_states(self, now: float) -> list[BudgetState]:
        """Each budget's limit, use and what remains in its window (for metrics)."""
        return self._budgets.states(now)

    # -- sharded ingest: merged partials in (see policies.partials) ------------------------

    def put_latency(
        self,
        service_key: str,
        slot: int,
        *,
        interval_s: float,
        store: CollapsingLowestDenseStore,
        zeros: int,
        counts: tuple[int, int, int],
        overflow: Mapping[int, float] | None = None,
    ) -> bool:
        """Make one interval of a service's windows hold a merge of partials: the sketch store,
        the zeros, the exceedance counts ``(n, above_high, above_low)`` and the histogram
        overflow keys (:attr:`LatencyWindow.overflow`). ``False`` when the
        service is unknown or has another resolution (counted in ``unknown``) or the interval
        has left its window (``late``)."""
        svc = self._services.get(service_key)
        if svc is None or svc.interval != interval_s:
            self.unknown += 1
            return False
        if not svc.latency.put_interval(slot, store, zeros, overflow=overflow):
            self.late += 1
            return False
        svc.exceed.put_interval(slot, *counts)
        if not svc.due:  # its SLO steps at the next tick, as after an event
            svc.due = True
            self._due.append(svc)
        return True

    def put_utilization(
        self,
        slot: int,
        *,
        interval_s: float,
        readings: Mapping[tuple[str, int | str, int | None], tuple[float, int, float]],
    ) -> int:
        """Make one utilization interval hold a merge of partials: per device ``(node, gpu,
        MIG instance or None)`` the sum, count and max of its readings. ``readings`` is every
        device's for that interval, so each pool's interval is their merge (node -> pool from
        the last snapshot). Returns how many devices were taken."""
        if interval_s != self._util_interval:
            self.unknown += len(readings)
            return 0
        pools: dict[str, tuple[float, int, float]] = {}
        taken = 0
        for (node, gpu, instance), (total, count, peak) in readings.items():
            key = f"{node}/{gpu}" if instance is None else f"{node}/{gpu}/{instance}"
            window = self._gpu_windows.get(key)
            if window is None:
                window = self._window(node, key, count, at=(slot + 1) * interval_s)
                if window is None:
                    continue
                self._devices = {}
            if not window.put_interval(slot, total, count, peak):
                self.late += 1
                continue
            taken += 1
            if (pool := self._node_pool.get(node)) is not None:
                s, c, m = pools.get(pool, (0.0, 0, 0.0))
                pools[pool] = (s + total, c + count, max(m, peak))
        for pool, (s, c, m) in pools.items():
            self._pool_windows[pool].put_interval(slot, s, c, m)
        self.observed += taken  # as readings do: the pool mean is read again
        return taken

    def merge_idle(
        self, node: str, gpu: str, *, first: float, last: float, busy: float | None
    ) -> None:
        """A GPU's first, last and last busy reading as an aggregator saw them (merging the
        same marks twice changes nothing). Only for a GPU whose readings were taken
        (:meth:`put_utilization` of the same interval comes first): the tracker is bounded as
        the windows are."""
        if f"{node}/{gpu}" not in self._gpu_windows:
            return
        self._idle.add(node, gpu, first, 0.0)
        self._idle.add(node, gpu, last, 0.0)
        if busy is not None:
            self._idle.add(node, gpu, busy, math.inf)

    # -- status reads (controller/process/status.py): read-only, added for `ebbtide status` --

    def cooldown_left(self, service_key: str, now: float) -> float:
        """Seconds before ``namespace/service`` may be acted for again (0: it may now), from
        its own cooldown or the policy's, and any hold-off after a refused try. A scale-up with
        ``readyEndsCooldown`` may end it earlier, once its replicas run."""
        svc = self._services[service_key]
        quiet = svc.spec.cooldown
        length = self._policy.spec.cooldowns.service if quiet is None else quiet
        return self._cooldowns.remaining_s(service_key, now, length)


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
