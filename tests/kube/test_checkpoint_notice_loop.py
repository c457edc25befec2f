"""The checkpoint handshake through the process loop and the watch (issue 21, item 5): a breach
whose every victim is opted in gives one notice, waits for it round after round without
noticing another pod, and keeps chat's scale-up back until the pod is gone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.loop.port import ActionResult, Outcome
from controller.process.app import Controller
from policies.checkpoint import ACK, FOR, HANDSHAKE, NOTICE, stamp
from streams.events import InferenceLatency
from support.e2e import build_cluster, in_process_controller, pin_training
from support.kubeapi import KubeAPIServer

pytestmark = pytest.mark.slow


async def _round(controller: Controller) -> list[ActionResult]:
    controller.engine.observe(
        InferenceLatency(ts=time.time(), service="chat", namespace="serving",
                         samples_ms=[900.0] * 50)
    )  # fmt: skip
    results = await controller.evaluate_once()
    await asyncio.sleep(0.1)  # a pace, as the controller's own loop has: renewals run
    return results


def _noticed(kubeapi: KubeAPIServer) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: p["metadata"]["annotations"].get(FOR)
        for p in kubeapi.objects("Pod", "ml")
        if NOTICE in (p["metadata"].get("annotations") or {})
    }


async def test_one_notice_per_breach_and_the_scale_up_waits_for_it(
    kubeapi: KubeAPIServer, tmp_path: Path
) -> None:
    """Ten opted-in training pods fill the cluster, none may shrink: over a dozen rounds one
    pod is noticed (for chat, with an Event), none is evicted, and chat is not scaled onto
    GPUs that pod still holds (before: a new pod was noticed at every round)."""
    await build_cluster(kubeapi, full=True)
    await pin_training(kubeapi)
    for pod in kubeapi.objects("Pod", "ml"):
        patch = {"metadata": {"annotations": {HANDSHAKE: "true"}}}
        await kubeapi.patch("Pod", "ml", pod["metadata"]["name"], patch)
    async with in_process_controller(kubeapi, tmp_path) as controller:
        results: list[ActionResult] = []
        deadline = time.monotonic() + 10
        while not _noticed(kubeapi) and time.monotonic() < deadline:
            results += await _round(controller)
        assert _noticed(kubeapi), "no notice was given"
        for _ in range(12):
            results += await _round(controller)
    noticed = _noticed(kubeapi)
    assert list(noticed.values()) == ["serving/chat"], noticed
    assert len(kubeapi.objects("Pod", "ml")) == 10  # nobody evicted before the deadline
    given = [r for r in results if r.outcome is Outcome.IN_PROGRESS]
    assert [r.decision.target for r in given] == [f"ml/{name}" for name in noticed]
    scaled = [r for r in results if r.decision.target == "serving/chat"]
    assert scaled, "chat's scale-up was never decided"
    assert all(r.outcome is Outcome.REFUSED for r in scaled), [r.detail for r in scaled]
    assert [
        e["involvedObject"]["name"]
        for e in kubeapi.objects("Event", "ml")
        if e["reason"] == "EbbtidePreemptionNotice"
    ] == list(noticed)


async def test_the_leader_clears_a_notice_an_abandoned_preemption_left(
    kubeapi: KubeAPIServer, tmp_path: Path
) -> None:
    """A notice (and its ack) three days old is removed from the pod at the next tick, with no
    breach and no decision; a notice given a minute ago stays."""
    await build_cluster(kubeapi)
    old, fresh = (p["metadata"]["name"] for p in kubeapi.objects("Pod", "ml")[:2])
    days_ago = stamp(time.time() - 3 * 86400)
    for name, at in ((old, days_ago), (fresh, stamp(time.time() - 60))):
        notice = {HANDSHAKE: "true", NOTICE: at, FOR: "serving/chat", ACK: at}
        await kubeapi.patch("Pod", "ml", name, {"metadata": {"annotations": notice}})
    async with in_process_controller(kubeapi, tmp_path) as controller:
        assert await controller.evaluate_once() == []
    annotations = {
        p["metadata"]["name"]: p["metadata"].get("annotations") or {}
        for p in kubeapi.objects("Pod", "ml")
    }
    assert annotations[old] == {HANDSHAKE: "true"}
    assert NOTICE in annotations[fresh]
