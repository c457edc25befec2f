"""`ebbtide run` under restarts, SIGTERM, broker outages and policy reloads."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from support.e2e import HERE, World, eventually, ready

pytestmark = pytest.mark.slow

LATENCY = "ebbtide.inference.latency"


def policy_with(tmp: Path, **spec: object) -> Path:
    """The end-to-end policy with some ``spec`` keys replaced."""
    doc = yaml.safe_load((HERE / "policy.yaml").read_text())
    doc["spec"].update(spec)
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def burst(world: World, count: int) -> None:
    """``count`` valid latency events as fast as librdkafka sends them."""
    producer = Producer({"bootstrap.servers": world.broker.bootstrap, "linger.ms": 20})
    payload = json.dumps(
        {"type": "inference.latency", "ts": time.time(), "service": "chat",
         "namespace": "serving", "latency_ms": 20.0}
    ).encode()  # fmt: skip
    for _ in range(count):
        producer.produce(LATENCY, payload, key=b"serving/chat")
        producer.poll(0)
    assert producer.flush(30) == 0


@pytest.mark.full_cluster
async def test_a_crash_and_restart_loses_no_event_and_repeats_no_action(
    world: World, tmp_path: Path
) -> None:
    """SIGKILL right after the controller acted, then a restart: the restarted replica re-reads
    its windows' worth of events (nothing lost: it ends caught up), and the action is not
    repeated — it reads its past actions back from the decisions log, so the service's cooldown
    and the budgets hold across the crash."""
    policy = policy_with(tmp_path, cooldowns={"service": "2m", "trainingGrow": "2m"})
    first = world.start(policy=policy, identity="crashy")
    await ready(first)
    await eventually(lambda: world.replicas("ml", "train") < 10, 20, lambda: world.latency(900))
    acted = [d for d in first.decisions() if d["action"] in ("scale", "evict")]
    assert acted
    replicas = (world.replicas("ml", "train"), world.replicas("serving", "chat"))
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)

    second = world.start(policy=policy, identity="crashy")
    await ready(second)
    for _ in range(10):  # the breach goes on after the restart, for 5 s
        world.latency(900)
        await asyncio.sleep(0.5)  # not a synchronisation: the pace of the breach
    assert [d for d in second.decisions() if d["outcome"] == "applied"] == []
    assert (world.replicas("ml", "train"), world.replicas("serving", "chat")) == replicas
    # Nothing lost: the restarted consumer ends with every message on the topic applied.
    await eventually(lambda: second.metric("ebbtide_consumer_lag", topic=LATENCY) == 0, 10)
    assert second.stop() == 0


async def test_sigterm_during_a_burst_stops_in_time_and_a_restart_rereads_the_window(
    world: World,
) -> None:
    """SIGTERM while a 60k-event burst is being consumed: the process exits 0 within its
    shutdown bound; the replica that replaces it is ready only once it has applied the whole
    burst (within its window, so nothing is lost) — and not a message more."""
    first = world.start(identity="burst")
    await ready(first)
    burst(world, 60_000)
    await eventually(lambda: first.metric("ebbtide_events_accepted_total", topic=LATENCY) > 0, 20)
    started = time.monotonic()
    assert first.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - started < 20  # shutdown_timeout_s

    second = world.start(identity="burst")
    await ready(second)
    assert second.metric("ebbtide_events_accepted_total", topic=LATENCY) == 60_000
    assert second.stop() == 0


async def test_readiness_drops_during_a_broker_outage_and_recovers(world: World) -> None:
    """With the broker gone /readyz answers 503 (and says why) while /healthz stays 200; when
    the broker is back the controller is ready again by itself."""
    controller = world.start(env={"EBBTIDE_HTTP__READY_MAX_FETCH_AGE_S": "3"})
    await ready(controller)
    world.broker.stop()
    await eventually(lambda: controller.get("/readyz")[0] == 503, 20)
    assert "no successful fetch" in controller.get("/readyz")[1]
    assert controller.get("/healthz")[0] == 200
    world.broker.start()
    await eventually(lambda: controller.get("/readyz")[0] == 200, 30)
    assert controller.stop() == 0


async def test_policy_hot_reload_swaps_valid_and_refuses_invalid(
    world: World, tmp_path: Path
) -> None:
    """Editing the mounted policy file swaps the policy (new hash in metrics); an invalid edit
    is refused with its errors and the previous policy stays active."""
    policy = policy_with(tmp_path)
    controller = world.start(policy=policy)
    await ready(controller)

    def active() -> set[str]:
        _, text = controller.get("/metrics")
        return {ln for ln in text.splitlines() if ln.startswith("ebbtide_policy_info{")}

    before = active()
    doc = yaml.safe_load(policy.read_text())
    doc["metadata"]["name"] = "e2e-v2"
    policy.write_text(yaml.safe_dump(doc))
    await eventually(lambda: any('name="e2e-v2"' in ln for ln in active()), 10)
    assert active() != before
    policy.write_text("apiVersion: ebbtide.io/v1alpha1\nkind: Policy\nspec: {pools: 7}\n")
    await eventually(
        lambda: controller.metric("ebbtide_policy_reloads_total", result="rejected") >= 1, 10
    )
    assert any('name="e2e-v2"' in ln for ln in active())
    assert "policy.rejected" in controller.log.read_text()
    assert controller.stop() == 0


@pytest.mark.full_cluster
async def test_two_replicas_one_leader_and_failover(world: World) -> None:
    """Two replicas consume the same events; only the leader's decisions reach the cluster
    (the follower's are refused as "not the leader"); when the leader is killed mid-incident,
    the follower takes over within the lease and carries the response on."""
    a = world.start(identity="replica-a")
    await ready(a)
    await eventually(lambda: a.metric("ebbtide_leader") == 1, 10)
    b = world.start(identity="replica-b")
    await ready(b)
    assert b.metric("ebbtide_leader") == 0
    await eventually(
        lambda: any(d["outcome"] == "applied" for d in a.decisions()),
        20,
        lambda: world.latency(900),
    )
    a.process.send_signal(signal.SIGKILL)
    a.process.wait(10)
    killed = time.monotonic()
    assert [d for d in b.decisions() if d["outcome"] != "refused"] == []
    await eventually(lambda: b.metric("ebbtide_leader") == 1, 15, lambda: world.latency(900))
    assert time.monotonic() - killed < 2 + 2 * 1 + 1.5  # lease + two retry periods + slack
    await eventually(
        lambda: any(d["outcome"] == "applied" for d in b.decisions()),
        30,
        lambda: world.latency(900),
    )
    assert b.stop() == 0
