"""Sharded ingest end to end on the embedded broker: aggregator processes in one consumer group
(``ebbtide run --role aggregate``), a decider merging their partials (:class:`PartialsFeed`),
checked against one engine fed every event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.process.aggregate import Aggregator, PartialsFeed, ensure_aggregates_topic
from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from policies.decisions import decision_to_dict
from policies.engine import Engine, ServiceStatus
from policies.loader import load_policy_text
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.consumer import ConsumerSettings, TopicPartition
from streams.events import Event, EventDecoder, InferenceLatency, encode_event
from streams.producer import KafkaProducer

SERVICES = 8
PARTITIONS = 4
ROOT = Path(__file__).resolve().parents[2]
POLICY = "\n".join(
    [
        "apiVersion: ebbtide.io/v1alpha1",
        "kind: Policy",
        "metadata: {name: shards}",
        "spec:",
        "  pools:",
        "    whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}",
        "  services:",
        *(
            f"    chat{i}: {{namespace: serving, pool: whole, replicas: {{min: 1, max: 8}}, "
            "scale: {maxStep: 2}, "
            "slo: {percentile: 99, objectiveMs: 100, window: 30s, resolution: 1s, "
            "breachAfter: 3s, minSamples: 10}}"
            for i in range(SERVICES)
        ),
        "  training: {selector: {ebbtide.io/class: training}}",
        "",
    ]
)


@dataclass(frozen=True)
class Names:
    """Topics and group of one test, apart from other tests on the shared broker."""

    tag: str

    @property
    def latency(self) -> str:
        return f"lat-{self.tag}"

    @property
    def gpu(self) -> str:
        return f"gpu-{self.tag}"

    @property
    def aggregates(self) -> str:
        return f"agg-{self.tag}"

    @property
    def group(self) -> str:
        return f"aggregators-{self.tag}"


@pytest.fixture
async def names(kafka_config: KafkaConfig) -> Names:
    names = Names(uuid.uuid4().hex[:8])
    await ensure_topics(kafka_config, [names.latency, names.gpu], partitions=PARTITIONS)
    await ensure_aggregates_topic(kafka_config, names.aggregates, retention_s=3600.0)
    return names


def policy(breach_after: str = "3s") -> Policy:
    """The aggregators' policy; a decider may wait longer before a breach (aggregators do not
    read ``breachAfter``)."""
    return load_policy_text(
        POLICY.replace("breachAfter: 3s", f"breachAfter: {breach_after}"), "shards.yaml"
    )


def snapshot() -> Snapshot:
    b = SnapshotBuilder()
    b.node("w0", gpus=32, labels={"ebbtide.io/pool": "whole"})
    for i in range(SERVICES):
        b.workload("serving", f"chat{i}", replicas=1, nodes=["w0"])
    return b.build()


class AggregatorProcess:
    """``ebbtide run --role aggregate`` in a child process; its log lines are kept."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[dict[str, object]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(raw))

    def assigned(self) -> list[str]:
        """The partitions of its latest assignment."""
        got = [ln["partitions"] for ln in self.lines if ln.get("event") == "ingest.assigned"]
        return list(got[-1]) if got else []  # type: ignore[call-overload]

    async def close(self, sig: int = signal.SIGTERM) -> None:
        if self.process.returncode is None:
            self.process.send_signal(sig)
        await asyncio.wait_for(self.process.wait(), 20)
        await self._reader


@pytest.fixture
async def aggregators(
    kafka_broker: EmbeddedBroker, names: Names, tmp_path: Path
) -> AsyncIterator[Callable[[], asyncio.Future[AggregatorProcess]]]:
    """Start aggregator processes of this test's group; all are stopped at the end."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    env = os.environ | {
        "EBBTIDE_KAFKA__LATENCY_TOPIC": names.latency,
        "EBBTIDE_KAFKA__GPU_TOPIC": names.gpu,
        "EBBTIDE_KAFKA__DEADLETTER_TOPIC": f"dead-{names.tag}",
        "EBBTIDE_SHARDS__AGGREGATES_TOPIC": names.aggregates,
        "EBBTIDE_SHARDS__GROUP_ID": names.group,
        "EBBTIDE_SHARDS__SESSION_TIMEOUT_S": "2",
        "EBBTIDE_SHARDS__HEARTBEAT_S": "0.5",
        "EBBTIDE_SHARDS__FLUSH_EVERY_S": "0.2",
    }
    started: list[AggregatorProcess] = []

    async def start() -> AggregatorProcess:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "controller", "run", "--role", "aggregate"),
            *("--policy", str(tmp_path / "policy.yaml"), "--bootstrap", kafka_broker.bootstrap),
            *("--metrics-address", "127.0.0.1:0"),
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        started.append(AggregatorProcess(process))
        return started[-1]

    yield lambda: asyncio.ensure_future(start())
    for agg in started:
        await agg.close(signal.SIGKILL)


async def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


class Decider:
    """An engine fed by a :class:`PartialsFeed` of the test's aggregates topic."""

    def __init__(self, config: KafkaConfig, names: Names, *, breach_after: str = "3s") -> None:
        self.engine = Engine(policy(breach_after))
        self.feed = PartialsFeed(
            config, names.aggregates, self.engine, rewind_s=120.0, on_merged=lambda: None
        )
        self._task = asyncio.create_task(self.feed.run())

    def covered(self, topic: str) -> int:
        """Events of ``topic`` the merged flushes cover, counted from offset 0 without gaps."""
        if self._task.done():
            self._task.result()  # raises what stopped the feed
        spans = self.feed.merger.covered()
        return sum(end for (t, _), (first, end) in spans.items() if t == topic and first == 0)

    async def close(self) -> None:
        self.feed.stop()
        await self._task


def latency(service: int, ms: float) -> InferenceLatency:
    return InferenceLatency(
        ts=time.time(), service=f"chat{service}", namespace="serving", latency_ms=ms
    )


async def produce(
    config: KafkaConfig, topic: str, events: list[Event], *, rounds: int, ms: Callable[[int], float]
) -> None:
    """``rounds`` rounds, 0.1 s apart, of 25 events per service, each service keyed by name."""
    async with KafkaProducer(config, linger_ms=5) as producer:
        for r in range(rounds):
            for s in range(SERVICES):
                for _ in range(25):
                    event = latency(s, ms(r))
                    events.append(event)
                    await producer.send(topic, encode_event(event), key=f"serving/chat{s}".encode())
            await producer.flush()
            await asyncio.sleep(0.1)


def in_process(
    config: KafkaConfig, names: Names, commit_interval_s: float, rules: Policy | None = None
) -> Aggregator:
    """An aggregator of the test's group in this process (with :func:`policy` by default)."""
    return Aggregator(
        config,
        rules or policy(),
        topic=names.aggregates,
        consumer=ConsumerSettings(
            group_id=names.group,
            topics=(names.latency, names.gpu),
            session_timeout_ms=2000,
            heartbeat_interval_ms=500,
            commit_interval_s=commit_interval_s,
        ),
        decoder=EventDecoder(
            topics={"inference.latency": names.latency, "gpu.utilization": names.gpu}
        ),
    )


def state(engine: Engine, now: float) -> list[tuple[str, int, float | None]]:
    return [(s.key, s.samples, s.quantile_ms) for s in engine.service_status(now)]


@pytest.mark.slow
async def test_a_killed_aggregator_loses_no_interval_and_counts_none_twice(
    kafka_config: KafkaConfig,
    names: Names,
    aggregators: Callable[[], asyncio.Future[AggregatorProcess]],
) -> None:
    """Two aggregator processes split four partitions; one is killed (SIGKILL) mid-stream
    while it owns partitions. Its partitions move to the survivor, the merged flushes cover
    every offset of every partition without a gap, and the decider's windows hold exactly what
    one engine fed every event holds: no interval lost, none counted twice."""
    a, b = await aggregators(), await aggregators()
    await until(lambda: bool(a.assigned()) and bool(b.assigned()), 30, "both to own partitions")
    decider = Decider(kafka_config, names)
    events: list[Event] = []
    producing = asyncio.create_task(
        produce(kafka_config, names.latency, events, rounds=30, ms=lambda r: 20.0 + r)
    )
    await until(lambda: len(events) > 1_500, 20, "events to flow")
    owned = a.assigned()
    a.process.kill()
    await producing
    await until(lambda: len(b.assigned()) == 2 * PARTITIONS, 20, "a rebalance")
    await until(lambda: decider.covered(names.latency) == len(events), 30, "full coverage")
    reference = Engine(policy())
    reference.observe_many(events)
    now = time.time()
    assert owned, "the killed aggregator owned partitions"
    assert state(decider.engine, now) == state(reference, now)
    await decider.close()
    await a.close(signal.SIGKILL)


@pytest.mark.slow
async def test_a_rebalance_during_a_breach_loses_nothing_and_the_decider_scales_the_same(
    kafka_config: KafkaConfig,
    names: Names,
    aggregators: Callable[[], asyncio.Future[AggregatorProcess]],
) -> None:
    """Services breach their SLO; a second aggregator joins while the breach's events are
    produced, so the group rebalances mid-breach. The decider decides the same scale-ups
    as one engine fed the events directly, and once the flushes cover every event it holds what
    that engine holds: the rebalance lost no interval and counted none twice. (How much later
    it decides is a latency, which a test on a loaded machine cannot bound.)"""
    first = await aggregators()
    await until(lambda: bool(first.assigned()), 30, "an assignment")
    decider = Decider(kafka_config, names, breach_after="6s")
    reference = Engine(policy(breach_after="6s"))
    # The second aggregator is started first and the breach begins once it has (a process
    # start takes seconds on a loaded machine); it then joins the group while the breach's
    # events are being produced.
    joining = await aggregators()
    await until(
        lambda: any(ln.get("event") == "aggregator.started" for ln in joining.lines),
        60,
        "the second aggregator to start",
    )
    events: list[Event] = []
    producing = asyncio.create_task(
        produce(kafka_config, names.latency, events, rounds=80, ms=lambda r: 300.0)
    )
    rebalanced = math.inf
    snap = snapshot()
    everyone = {f"serving/chat{i}" for i in range(SERVICES)}
    scaled: dict[str, set[str]] = {"reference": set(), "decider": set()}
    fed, give_up, produced = 0, math.inf, math.inf
    while (
        scaled["reference"] != everyone or scaled["decider"] != everyone or not joining.assigned()
    ):
        if producing.done():
            produced = min(produced, time.time())
            give_up = min(give_up, time.monotonic() + 30)
            assert time.monotonic() < give_up, f"not every service was scaled: {scaled}"
        await asyncio.sleep(0.05)
        now = time.time()
        reference.observe_many(events[fed:])
        fed = len(events)
        for who, engine in (("reference", reference), ("decider", decider.engine)):
            for d in engine.evaluate(now, snap):
                scaled[who].add(d.target)
        if joining.assigned():
            rebalanced = min(rebalanced, now)
    assert rebalanced <= produced, "the group did not rebalance while the breach was produced"
    await producing
    reference.observe_many(events[fed:])
    await until(lambda: decider.covered(names.latency) == len(events), 30, "full coverage")
    now = time.time()
    assert state(decider.engine, now) == state(reference, now)
    await decider.close()


@pytest.mark.slow
async def test_a_new_decider_reads_the_partials_back_and_decides_as_the_old_one(
    kafka_config: KafkaConfig, names: Names
) -> None:
    """Decider failover: an aggregator publishes a breach; a second decider that starts only
    after the first is gone reads the aggregates back and holds the same windows, so at the
    same instant it takes the same decisions."""
    aggregator = in_process(kafka_config, names, 0.2)
    running = asyncio.create_task(aggregator.run())
    events: list[Event] = []
    await produce(kafka_config, names.latency, events, rounds=10, ms=lambda r: 300.0)
    old = Decider(kafka_config, names)
    await until(lambda: old.covered(names.latency) == len(events), 30, "the old decider")
    await old.close()
    aggregator.stop()
    await running
    new = Decider(kafka_config, names)
    await until(lambda: new.feed.caught_up, 30, "the new decider to read back")
    start, snap = time.time(), snapshot()
    ticks = [start + 0.5 * i for i in range(10)]
    got = [[decision_to_dict(d) for d in new.engine.evaluate(t, snap)] for t in ticks]
    want = [[decision_to_dict(d) for d in old.engine.evaluate(t, snap)] for t in ticks]
    assert any(got)
    assert got == want
    await new.close()


@pytest.mark.slow
async def test_a_controller_in_the_decide_role_merges_partials_and_stops_cleanly(
    kafka_broker: EmbeddedBroker, names: Names
) -> None:
    """``--role decide`` wiring: the controller reads no events, gets ready once it has read
    the aggregates back, takes an aggregator's partials into its engine, and shuts down."""
    root = ROOT
    settings = load_settings(
        policies=[root / "tests" / "e2e" / "policy.yaml"],
        cluster=f"sim:{root / 'examples' / 'scenario-small.yaml'}",
        kafka={
            "bootstrap": kafka_broker.bootstrap,
            "latency_topic": names.latency,
            "gpu_topic": names.gpu,
            "deadletter_topic": f"dead-{names.tag}",
            "decisions_topic": None,
        },
        http={"address": "127.0.0.1:0"},
        shards={"role": "decide", "aggregates_topic": names.aggregates},
    )
    policy = load_policy_files(settings)
    controller = Controller(
        settings,
        SimRuntime.from_file(
            Path(settings.cluster[4:]), policy, dry_run=settings.dry_run_for(policy)
        ),
        policy,
    )
    running = asyncio.create_task(controller.run())
    await until(lambda: controller.http.port != 0 and not controller._not_ready(), 30, "ready")
    config = KafkaConfig(kafka_broker.bootstrap)
    aggregator = in_process(config, names, 0.2, policy)
    aggregating = asyncio.create_task(aggregator.run())
    async with KafkaProducer(config) as producer:
        for _ in range(50):
            event = InferenceLatency(
                ts=time.time(), service="chat", namespace="serving", latency_ms=20.0
            )
            await producer.send(names.latency, encode_event(event), key=b"serving/chat")

    def status() -> list[ServiceStatus]:
        return controller.engine.service_status(time.time())

    await until(
        lambda: any(s.key == "serving/chat" and s.samples == 50 for s in status()),
        30,
        "the partials",
    )
    aggregator.stop()
    await aggregating
    controller.stop()
    await asyncio.wait_for(running, 30)
    assert controller.crashed == []


def _children() -> set[int]:
    return {
        int(pid)
        for task in Path("/proc/self/task").iterdir()
        for pid in (task / "children").read_text().split()
    }


@pytest.mark.slow
async def test_folding_goes_on_while_a_flush_waits_for_the_broker() -> None:
    """A checkpoint seals, starts publishing and returns, so folding does not stop while the
    broker takes a second of backlog's flushes (it used to wait for every acknowledgement);
    what it returns to commit is only what the broker acknowledged."""
    before = _children()
    with EmbeddedBroker() as broker:
        (pid,) = _children() - before  # this test's own broker: it is paused below
        config, names = KafkaConfig(broker.bootstrap), Names(uuid.uuid4().hex[:8])
        await ensure_topics(config, [names.latency, names.gpu], partitions=PARTITIONS)
        await ensure_aggregates_topic(config, names.aggregates, retention_s=3600.0)
        aggregator = in_process(config, names, 600.0)  # checkpoints only when asked
        running = asyncio.create_task(aggregator.run())
        try:
            await produce(config, names.latency, [], rounds=1, ms=lambda _: 50.0)
            await until(lambda: aggregator.stats.folded == SERVICES * 25, 30, "every event folded")
            partitions = [TopicPartition(names.latency, p) for p in range(PARTITIONS)]
            os.kill(pid, signal.SIGSTOP)
            try:
                durable = await asyncio.wait_for(aggregator._checkpoint(partitions), 2.0)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert durable == {}, "nothing was acknowledged yet"
            assert aggregator.stats.flushes > 0, "the folds were sealed and are being published"

            for _ in range(400):  # then the flushes are acknowledged, and their offsets returned
                durable = await aggregator._checkpoint(partitions)
                if sum(durable.values()) == SERVICES * 25:
                    break
                await asyncio.sleep(0.05)
            assert sum(durable.values()) == SERVICES * 25
        finally:
            aggregator.stop()
            await asyncio.wait_for(running, 30)


async def test_a_batch_too_wide_for_one_message_is_published_in_several_flushes(
    kafka_config: KafkaConfig, names: Names
) -> None:
    """300 events of one service, each in an interval of its own with samples over ~1,000
    sketch bins (a backlog of a service answering in microseconds and in minutes), fold into
    ~3 MB within one fetched batch: more than a Kafka message holds. The fold used to be sealed
    whole, refused by the producer (message too large) and re-sent forever, so nothing of that
    partition was ever covered or committed again; now a fold that outgrows
    ``MAX_FLUSH_BYTES`` is sealed within the batch, at the event where it did."""
    now = time.time()
    samples = [0.001 * 1.1**k for k in range(0, 228, 3)]
    events = [
        InferenceLatency(ts=now - 300 + i, service="chat0", namespace="serving", samples_ms=samples)
        for i in range(300)
    ]
    async with KafkaProducer(kafka_config, linger_ms=50) as producer:
        for event in events:
            await producer.send(names.latency, encode_event(event), key=b"serving/chat0")
    aggregator = in_process(kafka_config, names, 0.2)
    running = asyncio.create_task(aggregator.run())
    decider = Decider(kafka_config, names)
    try:
        await until(lambda: decider.covered(names.latency) == 300, 30, "all 300 events covered")
        assert aggregator.stats.flushes >= 3, "~3 MB must take at least three flushes"
    finally:
        aggregator.stop()
        await asyncio.wait_for(running, 30)
        await decider.close()
