"""The decisions log across a change of leader and a restart, on the embedded broker through
the controller's own code (a simulated cluster behind it, a fake clock in front): an intent
always gets an outcome, so the next leader never charges an action that did not happen; and a
training grow's pool cooldown survives a restart (issue 21, items 12 and 13)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult, Outcome
from controller.process.app import Controller, load_policy_files
from controller.process.settings import Settings, load_settings
from controller.simcluster.sim_runtime import SimRuntime
from policies.decisions import Decision, Scale
from streams.broker import EmbeddedBroker
from streams.capture import TopicReader
from streams.events import InferenceLatency
from streams.producer import KafkaProducer
from support.e2e import HERE
from support.engine_probes import cooldown_remaining

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenario-small.yaml"


class Clock:
    """Fake time, moved by the test: the controller's, the engine's and the simulator's."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lease:
    """Leadership, as the runtime and its safety gate both see it."""

    def __init__(self) -> None:
        self.held = True

    def __call__(self) -> bool:
        return self.held


class LeaderRuntime(SimRuntime):
    """The simulated cluster whose leadership the test can take away."""

    def __init__(self, settings: Settings, lease: Lease) -> None:
        policy = load_policy_files(settings)
        base = SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
        super().__init__(base.cluster.sim, SafetyGate(policy, is_leader=lease))  # type: ignore[attr-defined]
        self.lease = lease

    def is_leader(self) -> bool:
        return self.lease()


class AfterAck(KafkaProducer):
    """The real producer; ``then`` runs once the broker has acknowledged an intent."""

    def __init__(self, inner: KafkaProducer, then: Callable[[], None]) -> None:
        self._inner, self._then = inner, then

    async def send_and_wait(self, topic: str, value: bytes | None, **kw: object) -> None:  # type: ignore[override]
        await self._inner.send_and_wait(topic, value, **kw)  # type: ignore[arg-type]
        self._then()

    async def send(self, topic: str, value: bytes | None, **kw: object) -> None:  # type: ignore[override]
        await self._inner.send(topic, value, **kw)  # type: ignore[arg-type]


def settings_for(broker: EmbeddedBroker, tmp_path: Path, **swaps: str) -> Settings:
    """The end-to-end policy with the given text swapped, its own decisions topic."""
    text = (HERE / "policy.yaml").read_text()
    for old, new in swaps.items():
        assert old in text
        text = text.replace(old, new)
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    return load_settings(
        policies=[policy],
        cluster=f"sim:{SCENARIO}",
        kafka={"bootstrap": broker.bootstrap, "decisions_topic": f"d-{uuid.uuid4().hex}"},
        kube={"identity": "replica-a"},
        http={"address": "127.0.0.1:0"},
    )  # fmt: skip


async def restored(settings: Settings, clock: Clock) -> Controller:
    """A new replica that has read the decisions log back at ``clock``, as at start-up."""
    policy = load_policy_files(settings)
    runtime = SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
    controller = Controller(settings, runtime, policy, clock=clock)
    await controller.journal.restore()
    assert controller.journal.reader is not None
    await controller.journal.reader.stop()
    return controller


async def written(controller: Controller, producer: KafkaProducer) -> None:
    """Every record the controller queued is on the broker."""
    await asyncio.gather(*controller.journal.audits)
    await producer.flush()


async def first_round(controller: Controller, clock: Clock) -> list[ActionResult]:
    """Slow chat traffic, one fake second at a time, until the controller decides."""
    for _ in range(10):
        clock.now += 1.0
        controller.engine.advance(clock.now)
        controller.engine.observe(
            InferenceLatency(
                ts=clock.now, service="chat", namespace="serving", samples_ms=[900.0] * 50
            )
        )
        if results := await controller.evaluate_once():
            return results
    raise AssertionError("no decision within 10 s of breach")


async def outcomes(settings: Settings) -> dict[str, list[str]]:
    """Decision id → the outcomes the decisions log holds for it, in order."""
    assert settings.kafka.decisions_topic is not None
    reader = TopicReader(settings.kafka.connection(), settings.kafka.decisions_topic)
    await reader.start()
    try:
        records = [json.loads(v) for v in await reader.since(0.0)]
    finally:
        await reader.stop()
    out: dict[str, list[str]] = {}
    for r in records:
        out.setdefault(r["id"], []).append(r["outcome"])
    return out


def budgets_used(controller: Controller, now: float) -> dict[str, int]:
    return {b.name: b.used for b in controller.engine.budget_states(now)}


@pytest.mark.parametrize("path", ["leadership-lost", "adapter-raised"])
async def test_an_intent_always_gets_an_outcome_so_the_next_leader_charges_nothing(
    kafka_broker: EmbeddedBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """Leadership lost right after an acknowledged intent (the gate then refuses), or the
    cluster adapter raising: the action did not happen, and the log says so, so a replica
    that reads the log back counts no budget unit and no cooldown for it."""
    settings = settings_for(kafka_broker, tmp_path, **{"service: 1s": "service: 5m"})
    lease = Lease()
    runtime = LeaderRuntime(settings, lease)
    clock = Clock(runtime.cluster.sim.now)  # type: ignore[attr-defined]
    leader = Controller(settings, runtime, load_policy_files(settings), clock=clock)
    if path == "adapter-raised":

        async def broken(decisions: list[Decision]) -> list[ActionResult]:
            raise RuntimeError("the adapter broke")

        monkeypatch.setattr(runtime.cluster, "apply", broken)
    lose = (lambda: setattr(lease, "held", False)) if path == "leadership-lost" else lambda: None
    async with KafkaProducer(settings.kafka.connection()) as producer:
        leader.journal.producer = AfterAck(producer, lose)
        first, *_ = await first_round(leader, clock)
        # a follower now: it decides again at once and is refused before writing an intent
        again = await first_round(leader, clock) if path == "leadership-lost" else []
        await written(leader, producer)
    assert first.outcome is (Outcome.REFUSED if path == "leadership-lost" else Outcome.FAILED)
    assert not leader.crashed
    log = await outcomes(settings)
    assert log[first.decision.id] == ["intent", first.outcome.value]
    assert all(r.decision.id not in log for r in again)  # a follower's refusal: not recorded
    successor = await restored(settings, clock)
    assert successor.engine.ledger.verdict(first.decision.id) == "not_done"
    assert budgets_used(successor, clock.now) == {
        "evictions": 0,
        "scale_steps": 0,
        "mig_conversions": 0,
    }
    assert cooldown_remaining(successor.engine, "serving/chat", clock.now) == 0.0


async def grows(controller: Controller, clock: Clock, *, seconds: int) -> list[ActionResult]:
    """Evaluate once a fake second for ``seconds``: the training grows carried out."""
    out = []
    for _ in range(seconds):
        clock.now += 1.0
        results = await controller.evaluate_once()
        out += [r for r in results if r.decision.explanation.rule == "grow-training"]
    return out


async def test_a_grow_right_before_a_restart_is_not_repeated_within_the_pools_cooldown(
    kafka_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A replica restarted an hour after a grow, with a two-hour training-grow cooldown and
    budgets of at most an hour, reads the grow back and does not grow the pool again until
    the cooldown has passed."""
    settings = settings_for(kafka_broker, tmp_path, **{"trainingGrow: 2s": "trainingGrow: 2h"})
    policy = load_policy_files(settings)
    runtime = SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
    clock = Clock(runtime.cluster.sim.now)  # type: ignore[attr-defined]
    before = Controller(settings, runtime, policy, clock=clock)
    async with KafkaProducer(settings.kafka.connection()) as producer:
        before.journal.producer = producer
        (grown,) = await grows(before, clock, seconds=5)
        await written(before, producer)
    assert grown.outcome is Outcome.APPLIED
    assert isinstance(grown.decision, Scale)
    assert grown.decision.pool == "whole"
    clock.now = grown.decision.at + 3700  # past every budget window: only the cooldown holds
    after = await restored(settings, clock)
    assert await grows(after, clock, seconds=10) == []
    clock.now = grown.decision.at + 7200 - 1
    (again,) = await grows(after, clock, seconds=5)
    assert again.decision.at >= grown.decision.at + 7200
