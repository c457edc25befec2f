"""The controller SIGKILLed at random points during a burst of decisions, and during a MIG
conversion, then restarted with the same identity."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fault_support import (
    FLOW_ANNOTATION,
    applied,
    evictions,
    inconsistencies,
    kill,
    most_in_window,
    repeated,
    writes,
)

from support.e2e import HERE, World, eventually, pin_training, ready
from support.kubeapi_objects import labels_of
from support.mig_manager import CONFIG_LABEL, STATE_LABEL, Outcome

pytestmark = pytest.mark.slow

SEED = 8
EVICTIONS_PER_MINUTE = 4  # tests/e2e/policy.yaml: budgets
SCALE_STEPS_PER_MINUTE = 20


async def feed_breach(world: World, seconds: float) -> None:
    """Slow chat requests for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        world.latency(900, count=20)
        await asyncio.sleep(0.3)


@pytest.mark.full_cluster
async def test_sigkill_during_a_burst_of_decisions_repeats_nothing(world: World) -> None:
    """Random SIGKILLs while deciding: nothing evicted or applied twice, budgets hold."""
    rng = random.Random(SEED)
    started = time.monotonic()
    # Training may not shrink below 9 of 10 and has no maximum (Ebbtide would not grow it back,
    # so it is not shrunk further instead): relief needs evictions too (chat outranks it).
    bounds = {"ebbtide.io/min-replicas": "9", "ebbtide.io/max-replicas": None}
    await world.kubeapi.patch("Deployment", "ml", "train", {"metadata": {"annotations": bounds}})
    for _ in range(3):
        controller = world.start(identity="burst")
        await ready(controller)
        # Kill at a random moment of its first seconds of deciding (or of waiting to decide).
        deadline = time.monotonic() + 6
        while not controller.decisions() and time.monotonic() < deadline:
            world.latency(900, count=20)
            await asyncio.sleep(0.3)
        await feed_breach(world, rng.uniform(0.0, 1.5))
        kill(controller)
    last = world.start(identity="burst")
    await ready(last)
    await feed_breach(world, 5)
    assert last.stop() == 0
    # A loaded machine may stretch the run past one budget window: allow one budget a window.
    windows = math.ceil((time.monotonic() - started) / 60)

    evicted = evictions(world.kubeapi.requests)
    assert evicted, "the breach led to no eviction"
    assert max(evicted.values()) == 1, f"a pod evicted twice: {evicted}"
    assert sum(evicted.values()) <= EVICTIONS_PER_MINUTE * windows
    for name in evicted:
        assert world.kubeapi.get("Pod", *name.split("/")) is None
    done = applied(world.processes)
    assert repeated(done) == []
    scale_times = [d["ts"] for d in done if d["action"] == "scale"]
    evict_times = [d["ts"] for d in done if d["action"] == "evict"]
    assert most_in_window(evict_times, 60) <= EVICTIONS_PER_MINUTE
    assert most_in_window(scale_times, 60) <= SCALE_STEPS_PER_MINUTE
    assert len(world.kubeapi.objects("Pod", "serving")) == 2  # inference never evicted
    bounds = {"ml/train": (9, 10), "serving/chat": (2, 6)}
    assert inconsistencies(world, bounds) == []


def policy_with(tmp: Path, **spec: object) -> Path:
    """The end-to-end policy with some ``spec`` keys replaced."""
    doc = yaml.safe_load((HERE / "policy.yaml").read_text())
    doc["spec"].update(spec)
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.full_cluster
async def test_sigkill_between_an_eviction_and_its_record_keeps_the_budget(
    world: World, tmp_path: Path
) -> None:
    """SIGKILL between an eviction and its record: the restart still keeps the budget."""
    # Chat may grow to 10, four at a time; at most two evictions a minute.
    spec = yaml.safe_load((HERE / "policy.yaml").read_text())["spec"]
    spec["services"]["chat"]["replicas"]["max"] = 10
    spec["services"]["chat"]["scale"]["maxStep"] = 4
    spec["budgets"]["evictions"] = {"max": 2, "per": "1m"}
    policy = policy_with(tmp_path, services=spec["services"], budgets=spec["budgets"])
    # Training cannot shrink: only evictions free GPUs. The server evicts the first victim at
    # once but answers only after 8 s, long after the kill.
    await pin_training(world.kubeapi)
    fault = world.kubeapi.faults.add(
        method="POST", path_regex="/pods/train-[^/]+/eviction$", status=None, delay=8,
        commit=True,
    )  # fmt: skip
    first = world.start(identity="budget", policy=policy)
    await ready(first)

    def evicted_unanswered() -> bool:
        """The first eviction has been made (its pod is gone) and its answer is still held."""
        posts = writes(world.kubeapi.requests, "POST", "/eviction$", ok=False)
        return (
            fault.hits == 1
            and len(posts) == 1
            and posts[0].status is None
            and world.kubeapi.get("Pod", "ml", posts[0].path.split("/")[-2]) is None
        )

    await eventually(evicted_unanswered, 15, lambda: world.latency(900, count=20))
    kill(first)
    (victim,) = [
        r.path.split("/")[-2]
        for r in writes(world.kubeapi.requests, "POST", "/eviction$", ok=False)
    ]
    assert world.kubeapi.get("Pod", "ml", victim) is None  # the eviction happened

    second = world.start(identity="budget", policy=policy)
    await ready(second)
    await feed_breach(world, 5)
    assert second.stop() == 0
    gone = [
        p
        for p in (f"train-5d8f7-{i}" for i in range(10))
        if world.kubeapi.get("Pod", "ml", p) is None
    ]
    assert len(gone) <= 2, f"evicted {gone} within a minute; the budget is 2"


def gpu2(world: World) -> dict[str, Any]:
    node = world.kubeapi.get("Node", None, "gpu-2")
    assert node is not None
    return node


def flow_phase(world: World) -> str | None:
    raw = (gpu2(world)["metadata"].get("annotations") or {}).get(FLOW_ANNOTATION)
    return None if raw is None else str(json.loads(raw)["phase"])


@pytest.mark.parametrize("outcome", ["success", "failed"])
async def test_sigkill_during_a_mig_conversion_resumes_the_flow(
    world: World, outcome: Outcome
) -> None:
    """SIGKILLs mid-conversion: the flow resumes, each step written once, no cordon left."""
    world.mig.script("gpu-2", outcome, delay=4)
    node_path = "/api/v1/nodes/gpu-2$"
    world.kubeapi.faults.add(method="PATCH", path_regex=node_path, status=None, times=1)  # cordon
    label_write = world.kubeapi.faults.add(  # then hang the label write: the client gives up
        method="PATCH", path_regex=node_path, status=None, delay=30, times=1
    )

    def feed() -> None:
        world.utilization("gpu-0", 50)  # the pool's mean stays well under convertBelow (60%)
        world.utilization("gpu-1", 50)
        world.utilization("gpu-2", 0)

    first = world.start(identity="mig")
    await ready(first)
    await eventually(lambda: label_write.hits == 1, 30, feed)
    kill(first)
    assert gpu2(world)["spec"].get("unschedulable") is True
    assert flow_phase(world) == "draining"

    second = world.start(identity="mig")
    await ready(second)
    await eventually(lambda: labels_of(gpu2(world)).get(STATE_LABEL) == "pending", 20, feed)
    kill(second)
    assert flow_phase(world) == "reconfiguring"

    third = world.start(identity="mig")
    await ready(third)
    await eventually(lambda: flow_phase(world) is None, 20, feed)
    assert third.stop() == 0

    node = gpu2(world)
    labels = labels_of(node)
    assert not node["spec"].get("unschedulable")
    if outcome == "success":
        assert labels[CONFIG_LABEL] == "all-1g.10gb"
        assert labels["ebbtide.io/pool"] == "mig"
    else:
        assert CONFIG_LABEL not in labels  # restored: there was none before
        assert labels["ebbtide.io/pool"] == "whole"
    assert world.mig.applied == [("gpu-2", "all-1g.10gb", outcome)]
    # Each step written exactly once: cordon + record, the config label, finish or roll back.
    patches = writes(world.kubeapi.requests, "PATCH", node_path)
    assert [p.body.get("spec", {}).get("unschedulable") for p in patches] == [True, None, None]
    assert [CONFIG_LABEL in p.body["metadata"].get("labels", {}) for p in patches] == [
        False, True, outcome == "failed"
    ]  # fmt: skip
    assert inconsistencies(world, {}) == []
