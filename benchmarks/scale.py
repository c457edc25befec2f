"""Scale: 10,000 GPUs and 2,000 services through the whole controller, in one process.

The controller's own code path — :class:`controller.process.app.Controller` handing validated
batches to
the engine (``observe``, the Kafka handler) and ``evaluate_once`` (engine → safety gate →
cluster) — on a simulated cluster of 1,250 nodes x 8 GPUs: 2,000 inference services of 2
replicas and 100 elastic training jobs of 50 replicas; 1,000 GPUs free. Every simulated second
each service reports one event of 20 latency samples (40,000 samples/s) and every GPU one
utilization reading every 10 s (1,000 events/s). After a warm-up, 1 % of the services go slow.

Printed: observe throughput, evaluate time per tick (median, p99, max), the wall time from the
batch that tips a service into breach to its decisions being carried out (the in-process part of
end-to-end decision latency: no Kafka, no API server), and peak RSS.
Usage: ``python benchmarks/scale.py [--seconds 90]``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path

from controller.loop.gate import SafetyGate
from controller.process.app import Controller
from controller.process.settings import load_settings
from controller.simcluster.sim_runtime import SimRuntime
from controller.simcluster.simulator import SimCluster
from policies.loader import load_policy_text
from policies.snapshot import SnapshotBuilder
from streams.consumer import Batch
from streams.events import Event, GpuUtilization, InferenceLatency

NODES, GPUS_PER_NODE, SERVICES, TRAINING_JOBS, TRAINING_REPLICAS = 1250, 8, 2000, 100, 50
T0 = 1_767_225_600.0


def policy_text() -> str:
    services = "\n".join(
        f"    svc-{k}: {{namespace: serve, pool: whole, gpusPerReplica: 1, "
        f"replicas: {{min: 1, max: 8}}, scale: {{tolerance: 10%}}, slo: {{percentile: 99, "
        f"objectiveMs: 200, window: 30s, resolution: 5s, breachAfter: 10s, "
        f"recoverBelow: 80%, recoverAfter: 30s, minSamples: 20}}}}"
        for k in range(SERVICES)
    )
    return f"""apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {{name: scale}}
spec:
  pools:
    whole: {{nodeSelector: {{pool: whole}}, kind: whole}}
  services:
{services}
  training:
    selector: {{class: training}}
    victimOrder: [priority, newest]
    elastic: {{growAfter: 5m, growStep: 1}}
  budgets:
    evictions: {{max: 50, per: 10m}}
    scaleSteps: {{max: 500, per: 10m}}
    migConversions: {{max: 1, per: 1h}}
  cooldowns: {{service: 2m, trainingGrow: 5m}}
"""


def cluster(policy_pools: object) -> SimCluster:
    b = SnapshotBuilder().priority_class("serve", 1000).priority_class("train", 10)
    nodes = [f"n{i}" for i in range(NODES)]
    for name in nodes:
        b.node(name, gpus=GPUS_PER_NODE, labels={"pool": "whole"})
    slot = 0

    def place(count: int) -> list[str | None]:
        nonlocal slot
        out: list[str | None] = []
        for _ in range(count):
            out.append(nodes[slot // GPUS_PER_NODE])
            slot += 1
        return out

    for k in range(SERVICES):
        b.workload("serve", f"svc-{k}", replicas=2, priority_class="serve",
                   labels={"app": f"svc-{k}"}, nodes=place(2))  # fmt: skip
    for j in range(TRAINING_JOBS):
        b.workload("ml", f"train-{j}", replicas=TRAINING_REPLICAS, priority_class="train",
                   labels={"class": "training"},
                   annotations={"ebbtide.io/min-replicas": "10",
                                "ebbtide.io/max-replicas": str(TRAINING_REPLICAS)},
                   nodes=place(TRAINING_REPLICAS))  # fmt: skip
    return SimCluster(b.build(), start=T0, pools=policy_pools,  # type: ignore[arg-type]
                      training_selector={"class": "training"})  # fmt: skip


async def main(seconds: int) -> None:
    started = time.perf_counter()
    policy = load_policy_text(policy_text(), "scale.yaml")
    tmp = Path(tempfile.mkdtemp())
    (tmp / "policy.yaml").write_text(policy_text())
    settings = load_settings(policies=[tmp / "policy.yaml"], http={"address": "127.0.0.1:0"})
    now = [T0]
    sim = cluster(policy.spec.pools)
    runtime = SimRuntime(sim, SafetyGate(policy, clock=lambda: now[0]))
    controller = Controller(settings, runtime, policy, clock=lambda: now[0])
    print(f"built {NODES * GPUS_PER_NODE:,} GPUs, {SERVICES:,} services, "
          f"{TRAINING_JOBS * TRAINING_REPLICAS:,} training pods in "
          f"{time.perf_counter() - started:.1f}s")  # fmt: skip
    observe_s = events = 0.0
    ticks: list[float] = []
    reaction: list[float] = []
    slow = set(range(0, SERVICES, 100))
    for second in range(seconds):
        now[0] = T0 + second
        batch: list[Event] = []
        for k in range(SERVICES):
            latency = 900.0 if second >= seconds // 2 and k in slow else 40.0
            batch.append(InferenceLatency(ts=now[0], service=f"svc-{k}", namespace="serve",
                                          samples_ms=[latency] * 20))  # fmt: skip
        if second % 10 == 0:
            for n in range(NODES):
                for g in range(GPUS_PER_NODE):
                    batch.append(GpuUtilization(ts=now[0], node=f"n{n}", gpu=g, util_pct=70.0))
        t = time.perf_counter()
        await controller.observe(Batch(batch, {}, now[0]))
        observe_s += time.perf_counter() - t
        events += len(batch)
        t = time.perf_counter()
        results = await controller.evaluate_once()
        took = time.perf_counter() - t
        ticks.append(took)
        if results and not reaction:
            reaction.append(took)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ordered = sorted(ticks)
    print(f"observe (the Kafka handler): {events / observe_s:,.0f} events/s over "
          f"{events:,.0f} events")  # fmt: skip
    print(f"evaluate_once per tick: median {statistics.median(ticks) * 1000:.1f} ms, "
          f"p99 {ordered[int(0.99 * (len(ordered) - 1))] * 1000:.1f} ms, "
          f"max {ordered[-1] * 1000:.1f} ms over {len(ticks)} ticks")  # fmt: skip
    if reaction:
        print(f"first breach tick (engine + gate + simulated apply): {reaction[0] * 1000:.1f} ms")
    decided = sum(1 for _ in sim.effects_since(0))
    print(f"simulated cluster effects: {decided:,}; peak RSS {rss:,.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=90)
    asyncio.run(main(parser.parse_args().seconds))
