"""The composition root of ``ebbtide run``: streams → engine → cluster, and its lifecycle.

Root tasks, each guarded (a crash is logged and stops the process instead of leaving it half
alive): the Kafka **consumer** (which hands each validated batch to :meth:`Controller.observe`:
the engine ingests it, and only then are its offsets committable), the **evaluator** (which
evaluates on every batch and at least every ``evaluate_every_s``, so recoveries and idle capacity
are noticed without new events, and hands decisions to the cluster when this replica leads), the
**cluster runtime** (watches, leader election), the **policy reloader** and the HTTP endpoint.

Every replica consumes every partition, without a consumer group: it starts each partition at
now minus the policy's longest window (and a margin), found by time, so a new or restarted replica
rebuilds complete windows without re-reading the topics' retention, and a follower can take over
at once. It is ready once caught up with the end offsets seen at its start.

The decide-and-act half of the evaluator is :class:`controller.loop.tick.Loop`, the same
tick replay and simulate run; the decisions log (write-ahead intents, read-back, follow) is
:class:`controller.process.journal.DecisionsJournal`. Followers decide too (their windows are as
warm as the leader's); their decisions are refused as "not the leader", counted in metrics and
otherwise silent, and cost them no budget.

Shutdown on SIGTERM, in order: stop fetching → let the evaluator finish the action in flight →
apply what is queued and commit its offsets → stop the cluster runtime → close clients; all
bounded by ``shutdown_timeout_s``. The runtime is closed by whoever built it.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import structlog

from controller.kube.objective_crd import Admission, with_objectives
from controller.kube.objectives import ObjectiveSync
from controller.loop.port import ActionResult, ClusterRuntime, Outcome
from controller.loop.tick import Loop
from controller.process.aggregate import (
    PartialsFeed,
    aggregates_retention_s,
    ensure_aggregates_topic,
    longest_window_s,
)
from controller.process.health import HealthServer
from controller.process.journal import DecisionsJournal
from controller.process.metrics import Metrics, StateSources
from controller.process.objective_status import objective_status
from controller.process.settings import Settings
from controller.process.status import StatusBoard, StatusSources
from controller.process.transitions import Transitions
from policies.decisions import Decision
from policies.engine import Engine
from policies.loader import check_policy, read_sources
from policies.model import Policy
from streams import prometheus as prom
from streams.connection import ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import EventDecoder
from streams.hold import IngestHold
from streams.producer import DeadLetter, KafkaProducer

__all__ = ["Controller", "load_policy_files"]

log = structlog.get_logger("ebbtide")

#: An event's time in epoch seconds (``ts``, normalised at decode; see ``Event.time``).
_EVENT_TIME = operator.attrgetter("ts")


def load_policy_files(settings: Settings) -> Policy:
    """The merged policy, or ``ValueError`` listing every problem as FILE:LINE:COL."""
    policy, errors = check_policy(read_sources(settings.policies))
    if policy is None:
        raise ValueError("invalid policy:\n" + "\n".join(str(e) for e in errors))
    return policy


class Controller:
    """One replica of the controller process. :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        runtime: ClusterRuntime,
        policy: Policy,
        *,
        objectives: ObjectiveSync | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings.for_policy(policy)
        self.runtime = runtime
        self._clock = clock
        self.policy = policy
        """The policy in effect: the files' merged with the admitted ServiceObjectives."""
        self._file_policy = policy
        self.objectives = objectives
        """The ServiceObjectives watched (``None``: the ConfigMap-only mode)."""
        self._objectives_seen = -1
        self.verdicts: list[Admission] = []
        """Each watched ServiceObjective: joined the policy, or why not."""
        self.engine = Engine(policy, ledger=runtime.ledger)
        self._policy_text = self._read_policy_text()
        self._consumer: EventConsumer | None = None
        self._feed: PartialsFeed | None = None
        """With ``shards.role: decide``: partials merged instead of events consumed."""
        self.ingest_hold = IngestHold(self.settings.ingest_hold_max_s)
        """Taken by each tick, so the consumer does not fetch or hand over meanwhile."""
        self.metrics = Metrics(
            StateSources(
                engine=lambda: self.engine,
                consumer=lambda: self._consumer.stats if self._consumer else None,
                hold=lambda: self.ingest_hold,
                is_leader=runtime.is_leader,
                clock=clock,
            )
        )
        self.metrics.set_policy(self.policy.metadata.name, self.policy.digest())
        self.transitions = Transitions(lambda: self.engine, runtime.is_leader)
        """Logs SLO, leadership and budget changes once per evaluation."""
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._newest_event: float | None = None
        self._warned_unresolved: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._crashed: list[str] = []
        self.journal = DecisionsJournal(
            settings, self.engine, policy=lambda: self.policy, clock=clock
        )
        self.loop = Loop(
            self.engine,
            runtime,
            journal=self.journal,
            instruments=_Instruments(self.metrics, lambda: self._newest_event, clock),
            dry_run=bool(self.settings.dry_run),
            hold=lambda d: self.status.paused(d),
        )
        self.status = StatusBoard(
            StatusSources(
                engine=lambda: self.engine,
                cluster=lambda: runtime.cluster,
                is_leader=runtime.is_leader,
                unrestored=lambda: self.journal.unrestored,
                dry_run=lambda: bool(self.settings.dry_run),
                identity=self.settings.kube.identity,
                clock=clock,
                paused_objectives=objectives.paused if objectives is not None else dict,
                objectives=lambda: self.verdicts,
            )
        )
        """Answers /status; told of every decision record (this replica's and the log's)."""
        self.journal.observers.append(self.status.note)
        self.http = HealthServer(
            settings.http.address,
            registry=self.metrics.registry,
            ready=self._not_ready,
            alive=lambda: list(self._crashed),
            status=self.status.status,
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()

    @property
    def crashed(self) -> list[str]:
        """Root tasks that crashed or exited: the process must exit non-zero."""
        return list(self._crashed)

    async def run(self) -> None:
        """Start everything, run until :meth:`stop` (or SIGTERM/SIGINT), then shut down."""
        s = self.settings
        kafka = s.kafka.connection()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        topics = [s.kafka.latency_topic, s.kafka.gpu_topic, s.kafka.deadletter_topic]
        loads = (s.kafka.load_topic,) if s.kafka.load_topic else ()
        topics += loads
        await ensure_topics(
            kafka,
            topics + ([s.kafka.decisions_topic] if s.kafka.decisions_topic else []),
            replication_factor=s.kafka.replication_factor,
        )
        await self.warm_start()
        await self.journal.restore()
        await self.read_objectives()
        rewind_s = longest_window_s(self.policy) + s.kafka.rewind_margin_s
        # No linger: the intents written ahead of each API call are on the path from decision
        # to call, and a dead letter is flushed at once anyway.
        async with KafkaProducer(kafka, linger_ms=0) as producer:
            self.journal.producer = producer
            if s.shards.role == "decide":
                await ensure_aggregates_topic(
                    kafka,
                    s.shards.aggregates_topic,
                    retention_s=aggregates_retention_s(self.policy, s),
                    replication_factor=s.kafka.replication_factor,
                )
                self._feed = PartialsFeed(
                    kafka,
                    s.shards.aggregates_topic,
                    self.engine,
                    rewind_s=rewind_s,
                    partitions_refresh_s=s.kafka.partitions_refresh_s,
                    on_merged=self._wake.set,
                    clock=self._clock,
                )
                await self._start(self._feed.run, rewind_s=rewind_s)
                return
            self._consumer = EventConsumer(
                kafka,
                self.observe,
                settings=ConsumerSettings(
                    group_id=None,
                    rewind_s=rewind_s,
                    partitions_refresh_s=s.kafka.partitions_refresh_s,
                    topics=(s.kafka.latency_topic, s.kafka.gpu_topic, *loads),
                    drain_timeout_s=s.shutdown_timeout_s / 4,
                    close_timeout_s=s.shutdown_timeout_s / 8,
                ),
                decoder=EventDecoder(s.kafka.limits(), topics=s.kafka.topics(), load=bool(loads)),
                dead_letter=DeadLetter(producer, topic=s.kafka.deadletter_topic),
                clock=self._clock,
                hold=self.ingest_hold,
            )
            await self._consumer.start()
            await self._start(self._consumer.run, rewind_s=rewind_s)

    async def _start(
        self, ingest: Callable[[], Coroutine[Any, Any, None]], *, rewind_s: float
    ) -> None:
        """Serve probes, start the root tasks with ``ingest`` (events, or partials for a
        decider), run until stopped, then shut down."""
        s = self.settings
        await self.http.start()
        log.info(
            "controller.started",
            policy=self.policy.metadata.name,
            policy_hash=self.policy.digest(),
            cluster=s.cluster,
            dry_run=s.dry_run,
            role=s.shards.role,
            metrics_port=self.http.port,
            rewind_s=rewind_s,
        )
        consumer = self._guard("consumer", ingest)
        self._guard("cluster", self.runtime.run)
        evaluator = self._guard("evaluator", self._evaluate_loop)
        self._guard("reloader", self._reload_loop)
        self._guard("decisions-log", self.journal.follow)
        await self._stopping.wait()
        await self._shutdown(consumer, evaluator)

    def _guard(self, name: str, fn: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller.task_crashed", task=name)
                self._crashed.append(f"task {name} crashed")
                self.stop()
            else:
                if not self._stopping.is_set():
                    log.error("controller.task_exited", task=name)
                    self._crashed.append(f"task {name} exited")
                    self.stop()

        task = asyncio.create_task(guarded(), name=f"ebbtide-{name}")
        self._tasks.append(task)
        return task

    async def _shutdown(self, consumer: asyncio.Task[None], evaluator: asyncio.Task[None]) -> None:
        """Stop in order within ``shutdown_timeout_s``: each step waits only for what is left
        of one deadline, and whatever still runs at the end is cancelled (a step can hang on
        the broker or the API server; the pod's grace period cannot)."""
        started = time.monotonic()
        budget = self.settings.shutdown_timeout_s
        deadline = started + budget

        def left(reserve: float = 0.0) -> float:
            return max(0.0, deadline - reserve - time.monotonic())

        for ingest in (self._consumer, self._feed):
            if ingest is not None:
                ingest.stop()
        self._wake.set()
        # The evaluator finishes the action in flight, then sees _stopping and returns.
        await asyncio.wait({evaluator}, timeout=budget / 2)
        # The consumer applies what is queued and closes; its own timeouts bound both.
        await asyncio.wait({consumer}, timeout=left(reserve=budget / 10))
        for task in self._tasks:
            task.cancel()
        if pending := {*self._tasks, *self.journal.audits}:
            await asyncio.wait(pending, timeout=left())
        await self.http.close()
        log.info("controller.stopped", seconds=round(time.monotonic() - started, 3))

    # -- ingest ---------------------------------------------------------------------------------

    def _warn_unresolved(self) -> None:
        """Once per service: its histograms cannot resolve its objective (see
        ``ebbtide_histogram_last_bound_below_objective_ms``)."""
        for key, bound in self.engine.unresolved.items():
            if key not in self._warned_unresolved:
                self._warned_unresolved.add(key)
                log.warning(
                    "slo.histogram_below_objective",
                    service=key,
                    last_bound_ms=bound,
                    hint="requests above the histogram's last bound count as over the "
                    "objective; add a bucket bound at the objective",
                )

    async def observe(self, batch: Batch) -> None:
        """The consumer's handler: the engine ingests the batch; then it counts as applied.
        Events older than the longest SLO window count in no window: they are counted
        (``ebbtide_events_stale_total``) and warned about once per burst, since they usually
        mean old data is being replayed into a live controller or a producer's clock is off."""
        events = batch.events
        self.engine.advance(self._clock())  # the bound on event time: now, not the last tick
        self.engine.observe_many(events)
        if len(self.engine.unresolved) > len(self._warned_unresolved):
            self._warn_unresolved()
        if events:
            times = list(map(_EVENT_TIME, events))  # once, in C: this runs for every event
            newest = max(times)
            if self._newest_event is None or newest > self._newest_event:
                self._newest_event = newest
            now = self._clock()
            services = self.policy.spec.services.values()
            horizon = now - max((s.slo.window for s in services), default=0.0)
            stale = [t for t in times if t < horizon] if min(times) < horizon else []
            if stale and self.metrics.stale(len(stale), now=now):
                log.warning(
                    "events.stale",
                    count=len(stale),
                    oldest_age_s=round(now - min(stale)),
                    hint="old events count in no window; replaying old data? use "
                    "`ebbtide publish --retime`, or check the producer's clock",
                )
        self._wake.set()

    async def warm_start(self) -> None:
        """Fill windows from Prometheus history (``warm_start`` settings), if configured."""
        w = self.settings.warm_start
        if w.url is None:
            return
        queries = (
            [prom.PromQuery("latency", w.latency_query, w.latency_unit_ms)]
            if w.latency_query
            else []
        )
        if w.gpu_query:
            queries.append(prom.PromQuery("gpu", w.gpu_query))
        end = datetime.fromtimestamp(self._clock(), UTC)
        start = datetime.fromtimestamp(self._clock() - w.lookback_s, UTC)
        try:
            result = await prom.fetch_events(w.url, queries, start=start, end=end, step=w.step)
        except (ConnectionError, ValueError) as exc:
            log.warning("warm_start.failed", error=str(exc))  # start cold rather than not at all
            return
        for event in result.events:
            self.engine.observe(event)
        log.info("warm_start.done", events=len(result.events), skipped=dict(result.skipped))

    # -- evaluation -----------------------------------------------------------------------------

    async def _evaluate_loop(self) -> None:
        every = self.settings.evaluate_every_s
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            self.merge_objectives()
            await self.evaluate_once()
            await self.note_transitions()
            await self.write_objective_status()

    async def note_transitions(self) -> None:
        """Log what changed state since the last look; raise the changes a workload's
        ``kubectl describe`` should show as Events on it."""
        cluster = self.runtime.cluster
        snapshot = cluster.snapshot() if cluster.synced else None
        for notice in self.transitions.check(self._clock(), snapshot):
            await cluster.notice(notice)

    async def evaluate_once(self) -> list[ActionResult]:
        """One tick (:meth:`controller.loop.tick.Loop.tick`): upkeep, evaluate, act when
        leading, feedback, journal; ingest held meanwhile (:mod:`streams.hold`)."""
        async with self.ingest_hold.held():
            return await self.loop.tick(self._clock())

    # -- ServiceObjectives ----------------------------------------------------------------------

    async def read_objectives(self) -> None:
        """List the ServiceObjectives once and merge them before the consumer's rewind is set
        from the longest window, so an objective's window is as complete after a restart as a
        policy file's. Bounded by ``shutdown_timeout_s``: an API server that does not answer
        delays the start by that much, then the watch (started with the cluster's) catches up."""
        objectives = self.objectives
        if objectives is None:
            return
        listing = asyncio.create_task(objectives.run(), name="ebbtide-objectives-first-list")
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout_s):
                await objectives.informer.wait_synced()
        except TimeoutError:
            log.warning("objectives.not_listed", waited_s=self.settings.shutdown_timeout_s,
                        hint="the rewind covers the policy files' windows only")  # fmt: skip
        finally:
            objectives.stop()
            await listing
        self.merge_objectives()

    def merge_objectives(self) -> bool:
        """When the watched ServiceObjectives changed: merge them with the policy files' and
        adopt the result (True when the policy in effect changed)."""
        objectives = self.objectives
        if (
            objectives is None
            or not objectives.synced
            or objectives.version == self._objectives_seen
        ):
            return False
        self._objectives_seen = objectives.version
        return self._adopt(self._file_policy) == "adopted"

    def _adopt(self, files: Policy) -> Literal["adopted", "same", "rejected"]:
        """Adopt ``files`` merged with the ServiceObjectives: one log line per object whose
        verdict changed (a name the policy file already uses: the file's service wins, and the
        object is refused with both namespaces named)."""
        policy, verdicts = files, list[Admission]()
        if self.objectives is not None and self.objectives.synced:
            policy, verdicts = with_objectives(
                files, self.objectives.objects(), self.objectives.namespaces
            )
        before = {v.key: v for v in self.verdicts}
        for v in verdicts:
            if before.get(v.key) != v:
                if v.accepted:
                    log.info("objective.accepted", object=v.key, message=v.message)
                else:
                    log.warning("objective.refused", object=v.key, reason=v.reason,
                                message=v.message)  # fmt: skip
        for gone in before.keys() - {v.key for v in verdicts}:
            log.info("objective.removed", object=gone)
        self.verdicts = verdicts
        self.metrics.set_objectives(v.reason for v in verdicts)
        if policy.digest() == self.policy.digest():
            return "same"
        result = self.engine.reload(policy)
        if not result.accepted:
            log.error("policy.rejected", errors=list(result.errors), kept=self.policy.digest())
            return "rejected"
        self.policy = policy
        self.runtime.reconfigure(policy)
        self.metrics.set_policy(policy.metadata.name, policy.digest())
        return "adopted"

    async def write_objective_status(self) -> list[str]:
        """The leader writes each ServiceObjective's status where it is due (at most once a
        sync period) and changed (:class:`~controller.kube.objectives.ObjectiveSync`);
        followers never write. Returns the objects written."""
        objectives = self.objectives
        if objectives is None or not self.verdicts or not self.runtime.is_leader():
            return []
        if not any(objectives.due(v.key) for v in self.verdicts):
            return []
        board = self.status.status()
        services = {s["service"]: s for s in board["services"]}
        blocked = [b for b in board["blockedBy"] if not b.startswith("not the leader")]
        statuses = {}
        for v in self.verdicts:
            obj = objectives.informer.get(v.key)
            if obj is None:
                continue
            statuses[v.key] = objective_status(
                v,
                services.get(v.key) if v.accepted else None,
                blocked=blocked,
                generation=(obj.get("metadata") or {}).get("generation"),
                old=obj.get("status"),
                now=datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        written = await objectives.write(statuses)
        self.metrics.objective_status_writes.inc(len(written))
        return written

    # -- readiness and reload -------------------------------------------------------------------

    def _not_ready(self) -> list[str]:
        """Why this replica must not be ready: ready means the cluster cache is synced and the
        consumer was assigned its partitions and applied them up to the end offsets seen at
        start (complete windows), then stays within ``ready_max_lag``."""
        problems = list(self._crashed)
        if self.journal.unrestored is not None:
            problems.append(self.journal.unrestored)
        if not self.runtime.cluster.synced:
            problems.append("cluster cache not synced")
        if self.journal.reader is not None and (left := self.journal.reader.unassigned):
            problems.append(f"decisions log partitions not read: {left}")
        if self._feed is not None:
            if not self._feed.caught_up:
                problems.append("reading the partial aggregates back")
            if left := self._feed.unassigned:
                problems.append(f"aggregates partitions not read: {left}")
            return problems
        stats = self._consumer.stats if self._consumer else None
        http = self.settings.http
        if stats is None or stats.last_fetch_ok is None:
            problems.append("not consuming yet")
            return problems
        age = time.monotonic() - stats.last_fetch_ok
        if age > http.ready_max_fetch_age_s:
            problems.append(f"no successful fetch for {age:.0f}s (broker unreachable?)")
        if not stats.caught_up:
            behind = ", ".join(
                f"{topic}[{partition}] at {'-' if at is None else at}/{'?' if end is None else end}"
                for (topic, partition), (at, end) in sorted(stats.behind.items())[:4]
            )
            problems.append(f"catching up with the events at start: {behind or 'nothing assigned'}")
        elif (lag := sum(stats.lag.values())) > http.ready_max_lag:
            problems.append(f"consumer lag {lag} > {http.ready_max_lag}")
        if stats.unassigned:
            unread = ", ".join(
                f"{topic}[{partition}]" for topic, partition in sorted(stats.unassigned)
            )
            problems.append(f"partitions not read: {unread}")
        return problems

    def _read_policy_text(self) -> str:
        return "\n---\n".join(s.text for s in read_sources(self.settings.policies))

    async def _reload_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.reload_every_s):
                    await self._stopping.wait()
            try:
                text = self._read_policy_text()
            except OSError as exc:  # a ConfigMap swap in progress: try again next time
                log.warning("policy.unreadable", error=str(exc))
                continue
            if text != self._policy_text:
                self._policy_text = text
                self.reload()

    def reload(self) -> bool:
        """Validate the policy files and swap them in (merged with the ServiceObjectives);
        keep the old policy if invalid."""
        files, errors = check_policy(read_sources(self.settings.policies))
        if files is None:
            self.metrics.policy_reloads.labels("rejected").inc()
            log.error("policy.rejected", errors=[str(e) for e in errors], kept=self.policy.digest())
            return False
        if self._adopt(files) == "rejected":
            self.metrics.policy_reloads.labels("rejected").inc()
            return False
        self._file_policy = files
        self.metrics.policy_reloads.labels("accepted").inc()
        log.info(
            "policy.reloaded", policy=self.policy.metadata.name, policy_hash=self.policy.digest()
        )
        return True


class _Instruments:
    """The tick's timings and outcomes into the process's metrics."""

    def __init__(
        self,
        metrics: Metrics,
        newest_event: Callable[[], float | None],
        clock: Callable[[], float],
    ) -> None:
        self._metrics = metrics
        self._newest_event = newest_event
        self._clock = clock

    def evaluated(self, seconds: float, decisions: Sequence[Decision]) -> None:
        m = self._metrics
        m.evaluate_seconds.observe(seconds)
        if not decisions:
            return
        if (newest := self._newest_event()) is not None:
            m.event_to_decision.observe(max(0.0, self._clock() - newest))
        for d in decisions:
            m.decisions.labels(d.action, d.explanation.rule).inc()

    def applied(self, decision: Decision, seconds: float) -> None:
        self._metrics.decision_to_api.labels(decision.action).observe(seconds)

    def settled(self, results: Sequence[ActionResult]) -> None:
        m = self._metrics
        for r in results:
            m.actions.labels(r.decision.action, r.outcome.value).inc()
            m.wasted_gpu_hours.inc(r.wasted_gpu_hours)
            if r.decision.action in ("mig_convert", "mig_revert") and r.outcome is Outcome.FAILED:
                m.mig_failures.inc()
