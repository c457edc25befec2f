"""A refusal decided in the process loop, not by the actuator, is an Event like any other:
the scale-up whose GPUs a PodDisruptionBudget kept from being freed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.loop.port import Outcome
from streams.events import InferenceLatency
from support.e2e import TRAINING, build_cluster, eventually, in_process_controller, pin_training
from support.kubeapi import KubeAPIServer

pytestmark = pytest.mark.slow


async def test_a_scale_up_refused_for_want_of_freed_gpus_writes_an_event(
    kubeapi: KubeAPIServer, tmp_path: Path
) -> None:
    """Every training pod is behind a PDB that allows no disruption: the evictions are blocked,
    so chat's scale-up is refused, and that refusal is an Event on chat's Deployment that names
    the blocked eviction."""
    await build_cluster(kubeapi, full=True)
    await pin_training(kubeapi)
    await kubeapi.create(
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": "pinned", "namespace": "ml"},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": TRAINING}}}
    )  # fmt: skip
    async with in_process_controller(kubeapi, tmp_path) as controller:
        refused = []
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            controller.engine.observe(
                InferenceLatency(ts=time.time(), service="chat", namespace="serving",
                                 samples_ms=[900.0] * 50)
            )  # fmt: skip
            results = await controller.evaluate_once()
            await asyncio.sleep(0.1)  # a pace, as the controller's own loop has: renewals run
            refused = [
                r
                for r in results
                if r.decision.target == "serving/chat"
                and r.outcome is Outcome.REFUSED
                and "were not freed" in r.detail
            ]
        assert refused, "chat's scale-up was never refused for want of freed GPUs"

        def event() -> list[dict[str, object]]:
            return [
                e
                for e in kubeapi.objects("Event", "serving")
                if e["reason"] == "EbbtideRefused" and e["involvedObject"]["name"] == "chat"  # type: ignore[index]
            ]

        await eventually(lambda: bool(event()), 5)
        assert "blocked" in str(event()[0]["message"])
