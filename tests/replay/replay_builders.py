"""Builders for replay tests: a small policy, recordings written from events, a cluster."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from controller.offline.experiment.load import poisson
from controller.offline.models.queueing import ServiceModel, ServiceQueue
from controller.simcluster import SimCluster
from policies.loader import load_policy_text
from policies.model import Policy
from policies.snapshot import SnapshotBuilder
from streams.events import Event, GpuUtilization, InferenceLatency, encode_event

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
WHOLE = {"ebbtide.io/pool": "whole"}

POLICY = """\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: replay-test}
spec:
  pools:
    whole: {nodeSelector: {ebbtide.io/pool: whole}, kind: whole}
  services:
    chat:
      namespace: serving
      pool: whole
      replicas: {min: 1, max: 8}
      cooldown: 60s
      slo:
        percentile: 99
        objectiveMs: 100
        window: 10s
        resolution: 1s
        breachAfter: 5s
        recoverBelow: 80%
        recoverAfter: 5s
        minSamples: 10
      scale: {tolerance: 10%}
"""


def policy(text: str = POLICY) -> Policy:
    return load_policy_text(text)


def chat_events(
    seconds: int, *, burst: tuple[int, int], high_ms: float = 390.0, low_ms: float = 50.0
) -> list[Event]:
    """Each second: 20 chat requests (``high_ms`` during ``burst`` [start, end)) and a reading
    of 50% from each GPU of node ``n0``."""
    out: list[Event] = []
    for s in range(seconds):
        value = high_ms if burst[0] <= s < burst[1] else low_ms
        out.append(
            InferenceLatency(
                ts=T0 + s, service="chat", namespace="serving", samples_ms=[value] * 20
            )
        )
        out += [GpuUtilization(ts=T0 + s, node="n0", gpu=g, util_pct=50.0) for g in range(8)]
    return out


def write_recording(path: Path, events: Iterable[Event], *, extra: Iterable[str] = ()) -> Path:
    """A recording of ``events`` (as ``record`` writes them), then the ``extra`` raw lines."""
    lines = [json.dumps({"ebbtide_recording": 1, "source": "test"})]
    for i, event in enumerate(events):
        record: dict[str, Any] = {
            "topic": "ebbtide.events",
            "partition": 0,
            "offset": i,
            "ts_ms": int(event.time * 1000),
            "key": event.key,
            "headers": [],
            "value": json.loads(encode_event(event)),
        }
        lines.append(json.dumps(record))
    lines += list(extra)
    path.write_text("\n".join(lines) + "\n")
    return path


def one_node_cluster(start: float, *, replicas: int = 1, of: Policy | None = None) -> SimCluster:
    """Node ``n0`` (8 GPUs, pool whole) running ``replicas`` of ``serving/chat``, with the
    pools of policy ``of`` (default :func:`policy`)."""
    snap = (
        SnapshotBuilder()
        .node("n0", gpus=8, labels=WHOLE)
        .workload("serving", "chat", replicas=replicas, nodes=["n0"])
        .build()
    )
    return SimCluster(snap, start=start, pools=(of or policy()).spec.pools)


def queue_chat_events(
    minutes: int,
    *,
    rate: Callable[[float], float],
    replicas: Callable[[int], int] = lambda s: 2,
    name_pods: bool = False,
    base_ms: float = 20.0,
    per_replica_rps: float = 5.0,
    seed: int = 1,
) -> list[Event]:
    """``minutes`` of ``serving/chat`` as the simulator's queueing model serves it with
    ``replicas(s)`` replicas (``rate(s)`` requests/s offered at second ``s``), and every 15 s a
    reading from each GPU of node ``n0``: a recording whose latency depends on load per replica.
    With ``name_pods`` each second's requests are split round-robin over events naming the
    replicas ``chat-0``, ``chat-1``, …"""
    model = ServiceModel(
        key="serving/chat", peak_rps=0.0, per_replica_rps=per_replica_rps, base_ms=base_ms
    )
    queue = ServiceQueue(model, random.Random(seed))
    arrivals_rng = random.Random(seed + 1)
    out: list[Event] = []
    for s in range(minutes * 60):
        offered = rate(s)
        n = poisson(arrivals_rng, offered)
        serving = replicas(s)
        samples = queue.step(offered_rps=offered, replicas=serving, arrivals=n, dt=1.0)
        shares = [samples[i::serving] for i in range(serving)] if name_pods else [samples]
        out += [
            InferenceLatency(
                ts=T0 + s, service="chat", namespace="serving", samples_ms=share,
                pod=f"chat-{i}" if name_pods else None,
            )
            for i, share in enumerate(shares)
            if share
        ]  # fmt: skip
        if s % 15 == 0:
            out += [GpuUtilization(ts=T0 + s, node="n0", gpu=g, util_pct=50.0) for g in range(8)]
    return out


def burst_rate(s: float) -> float:
    """3 req/s, ramping to 9 (0.9 of two replicas' capacity) from minute 10 to 14, held until
    minute 24, back to 3 by minute 28; then 3 until the end."""
    ramp = min(1.0, max(0.0, (s - 600) / 240)) - min(1.0, max(0.0, (s - 1440) / 240))
    return 3.0 + 6.0 * ramp
