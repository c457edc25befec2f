"""Prometheus metrics of the controller process.

Two kinds, on one private registry:

* **Counters and histograms updated where things happen** — decisions, actions by outcome,
  decision latency (event time → decision; decision → API call returned), policy reloads.
* **A collector that reads state at scrape time** — ingest counters and lag from the consumer's
  :class:`~streams.consumer.ConsumerStats`, SLO state and windowed quantile per service, pool
  utilization and budgets from the engine, leadership. Nothing on the event path pays for these:
  they are computed only when Prometheus asks.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policies.engine import Engine
from policies.slo import STATES, State
from streams.consumer import ConsumerStats
from streams.hold import IngestHold

__all__ = ["STALE_WARN_EVERY_S", "Metrics", "StateSources"]

#: At most one ``events.stale`` warning per this many seconds: one per burst, not one per batch.
STALE_WARN_EVERY_S = 60.0

_SLO_STATES: tuple[State, ...] = STATES
#: Seconds: from 1 ms to 2 min, dense where an event-driven controller should be.
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    15,
    30,
    60,
    120,
)


@dataclass(frozen=True, slots=True)
class StateSources:
    """Where the scrape-time collector reads from."""

    engine: Callable[[], Engine]
    consumer: Callable[[], ConsumerStats | None]
    is_leader: Callable[[], bool]
    clock: Callable[[], float]
    hold: Callable[[], IngestHold | None] = lambda: None


class _StateCollector(Collector):
    def __init__(self, sources: StateSources) -> None:
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        yield from self._ingest()
        yield from self._engine()
        leader = GaugeMetricFamily("ebbtide_leader", "1 while this replica may actuate.")
        leader.add_metric([], 1.0 if self._s.is_leader() else 0.0)
        yield leader

    def _ingest(self) -> Iterator[Metric]:
        stats = self._s.consumer()
        if stats is None:
            return
        consumed = CounterMetricFamily(
            "ebbtide_events_consumed", "Messages consumed.", labels=["topic"]
        )
        accepted = CounterMetricFamily(
            "ebbtide_events_accepted", "Valid events handed to the engine.", labels=["topic"]
        )
        rejected = CounterMetricFamily(
            "ebbtide_events_rejected",
            "Messages rejected and dead-lettered, by reason.",
            labels=["topic", "reason"],
        )
        for topic, n in stats.consumed.items():
            consumed.add_metric([topic], n)
        for topic, n in stats.accepted.items():
            accepted.add_metric([topic], n)
        for (topic, reason), n in stats.rejected.items():
            rejected.add_metric([topic, reason], n)
        lag = GaugeMetricFamily(
            "ebbtide_consumer_lag",
            "Events on the broker not yet applied (high watermark - applied offset).",
            labels=["topic", "partition"],
        )
        for (topic, partition), n in stats.lag.items():
            lag.add_metric([topic, str(partition)], n)
        unassigned = GaugeMetricFamily(
            "ebbtide_partitions_unassigned",
            "Partitions of the event topics the broker lists and this replica does not read "
            "(added to a topic and not yet started: retried every partitions_refresh_s).",
            labels=["topic"],
        )
        for topic in sorted({t for t, _ in stats.unassigned}):
            unassigned.add_metric([topic], sum(1 for t, _ in stats.unassigned if t == topic))
        yield from (consumed, accepted, rejected, lag, unassigned)
        if (hold := self._s.hold()) is not None:
            held = CounterMetricFamily(
                "ebbtide_ingest_held_seconds",
                "Seconds ingest was held while a tick decided and carried out.",
            )
            held.add_metric([], hold.held_s)
            overruns = CounterMetricFamily(
                "ebbtide_ingest_hold_overruns",
                "Ticks that held ingest longer than ingestHoldMaxSeconds (ingest went on).",
            )
            overruns.add_metric([], hold.overruns)
            yield from (held, overruns)

    def _engine(self) -> Iterator[Metric]:
        engine, now = self._s.engine(), self._s.clock()
        state = GaugeMetricFamily(
            "ebbtide_slo_state",
            "1 for the service's current SLO state.",
            labels=["service", "state"],
        )
        quantile = GaugeMetricFamily(
            "ebbtide_service_latency_quantile_ms",
            "Windowed latency quantile per service (the SLO's percentile).",
            labels=["service", "percentile"],
        )
        objective = GaugeMetricFamily(
            "ebbtide_service_objective_ms", "The SLO objective per service.", labels=["service"]
        )
        for status in engine.service_status(now):
            for name in _SLO_STATES:
                state.add_metric([status.key, name], 1.0 if status.state == name else 0.0)
            if status.quantile_ms is not None:
                quantile.add_metric([status.key, f"{status.percentile:g}"], status.quantile_ms)
            objective.add_metric([status.key], status.objective_ms)
        util = GaugeMetricFamily(
            "ebbtide_pool_utilization_pct", "Windowed GPU utilization per pool.", labels=["pool"]
        )
        gpus = GaugeMetricFamily(
            "ebbtide_pool_gpus", "GPUs per pool: capacity and free.", labels=["pool", "state"]
        )
        reclaimable = GaugeMetricFamily(
            "ebbtide_reclaimable_gpus",
            "GPUs held by pods but idle (under the idle threshold for the utilization window), "
            "e.g. an over-provisioned inference replica's: reclaimable by scaling it in.",
            labels=["pool"],
        )
        for pool in engine.pool_status(now):
            if pool.util_pct is not None:
                util.add_metric([pool.name], pool.util_pct)
            gpus.add_metric([pool.name, "capacity"], pool.capacity_gpus)
            gpus.add_metric([pool.name, "free"], pool.free_gpus)
            reclaimable.add_metric([pool.name], pool.reclaimable_gpus)
        budget = GaugeMetricFamily(
            "ebbtide_budget_remaining", "Actions left in each budget's window.", labels=["budget"]
        )
        for b in engine.budget_states(now):
            budget.add_metric([b.name], b.remaining)
        skewed = CounterMetricFamily(
            "ebbtide_events_skewed",
            "Events stamped more than one resolution ahead of the controller's clock (a producer "
            "clock running fast); each was taken as if stamped now.",
            value=engine.skewed,
        )
        dropped = CounterMetricFamily(
            "ebbtide_gpu_readings_dropped",
            "GPU utilization readings the engine dropped, by reason: unknown_node (a node the "
            "cluster snapshot does not list), device_limit (more devices on one node than any "
            "GPU node has).",
            labels=["reason"],
        )
        for reason, n in sorted(engine.dropped.items()):
            dropped.add_metric([reason], n)
        loads = CounterMetricFamily(
            "ebbtide_load_events_dropped",
            "inference.load events the engine did not use, by reason: unknown_service (a "
            "service the policy does not name), unused (a service without load signals), stale "
            "(older than its signals' staleAfter on arrival).",
            labels=["reason"],
        )
        for reason, n in sorted(engine.load_dropped.items()):
            loads.add_metric([reason], n)
        work_bound = GaugeMetricFamily(
            "ebbtide_service_work_bound",
            "1 while the service's latency is taken as set by the work, not by queueing "
            "(scale.workBound: added replicas did not move the percentile): latency neither "
            "scales it up nor holds it from scaling down; its load signals size it.",
            labels=["service"],
        )
        for key, why in engine.work_bound().items():
            work_bound.add_metric([key], 0.0 if why is None else 1.0)
        unresolved = GaugeMetricFamily(
            "ebbtide_histogram_last_bound_below_objective_ms",
            "Services whose latency histograms end (last bucket bound, the value) below the SLO "
            "objective: requests in the overflow bucket count as over the objective, so the "
            "SLO state errs towards breaching. Add a bucket bound at the objective.",
            labels=["service"],
        )
        for key, bound in sorted(engine.unresolved.items()):
            unresolved.add_metric([key], bound)
        yield from (
            state,
            quantile,
            objective,
            util,
            gpus,
            reclaimable,
            budget,
            skewed,
            dropped,
            loads,
            work_bound,
            unresolved,
        )


class Metrics:
    """The process's metrics; :attr:`registry` is what ``/metrics`` serves."""

    def __init__(self, sources: StateSources) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "ebbtide_decisions", "Decisions by action and rule.", ["action", "rule"], registry=r
        )
        self.actions = Counter(
            "ebbtide_actions", "Decisions carried out, by outcome.", ["action", "outcome"],
            registry=r,
        )  # fmt: skip
        self.event_to_decision = Histogram(
            "ebbtide_event_to_decision_seconds",
            "From the newest event's timestamp to the decision it led to.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decision_to_api = Histogram(
            "ebbtide_decision_to_api_seconds",
            "From a decision to its API call returning.",
            ["action"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.evaluate_seconds = Histogram(
            "ebbtide_evaluate_seconds", "Time of one engine evaluation.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.policy_info = Gauge(
            "ebbtide_policy_info", "The active policy (value 1).", ["name", "hash"], registry=r
        )
        self.policy_reloads = Counter(
            "ebbtide_policy_reloads", "Policy reloads by result.", ["result"], registry=r
        )
        self.mig_failures = Counter(
            "ebbtide_mig_conversion_failures", "MIG conversions that failed and rolled back.",
            registry=r,
        )  # fmt: skip
        self.wasted_gpu_hours = Counter(
            "ebbtide_preemption_wasted_gpu_hours",
            "GPU-hours of training work preemptions threw away (since each pod's last "
            "checkpoint, else its start).",
            registry=r,
        )
        self.events_stale = Counter(
            "ebbtide_events_stale",
            "Accepted events older than the policy's longest SLO window when they arrived: they "
            "count in no window (a replay of old data, a stalled producer, a wrong clock).",
            registry=r,
        )
        self.objective_status_writes = Counter(
            "ebbtide_objective_status_writes",
            "ServiceObjective status writes (at most one per object per status period, only "
            "on change).",
            registry=r,
        )
        self.objectives = Gauge(
            "ebbtide_service_objectives",
            "ServiceObjectives watched, by their Ready reason (Accepted, NameTaken, InvalidSpec…).",
            ["reason"],
            registry=r,
        )
        self._stale_warned_at = -math.inf
        r.register(_StateCollector(sources))
        # Series exist from the start at 0, so rate() sees the first failure of each action.
        for action in ("scale", "evict", "mig_convert", "mig_revert"):
            self.actions.labels(action, "failed")

    def stale(self, count: int, *, now: float) -> bool:
        """Count ``count`` stale events; ``True`` when a warning is due (the first of a burst:
        none was due in the last :data:`STALE_WARN_EVERY_S` seconds)."""
        self.events_stale.inc(count)
        if now - self._stale_warned_at < STALE_WARN_EVERY_S:
            return False
        self._stale_warned_at = now
        return True

    def set_objectives(self, reasons: Iterable[str]) -> None:
        """The watched ServiceObjectives' Ready reasons: one series per reason seen."""
        self.objectives.clear()
        for reason, count in Tally(reasons).items():
            self.objectives.labels(reason).set(count)

    def set_policy(self, name: str, digest: str) -> None:
        self.policy_info.clear()
        self.policy_info.labels(name, digest).set(1)
