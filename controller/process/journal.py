"""The decisions journal: the controllers' shared memory of what was done, on the decisions log
(``ebbtide.decisions``), and the one source of the budget ledger (:class:`policies.budgets.Ledger`,
shared by the engine and the safety gate).

* **Write ahead.** The leader writes an acknowledged *intent* record before each write to the
  cluster (:meth:`DecisionsJournal.intend`), and the outcome after
  (:meth:`DecisionsJournal.settle`), both under the decision's id. An intent the broker does
  not acknowledge after :data:`INTENT_ATTEMPTS` tries refuses that action, with the reason;
  the process stays up.
* **Read back.** At start every replica reads the log back over the longest budget or cooldown
  window (:meth:`DecisionsJournal.restore`); a read that could not reach the log's end is not
  used (part of the log would undercount what was spent): the replica says so, refuses to act
  (:meth:`DecisionsJournal.refusal`) and tries again.
* **Follow.** While running, every replica follows the log, its own records included (reading
  a record twice changes nothing), so budgets and cooldowns hold across restarts, crashes in the
  middle of a write and changes of leader: an action is never repeated because the replica
  that took it is gone.

Every outcome is also one ``decision`` log line. A follower's "not the leader" refusals are
neither logged nor recorded (it re-decides every tick), except after an intent of this
replica's (leadership lost between the intent and the write): an intent without an outcome
counts, and the next leader would charge a budget unit and a whole cooldown for an action that
never happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import structlog
import tenacity

from controller.loop.port import ActionResult, Outcome, Why
from controller.process.settings import Settings
from policies.budgets import LogRecord
from policies.decisions import Decision, decision_to_dict
from policies.engine import Engine
from policies.model import Policy
from streams.capture import TopicReader
from streams.producer import KafkaProducer
from streams.stream_errors import IncompleteRead, ProduceError

__all__ = ["INTENT_ATTEMPTS", "RESTORE_RETRY_S", "DecisionsJournal", "parse_record"]

log = structlog.get_logger("ebbtide")

#: Tries to have the broker acknowledge an intent record before the action is refused.
INTENT_ATTEMPTS: Final = 3
#: Seconds between tries to read the decisions log back after an incomplete read.
RESTORE_RETRY_S: Final = 5.0


def parse_record(value: bytes) -> LogRecord | None:
    """A decisions-log record as the ledger reads it; ``None`` for a dry run or garbage."""
    try:
        raw = json.loads(value)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return None if raw.get("dry_run") else LogRecord.of(raw)
    except ValueError:
        log.warning("decisions_log.bad_record", record=value[:200])
        return None


def _horizon(policy: Policy) -> float:
    """How far back the log is read: the longest budget or cooldown window."""
    spec = policy.spec
    return max(
        spec.budgets.evictions.per,
        spec.budgets.scale_steps.per,
        spec.budgets.mig_conversions.per,
        spec.cooldowns.service,
        spec.cooldowns.training_grow,
        *(s.cooldown or 0.0 for s in spec.services.values()),
    )


class DecisionsJournal:
    """One replica's view of the decisions log (see the module docstring). Without a decisions
    topic it only logs outcomes."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        policy: Callable[[], Policy],
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._policy = policy
        self._clock = clock
        self.producer: KafkaProducer | None = None
        """Set once the process's producer is open (intents and outcomes go through it)."""
        self.reader: TopicReader | None = None
        self.unrestored: str | None = None
        """Why the decisions log has not been read back (no action until it has)."""
        self._intended: set[str] = set()
        """Decisions whose intent the broker acknowledged and whose outcome is not recorded."""
        self.audits: set[asyncio.Task[None]] = set()
        """Outcome records in flight (awaited at shutdown)."""
        self.observers: list[Callable[[Mapping[str, object]], None]] = []
        """Told of every record: this replica's outcomes, and each one read from the log (any
        replica's; ``/status`` keeps each service's last decision from them)."""

    @property
    def topic(self) -> str | None:
        return self._settings.kafka.decisions_topic

    # -- read back and follow -------------------------------------------------------------------

    async def restore(self) -> None:
        """Start reading the decisions log and read it back (:meth:`read_back`)."""
        if self.topic is None:
            return
        kafka = self._settings.kafka
        self.reader = TopicReader(
            kafka.connection(), self.topic, partitions_refresh_s=kafka.partitions_refresh_s
        )
        await self.reader.start()
        await self.read_back()

    async def read_back(self) -> None:
        """Read the log back over the longest budget or cooldown window into the ledger."""
        assert self.reader is not None
        horizon = _horizon(self._policy())
        try:
            values = await self.reader.since(self._clock() - horizon)
        except IncompleteRead as exc:
            self.unrestored = f"the decisions log was not read back: {exc}"
            log.error("restore.incomplete", error=str(exc), retry_in_s=RESTORE_RETRY_S)
            return
        for value in values:
            self._on_record(value)
        self.unrestored = None
        log.info("restore.done", records=len(values), horizon_s=horizon)

    def _on_record(self, value: bytes) -> None:
        """One decisions-log record, at start-up or live (any replica's, this one's too)."""
        if (rec := parse_record(value)) is not None:
            self._engine.record(rec)
        if self.observers:
            with contextlib.suppress(ValueError):  # parse_record has said what was wrong
                if isinstance(raw := json.loads(value), dict):
                    for observe in self.observers:
                        observe(raw)

    async def follow(self) -> None:
        """Retry an incomplete read back, then follow the log until cancelled."""
        if self.reader is None:
            await asyncio.Event().wait()  # no decisions log configured: nothing to follow
            return
        try:
            while self.unrestored is not None:
                await asyncio.sleep(RESTORE_RETRY_S)
                await self.read_back()
            await self.reader.follow(self._on_record)
        finally:
            await self.reader.stop()

    # -- the tick's journal ---------------------------------------------------------------------

    def refusal(self) -> str | None:
        return self.unrestored

    async def intend(self, decision: Decision) -> str | None:
        """Write ahead: record the action on the decisions log, acknowledged, *before* it is
        carried out, so a replica that crashes while the write is in flight still counts it
        against budgets and cooldowns after a restart. A later record of the same decision id
        says whether it happened; without one it is assumed to have. Returns why the record
        could not be written (after :data:`INTENT_ATTEMPTS` tries), or ``None``."""
        s = self._settings
        producer = self.producer
        if self.topic is None or producer is None or decision.dry_run or s.dry_run:
            return None
        record = decision_to_dict(decision) | {"outcome": "intent", "replica": s.kube.identity}
        payload = json.dumps(record, default=str).encode()
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(INTENT_ATTEMPTS),
                wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
                retry=tenacity.retry_if_exception_type(ProduceError),
                reraise=True,
            ):
                with attempt:
                    await producer.send_and_wait(self.topic, payload, key=decision.target.encode())
        except ProduceError as exc:
            log.error("decisions_log.intent_failed", target=decision.target, error=str(exc))
            return str(exc)
        self._intended.add(decision.id)
        return None

    def settle(self, results: Sequence[ActionResult]) -> None:
        """One log line and one decisions-log record per outcome (see the module docstring)."""
        for r in results:
            intended = r.decision.id in self._intended
            self._intended.discard(r.decision.id)
            if r.outcome is Outcome.REFUSED and r.why is Why.NOT_LEADER and not intended:
                continue  # a follower re-decides every tick: counted, not logged or recorded
            record = decision_to_dict(r.decision) | {
                "outcome": r.outcome.value,
                "detail": r.detail,
                "wasted_gpu_hours": r.wasted_gpu_hours,
                "policy_hash": self._policy().digest(),
                "replica": self._settings.kube.identity,
            }
            log.info("decision", **record)
            for observe in self.observers:
                observe(record)
            self._audit(record)

    def _audit(self, record: dict[str, object]) -> None:
        if self.topic is None or self.producer is None:
            return
        payload = json.dumps(record, default=str).encode()
        key = str(record["target"]).encode()
        task = asyncio.create_task(self.producer.send(self.topic, payload, key=key))
        self.audits.add(task)
        task.add_done_callback(self.audits.discard)
        task.add_done_callback(_log_audit_failure)

    @property
    def unassigned(self) -> object:
        """Decisions-log partitions not read (readiness), or a falsy value."""
        return self.reader.unassigned if self.reader is not None else None


def _log_audit_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("audit.send_failed", error=repr(exc))
