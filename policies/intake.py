"""The engine's intake: events and merged partials into windows, with the clock that bounds them.

Design:

* ``observe(event)`` is the hot path. A latency event goes to its service's
  :class:`~policies.windows.LatencyWindow` (the quantile sketch) and
  :class:`~policies.slo.ExceedanceWindow` (threshold counters) and marks the service due for
  an SLO step (:mod:`policies.scheduling`); a utilization event to its GPU's
  :class:`~policies.windows.UtilizationWindow`, its pool's window (node→pool from the last
  snapshot) and the MIG idle tracker. Memory is bounded by the policy's services and the
  cluster's GPUs, never by the event rate; events for services the policy does not name are
  counted and dropped. A GPU reading makes a window only for a node the last snapshot lists
  (before the first snapshot every node counts, so a restart's rewind refills the windows, and
  the first snapshot drops the nodes it does not list) and only up to
  :data:`MAX_DEVICES_PER_NODE` devices per node; any other reading is dropped and counted in
  :attr:`Intake.dropped` by reason (``unknown_node``, ``device_limit``). A node that joins
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
* **Load and further objectives** (:mod:`policies.loadsignals`). An ``inference.load`` event
  goes to its service's gauges (the last reading per pod; stale ones expire there), a latency
  event of a metric other than the primary ``slo``'s to the service's further objectives on that
  metric, and a GPU reading that names its pod to :attr:`Intake.pod_util` (the service's own GPU
  utilization signal). A load event the policy cannot use is counted in
  :attr:`Intake.load_dropped` by reason (``unknown_service``: a service the policy does not
  name; ``unused``: a service with no load signal; ``stale``: older than its signals'
  ``staleAfter`` when it arrived), never fatal.
* **Sharded ingest.** Aggregators merge events into partials (:mod:`policies.partials`); the
  decider puts each merged interval in place (:meth:`Intake.put_latency`,
  :meth:`Intake.put_utilization`, :meth:`Intake.merge_idle`), as if it had observed the events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

from ddsketch.store import CollapsingLowestDenseStore

from policies.inventory import Inventory
from policies.loadsignals import ServiceSignals
from policies.mig import IdleTracker
from policies.model import Policy
from policies.servicetrack import ServiceTrack
from policies.slo import ExceedanceWindow
from policies.windows import LatencyWindow, UtilizationWindow
from streams.events import Event, GpuUtilization, InferenceLatency, InferenceLoad

__all__ = ["DEFAULT_UTIL_WINDOW_S", "MAX_DEVICES_PER_NODE", "UTIL_SLOTS", "Intake"]

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

#: A device as a reading names it: (node, gpu) for a whole card, (node, gpu, MIG instance).
DeviceKey = tuple[str, int | str, int | None] | tuple[str, int | str]


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


class Intake:
    """Events in, windows updated. See the module docstring."""

    def __init__(self) -> None:
        self.services: dict[str, ServiceTrack] = {}
        self._by_name: dict[str, ServiceTrack] = {}
        #: Services with events since their SLO was last stepped. The schedule takes them from
        #: this very list (it is shared, never rebound).
        self.due: list[ServiceTrack] = []
        #: (node, gpu[, mig instance]) as the event spells it -> what a reading updates; rebuilt
        #: lazily whenever the windows or the node -> pool map change.
        self._devices: dict[DeviceKey, _Device] = {}
        self.gpu_windows: dict[str, UtilizationWindow] = {}
        #: Windows in ``gpu_windows`` per node (bounded by MAX_DEVICES_PER_NODE).
        self._node_devices: dict[str, int] = {}
        #: When each node's windows were last swept for devices with no live reading.
        self._reclaimed: dict[str, float] = {}
        self.pool_windows: dict[str, UtilizationWindow] = {}
        self._node_pool: dict[str, str | None] = {}
        #: The nodes of the last snapshot (``None`` before the first: every node counts).
        self._nodes: Mapping[str, object] | None = None
        self.idle = IdleTracker(100.0)
        self.util_window_s = 0.0
        self.util_interval = 0.0
        self.clock: float = _NO_CLOCK
        self.observed = 0
        self.late = 0
        self.unknown = 0
        #: Latency events of a metric the service's objective is not on (``ttft`` for an
        #: ``e2e`` objective, say): not counted in its window.
        self.other_metric = 0
        #: Events stamped more than one resolution past the clock (taken at the clock).
        self.skewed = 0
        #: GPU readings dropped, by reason: ``unknown_node`` (a node the last snapshot does not
        #: list), ``device_limit`` (past MAX_DEVICES_PER_NODE devices on one node).
        self.dropped: dict[str, int] = {}
        #: Services whose latency histograms end below the objective -> that last bound: their
        #: overflow counts as over the objective, so the objective cannot be judged.
        self.unresolved: dict[str, float] = {}
        #: Services with further objectives, load signals or the work-bound check, by key.
        self.signals: dict[str, ServiceSignals] = {}
        #: ``namespace/pod`` -> (time, percent) of the last GPU reading naming the pod.
        self.pod_util: dict[str, tuple[float, float]] = {}
        #: ``inference.load`` events not used, by reason (see the module docstring).
        self.load_dropped: dict[str, int] = {}

    def configure(self, policy: Policy, services: dict[str, ServiceTrack]) -> None:
        """Adopt a policy: its services, its utilization window (the MIG section's
        ``convertAfter``; a new length starts every utilization window afresh), its pools'
        windows and its idle threshold."""
        self.services = services
        self.unresolved = {}  # said afresh under the new objectives, by the next histogram
        self._by_name = {svc.name: svc for svc in services.values()}
        signals: dict[str, ServiceSignals] = {}
        for key, svc in services.items():
            if svc.spec.has_signals():
                kept = self.signals.get(key)
                if kept is not None:
                    kept.respec(svc.spec)
                signals[key] = kept if kept is not None else ServiceSignals(key, svc.spec)
        self.signals = signals
        self._devices = {}
        spec = policy.spec
        mig = spec.mig
        util_window = mig.convert_after if mig is not None else DEFAULT_UTIL_WINDOW_S
        if util_window != self.util_window_s:
            self.util_window_s = util_window
            self.util_interval = util_window / UTIL_SLOTS
            self.gpu_windows = {}
            self._node_devices = {}
            self._reclaimed = {}
            self.pool_windows = {}
        for pool in spec.pools:
            self.pool_windows.setdefault(pool, self._util_window())
        for pool in [p for p in self.pool_windows if p not in spec.pools]:
            del self.pool_windows[pool]
        threshold = (mig.node_idle_below * 100.0) if mig is not None else 0.0
        if threshold != self.idle.threshold_pct:
            self.idle = IdleTracker(threshold)

    def index(self, inv: Inventory) -> None:
        """Adopt a new snapshot's nodes and node -> pool map: the windows of nodes it does not
        list are forgotten."""
        self._nodes = inv.nodes
        self._node_pool = inv.node_pool
        self._devices = {}
        self.idle.forget(inv.nodes)
        gone = [k for k in self.gpu_windows if k.split("/", 1)[0] not in inv.nodes]
        for k in gone:
            del self.gpu_windows[k]
        for node in [n for n in self._node_devices if n not in inv.nodes]:
            del self._node_devices[node]
            self._reclaimed.pop(node, None)
        if self.pod_util:
            pods = {p.key for p in inv.snapshot.pods}
            self.pod_util = {k: v for k, v in self.pod_util.items() if k in pods}

    @property
    def stale_s(self) -> float:
        """A GPU silent this long is not known idle (one missed reading is tolerated)."""
        return max(60.0, 2 * self.util_window_s / UTIL_SLOTS)

    def _util_window(self) -> UtilizationWindow:
        return UtilizationWindow(
            window_s=self.util_window_s, interval_s=self.util_window_s / UTIL_SLOTS
        )

    # -- events ------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """The caller's clock reads ``now`` (see the module docstring); an older ``now``
        changes nothing."""
        if self.clock == _NO_CLOCK or now > self.clock:
            self.clock = now

    def observe(self, event: Event | InferenceLoad) -> bool:
        """Feed one event; ``False`` when it was late or names no known service."""
        if type(event) is InferenceLoad:
            return self._observe_load(event)
        if type(event) is GpuUtilization:
            ev = event
            dev = self._devices.get(
                (ev.node, ev.gpu) if ev.mig_profile is None else (ev.node, ev.gpu, ev.mig_instance)
            )
            if dev is None:
                dev = self._device(ev)
                if dev is None:
                    return False
            ts: float = ev.ts  # type: ignore[assignment]  # a float once decoded (events.py)
            if ts > self.clock + self.util_interval:
                self.skewed += 1
                ts = self.clock
            util = ev.util_pct
            if not dev.window.add(ts, util):
                self.late += 1
                return False
            if dev.whole:
                self.idle.add(dev.node, dev.gpu, ts, util)
            if dev.pool is not None:
                dev.pool.add(ts, util)
            if ev.pod is not None:
                self.pod_util[ev.pod] = (ts, util)
            self.observed += 1
            return True
        return self._observe_latency(event)  # type: ignore[arg-type]  # the other event kind

    def _observe_load(self, event: InferenceLoad) -> bool:
        svc = self._by_name.get(event.service)
        if svc is None or svc.namespace != event.namespace:
            return self._drop_load("unknown_service")
        sig = self.signals.get(svc.key)
        scale = svc.spec.scale
        signals = scale.signals if scale is not None else None
        if sig is None or signals is None:
            return self._drop_load("unused")
        ts = event.time
        if ts > self.clock + svc.interval:
            self.skewed += 1
            ts = self.clock
        elif self.clock != _NO_CLOCK and self.clock - ts > signals.stale_after:
            return self._drop_load("stale")
        sig.add_load(ts, event)
        self.observed += 1
        return True

    def _drop_load(self, reason: str) -> bool:
        self.load_dropped[reason] = self.load_dropped.get(reason, 0) + 1
        return False

    def _observe_other(self, svc: ServiceTrack, event: InferenceLatency) -> bool:
        """A latency event of a further objective's metric into each of them."""
        sig = self.signals.get(svc.key)
        tracks = (
            [] if sig is None else [t for t in sig.objectives if t.spec.metric == event.objective]
        )
        if not tracks:
            self.other_metric += 1
            return False
        ts: float = event.ts  # type: ignore[assignment]  # a float once decoded (events.py)
        if ts > self.clock + svc.interval:
            self.skewed += 1
            ts = self.clock
        taken = False
        for track in tracks:
            taken = _into(track.latency, track.exceed, ts, event) or taken
        if not taken:
            self.late += 1
            return False
        self.observed += 1
        return True

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
        if event.objective != svc.metric:
            return self._observe_other(svc, event)
        ts: float = event.ts  # type: ignore[assignment]  # a float once decoded (events.py)
        if ts > self.clock + svc.interval:
            self.skewed += 1
            ts = self.clock
        value = event.latency_ms
        slow = 1  # requests above the recovery threshold (a histogram's: taken as some)
        taken = 1
        if value is not None:
            if not svc.latency.add(ts, value):
                self.late += 1
                return False
            slow = svc.exceed.add(ts, value)
        elif event.samples_ms is not None:
            if not svc.latency.add_many(ts, event.samples_ms):
                self.late += 1
                return False
            slow = svc.exceed.add_many(ts, event.samples_ms)
            taken = len(event.samples_ms)
        elif event.histogram is not None:
            h = event.histogram
            if not svc.latency.add_histogram(ts, h.bounds_ms, h.counts):
                self.late += 1
                return False
            svc.exceed.add_histogram(ts, h.bounds_ms, h.counts)
            if svc.exceed.unresolved is not None and svc.key not in self.unresolved:
                self.unresolved[svc.key] = svc.exceed.unresolved
        if not svc.due:
            if slow or svc.below_slack < taken:
                svc.due = True
                self.due.append(svc)
            else:
                svc.below_slack -= taken
        if self.signals:  # the common policy has no further objective: no lookup
            sig = self.signals.get(svc.key)
            if sig is not None:
                for track in sig.objectives:
                    if track.spec.metric == event.objective:
                        _into(track.latency, track.exceed, ts, event)
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
            window, self.pool_windows[pool] if pool is not None else None, ev.node, gpu, whole
        )
        self._devices[(ev.node, ev.gpu) if whole else (ev.node, ev.gpu, ev.mig_instance)] = dev
        return dev

    def _window(self, node: str, key: str, readings: int, *, at: float) -> UtilizationWindow | None:
        """Device ``key``'s window, made at its first reading (at ``at``); ``None`` for a node
        the last snapshot does not list or one with :data:`MAX_DEVICES_PER_NODE` windows with
        live readings already, the ``readings`` counted in :attr:`dropped` (module docstring)."""
        window = self.gpu_windows.get(key)
        if window is not None:
            return window
        nodes = self._nodes
        devices = self._node_devices.get(node, 0)
        if nodes is not None and node not in nodes:
            reason = "unknown_node"
        elif devices >= MAX_DEVICES_PER_NODE and self._reclaim(node, at) >= MAX_DEVICES_PER_NODE:
            reason = "device_limit"
        else:
            self._node_devices[node] = self._node_devices.get(node, 0) + 1
            window = self.gpu_windows[key] = self._util_window()
            return window
        self.dropped[reason] = self.dropped.get(reason, 0) + readings
        return None

    def _reclaim(self, node: str, at: float) -> int:
        """Forget ``node``'s windows with no reading left in the window at ``at`` (the devices
        of a MIG layout the node no longer has: every conversion names new instances); how many
        it keeps. Once an interval at most per node, so a node past the limit costs one scan."""
        if at - self._reclaimed.get(node, -math.inf) < self.util_interval:
            return self._node_devices[node]
        self._reclaimed[node] = at
        prefix = f"{node}/"
        stale = [
            k for k, w in self.gpu_windows.items() if k.startswith(prefix) and w.mean(at) is None
        ]
        for k in stale:
            del self.gpu_windows[k]
        if stale:
            self._devices = {}  # cached devices may hold a forgotten window
        kept = self._node_devices[node] = self._node_devices[node] - len(stale)
        return kept

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
        svc = self.services.get(service_key)
        if svc is None or svc.interval != interval_s:
            self.unknown += 1
            return False
        if not svc.latency.put_interval(slot, store, zeros, overflow=overflow):
            self.late += 1
            return False
        svc.exceed.put_interval(slot, *counts)
        if not svc.due:  # its SLO steps at the next tick, as after an event
            svc.due = True
            self.due.append(svc)
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
        if interval_s != self.util_interval:
            self.unknown += len(readings)
            return 0
        pools: dict[str, tuple[float, int, float]] = {}
        taken = 0
        for (node, gpu, instance), (total, count, peak) in readings.items():
            key = f"{node}/{gpu}" if instance is None else f"{node}/{gpu}/{instance}"
            window = self.gpu_windows.get(key)
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
            self.pool_windows[pool].put_interval(slot, s, c, m)
        self.observed += taken  # as readings do: the pool mean is read again
        return taken

    def merge_idle(
        self, node: str, gpu: str, *, first: float, last: float, busy: float | None
    ) -> None:
        """A GPU's first, last and last busy reading as an aggregator saw them (merging the
        same marks twice changes nothing). Only for a GPU whose readings were taken
        (:meth:`put_utilization` of the same interval comes first): the tracker is bounded as
        the windows are."""
        if f"{node}/{gpu}" not in self.gpu_windows:
            return
        self.idle.add(node, gpu, first, 0.0)
        self.idle.add(node, gpu, last, 0.0)
        if busy is not None:
            self.idle.add(node, gpu, busy, math.inf)


def _into(
    latency: LatencyWindow, exceed: ExceedanceWindow, ts: float, event: InferenceLatency
) -> bool:
    """Whichever latency form ``event`` carries into a further objective's windows; ``False``
    when it was late."""
    if event.latency_ms is not None:
        if not latency.add(ts, event.latency_ms):
            return False
        exceed.add(ts, event.latency_ms)
    elif event.samples_ms is not None:
        if not latency.add_many(ts, event.samples_ms):
            return False
        exceed.add_many(ts, event.samples_ms)
    elif event.histogram is not None:
        h = event.histogram
        if not latency.add_histogram(ts, h.bounds_ms, h.counts):
            return False
        exceed.add_histogram(ts, h.bounds_ms, h.counts)
    return True
