"""The broker killed (SIGKILL) and restarted under a consuming controller.

The fault suite (issue 8), one file per fault: the broker (here), the controller killed during
decisions and during a MIG conversion (``test_controller_kills``), the Kubernetes API failing
(``test_api_faults``), arbitrary input to the decoders (``test_fuzz``). The leader killed while
another replica follows is tests/e2e/test_run_resilience.py::
test_two_replicas_one_leader_and_failover. Each asserts nothing lost and nothing repeated.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from confluent_kafka import Producer
from fault_support import (
    LATENCY,
    SteadyStream,
    applied,
    repeated,
    topic_messages,
    writes,
)

from support.e2e import World, eventually, ready

pytestmark = pytest.mark.slow


async def test_broker_sigkill_mid_stream_loses_nothing_and_repeats_nothing(
    durable_world: World,
) -> None:
    """Broker SIGKILLed mid-stream: readiness dips and returns, all applied, nothing twice."""
    world = durable_world
    controller = world.start(identity="durable", env={"EBBTIDE_HTTP__READY_MAX_FETCH_AGE_S": "2"})
    await ready(controller)
    stream = SteadyStream(world.broker.bootstrap, rate=200)
    stream.start()
    try:
        await eventually(
            lambda: controller.metric("ebbtide_events_accepted_total", topic=LATENCY) > 200, 10
        )
        world.broker.stop(kill=True)
        await eventually(lambda: controller.get("/readyz")[0] == 503, 15)
        assert "no successful fetch" in controller.get("/readyz")[1]
        assert controller.get("/healthz")[0] == 200
        world.broker.start()
        await eventually(lambda: controller.get("/readyz")[0] == 200, 30)
        await asyncio.sleep(1.0)  # the stream goes on after the broker is back
    finally:
        stream.stop()
    assert (stream.errors, stream.acked) == ([], stream.produced)

    # Nothing lost: every produced event is in the log, and the controller applied the log to
    # its end: no lag left (its position is the log's end; it keeps no group offsets, see
    # docs/limits.md) and at least as many events accepted as the log holds (a killed broker
    # can leave a hole of offsets, so the end offset is not the count).
    log = await topic_messages(world, LATENCY)
    assert {json.loads(value)["seq"] for _, value in log} == set(range(stream.produced))
    await eventually(lambda: controller.metric("ebbtide_consumer_lag", topic=LATENCY) == 0, 15)
    assert controller.metric("ebbtide_events_accepted_total", topic=LATENCY) >= len(log)
    assert controller.stop() == 0

    # Nothing repeated: each applied action is distinct, and so is each write the API saw.
    done = applied([controller])
    assert done, "the breach led to no action"
    assert repeated(done) == []
    chat = [
        r.body["spec"]["replicas"] for r in writes(world.kubeapi.requests, "PATCH", "chat/scale$")
    ]
    assert len(chat) == len(set(chat)) == len([d for d in done if d["target"] == "serving/chat"])


async def test_a_poison_message_is_dead_lettered_not_fatal(world: World) -> None:
    """Invalid UTF-8 inside a JSON string is rejected; the controller keeps consuming."""
    controller = world.start(identity="poison")
    await ready(controller)
    producer = Producer({"bootstrap.servers": world.broker.bootstrap, "log_level": 0})
    producer.produce(LATENCY, b'{"type": "\x80inference.latency", "ts": 1.0}', key=b"serving/chat")
    assert producer.flush(10) == 0
    world.latency(40, count=5)
    await eventually(
        lambda: (
            controller.process.poll() is not None
            or controller.metric("ebbtide_events_accepted_total", topic=LATENCY) >= 5
        ),
        15,
    )
    assert controller.process.poll() is None, controller.log.read_text()[-2000:]
    assert controller.get("/healthz")[0] == 200
    assert controller.stop() == 0
