"""One tick, the same for ``ebbtide run``, ``replay`` and ``simulate``: the one path from a
decision to the cluster.

A tick at ``now`` is:

1. **upkeep**: the runtime's time-driven work (a simulated clock moved to ``now``, MIG flows
   moved on); a flow still waiting is not news and is dropped;
2. **evaluate**: once the cluster's view is synced, the engine decides on its snapshot;
3. **carry out** (:meth:`Loop.carry_out`): in the engine's order, each decision through the
   cluster port, whose adapter passes it through the safety gate; before it, this replica must
   lead, the decisions log must have been read back and the decision's intent written ahead
   (where a journal exists), and a scale-up whose GPUs were not freed is refused;
4. **feedback** (:mod:`controller.loop.feedback`): what did not happen gets ``retry_at`` and
   ``hold_until`` and goes back to the engine; then the journal records every outcome.

Offline drivers run the same coroutine without an event loop (:func:`run_now`): the simulated
cluster never waits on I/O, so a replay pays no event-loop round trip per tick.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, Protocol, TypeVar

import structlog

from controller.loop.feedback import feed_back, settle
from controller.loop.port import (
    NOT_DONE,
    NOT_FREED,
    NOT_LEADER,
    ActionResult,
    ClusterRuntime,
    Outcome,
    Why,
)
from policies.decisions import Decision, Evict, Scale
from policies.engine import Engine
from policies.snapshot import Snapshot

__all__ = ["Instruments", "Journal", "Loop", "run_now"]

log = structlog.get_logger("ebbtide")

#: Freeing outcomes after which the GPUs are not free: not done, or under way (a checkpoint
#: notice: the pod runs until its checkpoint or deadline, and the scale-up waits for it).
_NOT_FREED: Final = NOT_DONE | {Outcome.IN_PROGRESS}

T = TypeVar("T")


class Journal(Protocol):
    """The decisions log as the tick uses it (the live process's; offline drivers have none)."""

    def refusal(self) -> str | None:
        """Why no action may be taken now (the log was not read back), or ``None``."""
        ...

    async def intend(self, decision: Decision) -> str | None:
        """Write ``decision``'s intent ahead of the action; why it could not be, or ``None``."""
        ...

    def settle(self, results: Sequence[ActionResult]) -> None:
        """Record the outcomes (after the engine was told)."""
        ...


class Instruments(Protocol):
    """Where the tick reports its timings (the process's metrics)."""

    def evaluated(self, seconds: float, decisions: Sequence[Decision]) -> None: ...

    def applied(self, decision: Decision, seconds: float) -> None: ...

    def settled(self, results: Sequence[ActionResult]) -> None: ...


class Loop:
    """The engine, a cluster runtime and, for the live process, the decisions journal."""

    def __init__(
        self,
        engine: Engine,
        runtime: ClusterRuntime,
        *,
        journal: Journal | None = None,
        instruments: Instruments | None = None,
        dry_run: bool = False,
        hold: Callable[[Decision], str | None] | None = None,
    ) -> None:
        self.engine = engine
        self.runtime = runtime
        self.journal = journal
        self.instruments = instruments
        self.dry_run = dry_run
        """Process-level dry-run: every decision is marked so before it is carried out."""
        self.hold = hold
        """Why a decision is held by its owner (a paused service, ``controller.process.status``),
        or ``None``: checked before its intent is written, a held one is refused."""

    async def tick(
        self, now: float, *, before: Callable[[Snapshot], None] | None = None
    ) -> list[ActionResult]:
        """One tick at ``now`` (see the module docstring); ``before`` sees the snapshot the
        engine is about to evaluate (a replay accounts and injects events there). Returns the
        upkeep's and the decisions' results, settled."""
        runtime = self.runtime
        # Upkeep reports a flow still waiting (IN_PROGRESS) every tick: not news, not recorded.
        results = [r for r in await runtime.tick(now) if r.outcome is not Outcome.IN_PROGRESS]
        cluster = runtime.cluster
        if cluster.synced:
            snapshot = cluster.snapshot()
            if before is not None:
                before(snapshot)
            started = time.perf_counter()
            decisions = self.engine.evaluate(now, snapshot)
            if self.instruments is not None:
                self.instruments.evaluated(time.perf_counter() - started, decisions)
            if decisions:
                if self.dry_run:
                    decisions = [dataclasses.replace(d, dry_run=True) for d in decisions]
                results.extend(await self.carry_out(decisions))
        results = settle(results, now=now)
        feed_back(self.engine, results)
        if self.instruments is not None:
            self.instruments.settled(results)
        if self.journal is not None:
            self.journal.settle(results)
        return results

    async def carry_out(self, decisions: Sequence[Decision]) -> list[ActionResult]:
        """Apply ``decisions`` in the engine's order, one by one. The engine frees GPUs for a
        service before scaling it up; when freeing was not done (a PDB, a refusal, a notice
        still running), the scale-up it was for is refused, so no inference pod is created
        without room (the scheduler might otherwise preempt training behind the PDB's back).
        A refusal decided here is reported to the cluster adapter like its own (a Kubernetes
        Event), except a follower's, which is not news."""
        runtime, journal = self.runtime, self.journal
        cluster = runtime.cluster
        unfreed: dict[str, str] = {}
        out: list[ActionResult] = []
        for d in decisions:
            if not runtime.is_leader():
                out.append(ActionResult(d, Outcome.REFUSED, NOT_LEADER, why=Why.NOT_LEADER))
                continue
            if journal is not None and (unrestored := journal.refusal()) is not None:
                out.append(ActionResult(d, Outcome.REFUSED, unrestored, why=Why.NOT_RESTORED))
                continue
            started = time.perf_counter()
            refused = None
            if isinstance(d, Scale) and d.to_replicas > d.from_replicas and d.cause in unfreed:
                refused = ActionResult(
                    d, Outcome.REFUSED, f"{NOT_FREED}: {unfreed[d.cause]}", why=Why.NOT_FREED
                )
            elif self.hold is not None and (held := self.hold(d)) is not None:
                refused = ActionResult(d, Outcome.REFUSED, held)
            elif journal is not None and (failed := await journal.intend(d)) is not None:
                detail = f"the intent was not recorded on the decisions log: {failed}"
                refused = ActionResult(d, Outcome.REFUSED, detail, why=Why.NOT_JOURNALED)
            if refused is not None:
                result = refused
                await cluster.report(result)
            else:
                result = await self._apply(d)
                if self.instruments is not None:
                    self.instruments.applied(d, time.perf_counter() - started)
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


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (a tick over the simulated cluster) to its end, with no
    event loop. Raises ``RuntimeError`` if it does wait: such work needs a real loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("run_now: the coroutine waited on I/O; run it on an event loop")
