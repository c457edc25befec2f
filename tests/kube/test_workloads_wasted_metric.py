"""Wasted GPU-hours reach the controller's metrics: an eviction the engine decides, applied by
the Kubernetes actuator, adds its waste to ``ebbtide_preemption_wasted_gpu_hours_total``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from controller.loop.port import ActionResult, Outcome
from streams.events import InferenceLatency
from support.e2e import build_cluster, in_process_controller, pin_training
from support.kubeapi import KubeAPIServer

pytestmark = pytest.mark.slow


async def test_evictions_count_their_wasted_gpu_hours(
    kubeapi: KubeAPIServer, tmp_path: Path
) -> None:
    """Training pinned at its floor must be evicted for chat; each applied eviction reports the
    GPU-hours since its pod started, and the counter is their sum."""
    await build_cluster(kubeapi, full=True)
    await pin_training(kubeapi)
    async with in_process_controller(kubeapi, tmp_path) as controller:
        evicted: list[ActionResult] = []
        deadline = time.monotonic() + 10
        while not evicted:
            assert time.monotonic() < deadline, "no eviction was applied"
            controller.engine.observe(
                InferenceLatency(ts=time.time(), service="chat", namespace="serving",
                                 samples_ms=[900.0] * 50)
            )  # fmt: skip
            results = await controller.evaluate_once()
            evicted = [
                r for r in results if r.decision.action == "evict" and r.outcome is Outcome.APPLIED
            ]
            await asyncio.sleep(0.1)
        assert all(r.wasted_gpu_hours > 0 and "GPU-hours" in r.detail for r in evicted)
        text = generate_latest(controller.metrics.registry).decode()
        (line,) = [
            s
            for s in text.splitlines()
            if s.startswith("ebbtide_preemption_wasted_gpu_hours_total")
        ]
        assert float(line.split()[-1]) == pytest.approx(sum(r.wasted_gpu_hours for r in evicted))
