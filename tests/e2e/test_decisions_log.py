"""The decisions log as the one ledger: read back at start-up, followed live, shared with the
safety gate, written ahead of every action; on the embedded broker, through the controller's
own code (a simulated cluster behind it)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from controller.kube.migannotation import FlowRecord
from controller.loop.port import Outcome
from controller.process import journal
from controller.process.app import Controller, load_policy_files
from controller.process.settings import Settings, load_settings
from controller.simcluster.sim_runtime import SimRuntime
from policies.decisions import Decision, Evict, Explanation, MigConvert, Scale, decision_to_dict
from streams.broker import EmbeddedBroker
from streams.capture import TopicReader
from streams.connection import ensure_topics
from streams.events import InferenceLatency
from streams.producer import KafkaProducer
from streams.stream_errors import IncompleteRead, ProduceError
from support.e2e import HERE, eventually

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenario-small.yaml"
WHY = Explanation.of("test-rule", "because", inputs={"p99_ms": 912.5}, thresholds={"x": 1})


@pytest.fixture
def settings(kafka_broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """The end-to-end policy with two MIG conversions an hour, its own decisions topic."""
    text = (HERE / "policy.yaml").read_text()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        text.replace("migConversions: {max: 1, per: 1h}", "migConversions: {max: 2, per: 1h}")
    )
    return load_settings(
        policies=[policy],
        cluster=f"sim:{SCENARIO}",
        kafka={"bootstrap": kafka_broker.bootstrap, "decisions_topic": f"d-{uuid.uuid4().hex}"},
        kube={"identity": "replica-a"},
        http={"address": "127.0.0.1:0"},
    )  # fmt: skip


def make_controller(settings: Settings) -> Controller:
    policy = load_policy_files(settings)
    return Controller(
        settings,
        SimRuntime.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy)),
        policy,
    )


@pytest.fixture
async def write(settings: Settings) -> AsyncIterator[Callable[[Decision, str], object]]:
    """Write a record of ``decision`` with ``outcome`` as another replica (acknowledged)."""
    topic = settings.kafka.decisions_topic
    assert topic is not None
    await ensure_topics(settings.kafka.connection(), [topic])
    async with KafkaProducer(settings.kafka.connection()) as producer:

        async def send(decision: Decision, outcome: str) -> None:
            record = decision_to_dict(decision) | {"outcome": outcome, "replica": "replica-b"}
            payload = json.dumps(record).encode()
            await producer.send_and_wait(topic, payload, key=decision.target.encode())

        yield send


async def restored(settings: Settings) -> Controller:
    """A new replica that has read the decisions log back, as at start-up."""
    controller = make_controller(settings)
    await controller.journal.restore()
    assert controller.journal.reader is not None
    await controller.journal.reader.stop()
    return controller


def used(controller: Controller) -> dict[str, int]:
    return {b.name: b.used for b in controller.engine.budget_states(time.time())}


def evict(pod: str, at: float) -> Evict:
    return Evict(at, pod, "gpu-0", "ml/train", 1.0, WHY, cause="serving/chat")


def mig_flow(at: float) -> tuple[MigConvert, MigConvert]:
    """A conversion as decided, and as its flow rebuilds it on the tick it finishes."""
    decided = MigConvert(at, "gpu-3", "all-1g.10gb", "A100-80GB", WHY)
    record = FlowRecord.for_decision(
        decided, direction="convert", phase="reconfiguring", target="all-1g.10gb",
        previous=None, pool={}, previous_pool={}, was_cordoned=False, started=at + 0.4,
        deadline=at + 600,
    )  # fmt: skip
    return decided, FlowRecord.from_json(record.to_json()).decision("gpu-3")


async def test_a_follower_counts_every_eviction_of_a_round(
    settings: Settings, write: Callable[[Decision, str], object]
) -> None:
    """Four evictions the leader took in one round (one timestamp, four pods) are four in a
    follower's ledger, in the engine and in the safety gate alike."""
    controller = make_controller(settings)
    await controller.journal.restore()
    follower = asyncio.create_task(controller.journal.follow())
    try:
        now = time.time()
        for i in range(4):
            await write(evict(f"ml/train-{i}", now), "intent")  # type: ignore[misc]
        sentinel = Scale(now, "ml/train", "Deployment", 10, 6, "training", WHY, cause="x/y")
        await write(sentinel, "applied")  # type: ignore[misc]
        await eventually(lambda: used(controller)["scale_steps"] == 1, 20)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    assert used(controller)["evictions"] == 4
    gate = controller.runtime.gate  # type: ignore[attr-defined]
    assert gate.budgets.evictions.used(time.time()) == 4


async def test_a_mig_flow_finished_later_counts_once_and_a_failed_one_not_at_all(
    settings: Settings, write: Callable[[Decision, str], object]
) -> None:
    """Intent and start at decision time, the outcome on a later tick under the flow's rebuilt
    decision: a restarted replica counts one conversion, not two; a flow that rolled back
    counts none. The rebuilt decision keeps the GPU model, inputs and thresholds."""
    now = time.time()
    ok, ok_finished = mig_flow(now - 120)
    bad, bad_finished = mig_flow(now - 60)
    assert ok_finished.id == ok.id
    assert decision_to_dict(ok_finished) | {"ts": None} == decision_to_dict(ok) | {"ts": None}
    for decision, finished, outcome in (
        (ok, ok_finished, "applied"),
        (bad, bad_finished, "failed"),
    ):
        await write(decision, "intent")  # type: ignore[misc]
        await write(decision, "in_progress")  # type: ignore[misc]
        await write(finished, outcome)  # type: ignore[misc]
    controller = await restored(settings)
    assert used(controller)["mig_conversions"] == 1


async def test_a_restarted_gate_remembers_what_was_spent(
    settings: Settings, write: Callable[[Decision, str], object]
) -> None:
    """The gate's budgets come from the log at start-up: an eviction the engine did not decide
    (a MIG flow's drain) is refused when the log says the budget is spent."""
    now = time.time()
    for i in range(4):
        await write(evict(f"ml/train-{i}", now - 10), "applied")  # type: ignore[misc]
    controller = await restored(settings)
    gate = controller.runtime.gate  # type: ignore[attr-defined]
    with gate.hold(evict("ml/drained", now)) as permit:
        verdict = permit.reserve()
    assert verdict.outcome is Outcome.REFUSED
    assert "evictions budget spent" in verdict.reason


class FlakyProducer(KafkaProducer):
    """The real producer, whose acknowledgements fail the first ``failures`` times."""

    def __init__(self, inner: KafkaProducer, failures: int) -> None:
        self._inner, self.failures, self.calls = inner, failures, 0

    async def send_and_wait(self, topic: str, value: bytes | None, **kw: object) -> None:  # type: ignore[override]
        self.calls += 1
        if self.calls <= self.failures:
            raise ProduceError(f"{topic}: not acknowledged: KafkaTimeoutError()")
        await self._inner.send_and_wait(topic, value, **kw)  # type: ignore[arg-type]


async def breach_until_decided(controller: Controller) -> list[object]:
    """Slow chat traffic until the controller decides; the results of that round."""
    for _ in range(60):
        now = time.time()
        controller.engine.observe(
            InferenceLatency(ts=now, service="chat", namespace="serving", samples_ms=[900.0] * 50)
        )
        results = await controller.evaluate_once()
        if results:
            return list(results)
        await asyncio.sleep(0.1)  # traffic at its real pace: SLO windows run on the clock
    raise AssertionError("no decision within 6 s of breach")


@pytest.mark.parametrize(("failures", "outcome"), [(1, Outcome.APPLIED), (99, Outcome.REFUSED)])
async def test_an_unacknowledged_intent_is_retried_then_refuses_the_action(
    settings: Settings, failures: int, outcome: Outcome
) -> None:
    """A broker hiccup on the write-ahead intent is retried; when it persists, that action is
    refused with the reason (nothing written to the cluster) and the controller keeps going."""
    controller = make_controller(settings)
    async with KafkaProducer(settings.kafka.connection()) as producer:
        flaky = FlakyProducer(producer, failures)
        controller.journal.producer = flaky
        before = controller.runtime.cluster.snapshot()  # type: ignore[attr-defined]
        results = await breach_until_decided(controller)
    first = results[0]
    assert first.outcome is outcome, first  # type: ignore[attr-defined]
    if outcome is Outcome.REFUSED:
        assert "intent was not recorded" in first.detail  # type: ignore[attr-defined]
        assert flaky.calls >= 3 * len(results)
        assert controller.runtime.cluster.snapshot() is before  # type: ignore[attr-defined]
        assert used(controller)["scale_steps"] == 0
    assert not controller.crashed


async def test_an_incomplete_read_back_is_not_used_and_no_action_is_taken_until_complete(
    settings: Settings,
    write: Callable[[Decision, str], object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decisions log that could not be read to its end is not guessed from: the replica is
    unready and refuses every action with the reason, tries again, and once the read is
    complete counts what the log holds and acts."""
    now = time.time()
    for i in range(4):
        await write(evict(f"ml/train-{i}", now - 10), "applied")  # type: ignore[misc]
    real_since = TopicReader.since
    calls = []

    async def since_once_incomplete(self: TopicReader, since_s: float, **kw: float) -> list[bytes]:
        calls.append(since_s)
        if len(calls) == 1:
            raise IncompleteRead(self.topic, progress={0: (1, 4)}, timeout_s=15)
        return await real_since(self, since_s, **kw)

    monkeypatch.setattr(TopicReader, "since", since_once_incomplete)
    monkeypatch.setattr(journal, "RESTORE_RETRY_S", 0.05)
    controller = make_controller(settings)
    await controller.journal.restore()
    assert used(controller)["evictions"] == 0  # nothing of the partial read was used
    (problem,) = [p for p in controller._not_ready() if "decisions log" in p]
    assert "partition 0 at 1/4" in problem
    results = await breach_until_decided(controller)
    assert {r.outcome for r in results} == {Outcome.REFUSED}  # type: ignore[attr-defined]
    assert all("not read back" in r.detail for r in results)  # type: ignore[attr-defined]
    follower = asyncio.create_task(controller.journal.follow())
    try:
        await eventually(lambda: used(controller)["evictions"] == 4, 10)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    assert not [p for p in controller._not_ready() if "decisions log" in p]
