"""Benchmark the policy engine: observe throughput per latency form, evaluate time and memory.

Run: ``python benchmarks/evaluation.py [--gpus 10000] [--services 2000]``. Prints figures; asserts
nothing. Targets (issue 3): >= 300k single-sample observations/s on one core, evaluate <= 20 ms
at 10,000 GPUs and 2,000 services, memory <= 1 GiB. Issue 16: a quiet tick (no event since the
last one, nothing due) costs what changed, not the scene's size: it is timed in the same scene
against an engine that ticks everything (``Engine(…, incremental=False)``).

The scene: nodes of 8 GPUs in a whole-card pool; each service runs 2 replicas; elastic training
fills the remaining GPUs; every service gets latency events each simulated second (1% of them
above their objective, so they breach and trigger victim selection), and every GPU a utilization
reading every 10 s. ``evaluate`` is timed once per simulated second, after that second's events,
on the same snapshot object (the live controller hands over a new one only when the cluster
changed); the first call, which builds the snapshot index, is reported separately.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.engine import Engine
from policies.model import Policy
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import GpuUtilization, InferenceLatency, LatencyHistogram

T0 = 1_767_225_600.0
WHOLE = {"ebbtide.io/pool": "whole"}
TRAINING = {"ebbtide.io/class": "training"}


def make_policy(services: int) -> Policy:
    svc: dict[str, Any] = {}
    for i in range(services):
        svc[f"svc-{i:04d}"] = {
            "namespace": "serving",
            "pool": "whole",
            "replicas": {"min": 1, "max": 8},
            "slo": {
                "percentile": 99,
                "objectiveMs": 200,
                "window": "60s",
                "resolution": "5s",
                "breachAfter": "10s",
            },
            "scale": {"tolerance": "10%", "maxStep": 2},
        }
    return Policy.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "bench"},
            "spec": {
                "pools": {
                    "whole": {"nodeSelector": WHOLE},
                    "mig": {"nodeSelector": {"ebbtide.io/pool": "mig"}, "kind": "mig"},
                },
                "services": svc,
                "training": {"selector": TRAINING, "elastic": {"growAfter": "5m"}},
                "mig": {
                    "fromPool": "whole",
                    "toPool": "mig",
                    "convertBelow": "20%",
                    "convertAfter": "10m",
                    "revertAfter": "5m",
                    "profiles": {"A100-80GB": "all-1g.10gb"},
                },
                "budgets": {
                    "evictions": {"max": 1000, "per": "10m"},
                    "scaleSteps": {"max": 1000, "per": "10m"},
                },
                "cooldowns": {"service": "1m"},
            },
        }
    )


def make_snapshot(gpus: int, services: int) -> Snapshot:
    nodes = gpus // 8
    b = SnapshotBuilder().priority_class("low", 10)
    for i in range(nodes):
        b.node(f"n{i:05d}", gpus=8, labels=WHOLE)
    slots = [(f"n{i:05d}", g) for i in range(nodes) for g in range(8)]
    k = 0
    for i in range(services):
        b.workload("serving", f"svc-{i:04d}", replicas=2, nodes=[slots[k][0], slots[k + 1][0]])
        k += 2
    j = 0
    while k + 8 <= len(slots):
        b.workload(
            "ml",
            f"train-{j:04d}",
            kind="PyTorchJob",
            replicas=8,
            labels=TRAINING,
            annotations={"ebbtide.io/min-replicas": "2", "ebbtide.io/max-replicas": "8"},
            priority_class="low",
            created=float(j),
            nodes=[slots[k + r][0] for r in range(8)],
        )
        k += 8
        j += 1
    return b.build()


def bench_observe(engine: Engine, n: int) -> None:
    rnd = random.Random(1)
    singles = [
        InferenceLatency(
            ts=T0 + i / n * 30,
            service="svc-0001",
            namespace="serving",
            latency_ms=rnd.lognormvariate(4, 0.5),
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    for e in singles:
        engine.observe(e)
    dt = time.perf_counter() - start
    print(f"observe single     : {n / dt:>12,.0f} events/s  ({n / dt:,.0f} samples/s)")
    fresh = Engine(engine.policy)
    start = time.perf_counter()
    fresh.observe_many(singles)
    dt = time.perf_counter() - start
    print(f"observe_many single: {n / dt:>12,.0f} events/s")

    batches = [
        InferenceLatency(
            ts=T0 + 30 + i / n * 30,
            service="svc-0002",
            namespace="serving",
            samples_ms=[rnd.lognormvariate(4, 0.5) for _ in range(32)],
        )
        for i in range(n // 32)
    ]
    start = time.perf_counter()
    for e in batches:
        engine.observe(e)
    dt = time.perf_counter() - start
    print(
        f"observe batch x32  : {len(batches) / dt:>12,.0f} events/s  "
        f"({len(batches) * 32 / dt:,.0f} samples/s)"
    )

    bounds = [5.0 * 1.5**i for i in range(20)]
    hists = [
        InferenceLatency(
            ts=T0 + 60 + i / n * 30,
            service="svc-0003",
            namespace="serving",
            histogram=LatencyHistogram(
                bounds_ms=bounds, counts=[rnd.randrange(0, 50) for _ in range(21)]
            ),
        )
        for i in range(n // 32)
    ]
    start = time.perf_counter()
    for e in hists:
        engine.observe(e)
    dt = time.perf_counter() - start
    print(f"observe histogram20: {len(hists) / dt:>12,.0f} events/s  (21 buckets each)")

    utils = [
        GpuUtilization(ts=T0 + i / n * 30, node=f"n{i % 1250:05d}", gpu=i % 8, util_pct=50.0)
        for i in range(n // 4)
    ]
    start = time.perf_counter()
    for u in utils:
        engine.observe(u)
    dt = time.perf_counter() - start
    print(f"observe gpu util   : {len(utils) / dt:>12,.0f} events/s")


def bench_evaluate(gpus: int, services: int, seconds: int, per_service: int) -> None:
    t_build = time.perf_counter()
    policy = make_policy(services)
    snapshot = make_snapshot(gpus, services)
    engine = Engine(policy)
    print(
        f"scene: {len(snapshot.nodes)} nodes, {gpus} GPUs, {services} services, "
        f"{len(snapshot.pods)} pods, {len(snapshot.workloads)} workloads "
        f"(built in {time.perf_counter() - t_build:.1f}s)"
    )
    rnd = random.Random(2)
    hot = {f"svc-{i:04d}" for i in range(0, services, 100)}  # 1% breach
    names = [f"svc-{i:04d}" for i in range(services)]
    nodes = [n.name for n in snapshot.nodes]
    first = None
    times: list[float] = []
    decisions = 0
    observe_s = 0.0
    events = 0
    for s in range(seconds):
        now = T0 + s + 1
        batch: list[Any] = []
        for name in names:
            base = 400.0 if name in hot else 60.0
            for k in range(per_service):
                batch.append(
                    InferenceLatency(
                        ts=now - 1 + k / per_service,
                        service=name,
                        namespace="serving",
                        latency_ms=base * rnd.uniform(0.8, 1.2),
                    )
                )
        if s % 10 == 0:
            for node in nodes:
                for g in range(8):
                    batch.append(GpuUtilization(ts=now - 0.5, node=node, gpu=g, util_pct=55.0))
        t = time.perf_counter()
        for e in batch:
            engine.observe(e)
        observe_s += time.perf_counter() - t
        events += len(batch)
        t = time.perf_counter()
        out = engine.evaluate(now, snapshot)
        dt = time.perf_counter() - t
        decisions += len(out)
        if first is None:
            first = dt
        else:
            times.append(dt)
    times.sort()
    assert first is not None
    print(f"evaluate first call (builds index): {first * 1000:.1f} ms")
    print(
        f"evaluate over {len(times)} s: median {statistics.median(times) * 1000:.2f} ms, "
        f"p90 {times[int(len(times) * 0.9)] * 1000:.2f} ms, max {times[-1] * 1000:.2f} ms "
        f"({decisions} decisions)"
    )
    print(f"observe in the scene: {events / observe_s:,.0f} events/s over {events:,} events")
    breaching = sum(1 for st in engine.service_status(T0 + seconds) if st.state == "breaching")
    print(f"services breaching at the end: {breaching}")
    gc.collect()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process: {rss:,.0f} MiB")


def bench_quiet(gpus: int, services: int, ticks: int = 200) -> None:
    """Quiet ticks: every service and GPU reported once at T0 (every window holds data, no
    timer runs out for a while), then ``ticks`` evaluations 0.1 s apart with no event."""
    policy = make_policy(services)
    snapshot = make_snapshot(gpus, services)
    out = []
    for incremental in (True, False):
        engine = Engine(policy, incremental=incremental)
        for i in range(services):
            engine.observe(
                InferenceLatency(
                    ts=T0, service=f"svc-{i:04d}", namespace="serving", samples_ms=[50.0] * 20
                )
            )
        for n in snapshot.nodes:
            for g in range(8):
                engine.observe(GpuUtilization(ts=T0, node=n.name, gpu=g, util_pct=55.0))
        engine.evaluate(T0 + 1, snapshot)
        times = []
        for k in range(2, ticks + 2):
            t = time.perf_counter()
            engine.evaluate(T0 + 1 + k * 0.1, snapshot)
            times.append(time.perf_counter() - t)
        out.append(statistics.median(times))
    print(
        f"evaluate, quiet tick: median {out[0] * 1e6:,.1f} us "
        f"(ticking everything: {out[1] * 1e6:,.1f} us, {out[1] / out[0]:,.0f}x)"
    )


def bench_memory(gpus: int, services: int) -> None:
    gc.collect()
    tracemalloc.start()
    policy = make_policy(services)
    snapshot = make_snapshot(gpus, services)
    engine = Engine(policy)
    for name in (f"svc-{i:04d}" for i in range(services)):
        for s in range(61):
            engine.observe(
                InferenceLatency(ts=T0 + s, service=name, namespace="serving", latency_ms=50.0 + s)
            )
    engine.evaluate(T0 + 61, snapshot)
    for n in snapshot.nodes:
        for g in range(8):
            engine.observe(GpuUtilization(ts=T0 + 61, node=n.name, gpu=g, util_pct=30.0))
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"tracemalloc: policy+snapshot+engine with full windows {current / 2**20:,.0f} MiB, "
        f"peak {peak / 2**20:,.0f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--services", type=int, default=2_000)
    ap.add_argument("--seconds", type=int, default=60, help="simulated seconds of evaluate")
    ap.add_argument("--per-service", type=int, default=5, help="latency events/s per service")
    ap.add_argument("--observe", type=int, default=300_000, help="events per observe run")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, one core")
    bench_observe(Engine(make_policy(10)), args.observe)
    bench_evaluate(args.gpus, args.services, args.seconds, args.per_service)
    bench_quiet(args.gpus, args.services)
    bench_memory(args.gpus, args.services)


if __name__ == "__main__":
    main()
