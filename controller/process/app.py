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

The decisions log (``ebbtide.decisions``) is the controllers' shared memory of what was done,
and the one source of the budget ledger (:class:`policies.budgets.Ledger`, shared by the engine
and the safety gate). The leader writes an acknowledged *intent* record before each write to the
cluster, and the outcome after, both under the decision's id; at start every replica reads the
log back over the longest budget or cooldown window, and while running it follows the log, its
own records included (reading a record twice changes nothing). So budgets and cooldowns hold
across restarts, crashes in the middle of a write, and changes of leader: an action is never
repeated because the replica that took it is gone. An intent the broker does not acknowledge
after retries refuses that action, with the reason; the process stays up. Followers decide too
(their windows are as warm as the leader's); their decisions are refused as "not the leader",
counted in metrics and otherwise silent, and cost them no budget.

Shutdown on SIGTERM, in order: stop fetching → let the evaluator finish the action in flight →
apply what is queued and commit its offsets → stop the cluster runtime → close clients; all
bounded by ``shutdown_timeout_s``. The runtime is closed by whoever built it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog
import tenacity

from controller.loop.port import (
    NOT_FREED,
    NOT_LEADER,
    ActionResult,
    ClusterRuntime,
    Outcome,
    feed_back,
)
from controller.process.aggregate import (
    PartialsFeed,
    aggregates_retention_s,
    ensure_aggregates_topic,
    longest_window_s,
)
from controller.process.health import HealthServer
from controller.process.metrics import Metrics, StateSources
from controller.process.settings import Settings
from policies.budgets import LogRecord
from policies.decisions import Decision, Evict, Scale, decision_to_dict
from policies.engine import Engine
from policies.loader import check_policy, read_sources
from policies.model import Policy
from streams import prometheus as prom
from streams.capture import TopicReader
from streams.connection import ensure_topics
from streams.consumer import Batch, ConsumerSettings, EventConsumer
from streams.events import EventDecoder
from streams.producer import DeadLetter, KafkaProducer
from streams.stream_errors import IncompleteRead, ProduceError

__all__ = ["Controller", "load_policy_files"]

log = structlog.get_logger("ebbtide")

_NOT_DONE = frozenset({Outcome.REFUSED, Outcome.BLOCKED, Outcome.FAILED})
#: Freeing outcomes after which the GPUs are not free: not done, or under way (a checkpoint
#: notice: the pod runs until its checkpoint or deadline, and the scale-up waits for it).
_NOT_FREED = _NOT_DONE | {Outcome.IN_PROGRESS}
#: Tries to have the broker acknowledge an intent record before the action is refused.
INTENT_ATTEMPTS = 3
#: Seconds between tries to read the decisions log back after an incomplete read.
RESTORE_RETRY_S = 5.0


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings.for_policy(policy)
        self.runtime = runtime
        self._clock = clock
        self.policy = policy
        self.engine = Engine(policy, ledger=runtime.ledger)
        self._policy_text = self._read_policy_text()
        self._consumer: EventConsumer | None = None
        self._feed: PartialsFeed | None = None
        """With ``shards.role: decide``: partials merged instead of events consumed."""
        self.metrics = Metrics(
            StateSources(
                engine=lambda: self.engine,
                consumer=lambda: self._consumer.stats if self._consumer else None,
                is_leader=runtime.is_leader,
                clock=clock,
            )
        )
        self.metrics.set_policy(self.policy.metadata.name, self.policy.digest())
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._newest_event: float | None = None
        self._warned_unresolved: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._crashed: list[str] = []
        self._audits: set[asyncio.Task[None]] = set()
        self._producer: KafkaProducer | None = None
        self._decisions_log: TopicReader | None = None
        self._unrestored: str | None = None
        """Why the decisions log has not been read back (no action until it has)."""
        self._intended: set[str] = set()
        """Decisions whose intent the broker acknowledged and whose outcome is not recorded."""
        self.http = HealthServer(
            settings.http.address,
            registry=self.metrics.registry,
            ready=self._not_ready,
            alive=lambda: list(self._crashed),
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
        await ensure_topics(
            kafka,
            topics + ([s.kafka.decisions_topic] if s.kafka.decisions_topic else []),
            replication_factor=s.kafka.replication_factor,
        )
        await self.warm_start()
        await self._restore_actions()
        rewind_s = longest_window_s(self.policy) + s.kafka.rewind_margin_s
        async with KafkaProducer(kafka, linger_ms=20) as producer:
            self._producer = producer
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
                    topics=(s.kafka.latency_topic, s.kafka.gpu_topic),
                    drain_timeout_s=s.shutdown_timeout_s / 4,
                    close_timeout_s=s.shutdown_timeout_s / 8,
                ),
                decoder=EventDecoder(s.kafka.limits(), topics=s.kafka.topics()),
                dead_letter=DeadLetter(producer, topic=s.kafka.deadletter_topic),
                clock=self._clock,
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
        self._guard("decisions-log", self._follow_decisions)
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
        if pending := {*self._tasks, *self._audits}:
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
            newest = max(e.time for e in events)
            if self._newest_event is None or newest > self._newest_event:
                self._newest_event = newest
            now = self._clock()
            services = self.policy.spec.services.values()
            horizon = now - max((s.slo.window for s in services), default=0.0)
            stale = [e.time for e in events if e.time < horizon]
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

    async def _restore_actions(self) -> None:
        """Start reading the decisions log and read it back over the longest budget or
        cooldown window into the ledger (:meth:`_read_back`)."""
        topic = self.settings.kafka.decisions_topic
        if topic is None:
            return
        self._decisions_log = TopicReader(
            self.settings.kafka.connection(),
            topic,
            partitions_refresh_s=self.settings.kafka.partitions_refresh_s,
        )
        await self._decisions_log.start()
        await self._read_back()

    async def _read_back(self) -> None:
        """Read the log back so budgets and cooldowns hold across a restart or a change of
        leader: no action is repeated because the replica that took it is gone. A read that
        could not reach the log's end is not used (part of the log would undercount what was
        spent): the replica says so, stays unready, refuses to act, and tries again."""
        assert self._decisions_log is not None
        spec = self.policy.spec
        horizon = max(
            spec.budgets.evictions.per,
            spec.budgets.scale_steps.per,
            spec.budgets.mig_conversions.per,
            spec.cooldowns.service,
            spec.cooldowns.training_grow,
            *(s.cooldown or 0.0 for s in spec.services.values()),
        )
        try:
            values = await self._decisions_log.since(self._clock() - horizon)
        except IncompleteRead as exc:
            self._unrestored = f"the decisions log was not read back: {exc}"
            log.error("restore.incomplete", error=str(exc), retry_in_s=RESTORE_RETRY_S)
            return
        for value in values:
            self._on_record(value)
        self._unrestored = None
        log.info("restore.done", records=len(values), horizon_s=horizon)

    def _on_record(self, value: bytes) -> None:
        """One decisions-log record, at start-up or live (any replica's, this one's too)."""
        if (rec := _parse_record(value)) is not None:
            self.engine.record(rec)

    async def _follow_decisions(self) -> None:
        if self._decisions_log is None:
            await asyncio.Event().wait()  # no decisions log configured: nothing to follow
            return
        try:
            while self._unrestored is not None:
                await asyncio.sleep(RESTORE_RETRY_S)
                await self._read_back()
            await self._decisions_log.follow(self._on_record)
        finally:
            await self._decisions_log.stop()

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
            await self.evaluate_once()

    async def evaluate_once(self) -> list[ActionResult]:
        """One round: upkeep, evaluate, act (when leading), account, audit."""
        now = self._clock()
        # Upkeep reports a flow still waiting (IN_PROGRESS) every tick: not news, not recorded.
        results = [r for r in await self.runtime.tick(now) if r.outcome is not Outcome.IN_PROGRESS]
        cluster = self.runtime.cluster
        if not cluster.synced:
            self._account(results, now=now)
            return results
        started = time.perf_counter()
        decisions = self.engine.evaluate(now, cluster.snapshot())
        self.metrics.evaluate_seconds.observe(time.perf_counter() - started)
        if not decisions:
            self._account(results, now=now)
            return results
        if self.settings.dry_run:
            decisions = [dataclasses.replace(d, dry_run=True) for d in decisions]
        if self._newest_event is not None:
            self.metrics.event_to_decision.observe(max(0.0, self._clock() - self._newest_event))
        for d in decisions:
            self.metrics.decisions.labels(d.action, d.explanation.rule).inc()
        applied = await self._carry_out(decisions)
        results = [*results, *applied]
        self._account(results, now=now)
        return results

    async def _carry_out(self, decisions: list[Decision]) -> list[ActionResult]:
        """Apply decisions in the engine's order, one by one. The engine frees GPUs for a
        service before scaling it up; when freeing fails (a PDB, a refusal), the scale-up it
        was for is not applied, so no inference pod is created without room (the scheduler
        might otherwise preempt training behind the PDB's back). A refusal decided here is
        reported to the cluster adapter like its own (a Kubernetes Event)."""
        cluster = self.runtime.cluster
        unfreed: dict[str, str] = {}
        out: list[ActionResult] = []
        for d in decisions:
            if not self.runtime.is_leader():
                out.append(ActionResult(d, Outcome.REFUSED, NOT_LEADER))
                continue
            if self._unrestored is not None:
                out.append(ActionResult(d, Outcome.REFUSED, self._unrestored))
                continue
            started = time.perf_counter()
            refusal = None
            if isinstance(d, Scale) and d.to_replicas > d.from_replicas and d.cause in unfreed:
                refusal = f"{NOT_FREED}: {unfreed[d.cause]}"
            elif (failed := await self._intend(d)) is not None:
                refusal = f"the intent was not recorded on the decisions log: {failed}"
            if refusal is not None:
                result = ActionResult(d, Outcome.REFUSED, refusal)
                await cluster.report(result)
            else:
                result = await self._apply(d)
                self.metrics.decision_to_api.labels(d.action).observe(time.perf_counter() - started)
            frees = isinstance(d, Evict) or (isinstance(d, Scale) and d.role == "training")
            if frees and d.cause is not None and result.outcome in _NOT_FREED:
                unfreed[d.cause] = f"{d.action} {d.target} {result.outcome.value}"
            out.append(result)
        return out

    async def _apply(self, decision: Decision) -> ActionResult:
        """Hand one decision to the cluster. The port never raises for one decision; if it
        does anyway, the decision ends ``FAILED`` like an actuator's own crash, so its intent,
        already on the log, gets an outcome and no replica reading the log charges for it."""
        try:
            (result,) = await self.runtime.cluster.apply([decision])
        except Exception as exc:
            log.exception("controller.apply_crashed", target=decision.target)
            return ActionResult(decision, Outcome.FAILED, f"unexpected error: {exc!r}")
        return result

    async def _intend(self, decision: Decision) -> str | None:
        """Write ahead: record the action on the decisions log, acknowledged, *before* it is
        carried out, so a replica that crashes while the write is in flight still counts it
        against budgets and cooldowns after a restart. A later record of the same decision id
        says whether it happened; without one it is assumed to have. Returns why the record
        could not be written (after :data:`INTENT_ATTEMPTS` tries), or ``None``."""
        topic = self.settings.kafka.decisions_topic
        if topic is None or self._producer is None or decision.dry_run or self.settings.dry_run:
            return None
        record = decision_to_dict(decision) | {
            "outcome": "intent",
            "replica": self.settings.kube.identity,
        }
        payload = json.dumps(record, default=str).encode()
        producer = self._producer
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(INTENT_ATTEMPTS),
                wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
                retry=tenacity.retry_if_exception_type(ProduceError),
                reraise=True,
            ):
                with attempt:
                    await producer.send_and_wait(topic, payload, key=decision.target.encode())
        except ProduceError as exc:
            log.error("decisions_log.intent_failed", target=decision.target, error=str(exc))
            return str(exc)
        self._intended.add(decision.id)
        return None

    def _account(self, results: list[ActionResult], *, now: float) -> None:
        """Outcomes back to the engine (budgets, cooldowns, held victims), then metrics, the
        log line and the decisions-log record of each. A "not the leader" refusal is recorded
        only after an intent of this replica's (leadership lost between the intent and the
        write): an intent without outcome counts, and the next leader would charge a budget
        unit and a whole cooldown for an action that never happened."""
        feed_back(self.engine, results, now=now)
        for r in results:
            self.metrics.actions.labels(r.decision.action, r.outcome.value).inc()
            self.metrics.wasted_gpu_hours.inc(r.wasted_gpu_hours)
            intended = r.decision.id in self._intended
            self._intended.discard(r.decision.id)
            if r.outcome is Outcome.REFUSED and r.detail.startswith(NOT_LEADER) and not intended:
                continue  # a follower re-decides every tick: counted, not logged or recorded
            if r.decision.action in ("mig_convert", "mig_revert") and r.outcome is Outcome.FAILED:
                self.metrics.mig_failures.inc()
            record = decision_to_dict(r.decision) | {
                "outcome": r.outcome.value,
                "detail": r.detail,
                "wasted_gpu_hours": r.wasted_gpu_hours,
                "policy_hash": self.policy.digest(),
                "replica": self.settings.kube.identity,
            }
            log.info("decision", **record)
            self._audit(record)

    def _audit(self, record: dict[str, object]) -> None:
        topic = self.settings.kafka.decisions_topic
        if topic is None or self._producer is None:
            return
        payload = json.dumps(record, default=str).encode()
        key = str(record["target"]).encode()
        task = asyncio.create_task(self._producer.send(topic, payload, key=key))
        self._audits.add(task)
        task.add_done_callback(self._audits.discard)
        task.add_done_callback(_log_audit_failure)

    # -- readiness and reload -------------------------------------------------------------------

    def _not_ready(self) -> list[str]:
        """Why this replica must not be ready: ready means the cluster cache is synced and the
        consumer was assigned its partitions and applied them up to the end offsets seen at
        start (complete windows), then stays within ``ready_max_lag``."""
        problems = list(self._crashed)
        if self._unrestored is not None:
            problems.append(self._unrestored)
        if not self.runtime.cluster.synced:
            problems.append("cluster cache not synced")
        if self._decisions_log is not None and (left := self._decisions_log.unassigned):
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
        """Validate the policy files and swap them in; keep the old policy if invalid."""
        policy, errors = check_policy(read_sources(self.settings.policies))
        if policy is None:
            self.metrics.policy_reloads.labels("rejected").inc()
            log.error("policy.rejected", errors=[str(e) for e in errors], kept=self.policy.digest())
            return False
        result = self.engine.reload(policy)
        if not result.accepted:
            self.metrics.policy_reloads.labels("rejected").inc()
            log.error("policy.rejected", errors=list(result.errors), kept=self.policy.digest())
            return False
        self.policy = policy
        self.runtime.reconfigure(policy)
        self.metrics.policy_reloads.labels("accepted").inc()
        self.metrics.set_policy(policy.metadata.name, policy.digest())
        log.info("policy.reloaded", policy=policy.metadata.name, policy_hash=policy.digest())
        return True


def _parse_record(value: bytes) -> LogRecord | None:
    """A decisions-log record as the ledger reads it; ``None`` for a dry run or garbage."""
    try:
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return None if raw.get("dry_run") else LogRecord.of(raw)
    except ValueError:
        log.warning("decisions_log.bad_record", record=value[:200])
        return None


def _log_audit_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("audit.send_failed", error=repr(exc))
