"""Benchmark sharded ingest: N aggregator processes in one consumer group, one recording.

Run: ``python benchmarks/shards.py --replicas 1 2 [--events 300000] [--runs 3] [--json]``.

One embedded broker; the recording is produced once into event topics of ``--partitions``
partitions (not timed). Each run starts N ``ebbtide run --role aggregate`` processes in a new
consumer group (so each run reads the whole recording) publishing to a new aggregates topic,
which this process reads. A flush is timed by its record's timestamp: the aggregator's clock when
it sealed and sent it (this process reads it later, and shares the CPUs with what it measures).
A run's rate is the group's *steady* rate: the time it took to go from 10 % to 90 % of the
recording covered, counted from the moment every member had its final assignment. A partition's
coverage is interpolated between the moments its flushes were sent (a flush covering offsets
``[first, next)`` sent at t, after one sent at t', says those events were folded between t' and
t): a flush is sent about once a second per partition, so reading coverage off the flushes
alone would be a staircase with steps of a second, as long as a few seconds' run. The first and
last tenths are left out because they measure latencies, not throughput: the group's start-up
rebalances and first fetches, and the last flush, which waits for the next checkpoint
(``flush_every_s``, 1 s) after the last event was folded. The rate from the final assignment to
the whole recording covered is printed beside it (``whole``). Medians over ``--runs`` are
reported.

Decisions: the flushes of every run are merged (:class:`policies.partials.Merger`) into an
engine that evaluates every ``resolution`` of event time, and compared with one engine fed every
event of the recording and evaluated at the same instants (what one replica decides). The scene
is 4,000 GPUs (500 nodes of 8, a fifth of them idle), 200 services with 4-request batch events,
every tenth service 10x slower for 2 minutes every 20 minutes. Events are keyed as the agent and
the services key them (by node, by service), so how evenly a group shares the work depends on
how the keys hash to partitions: the busiest member's share of the events is printed
(``busiest_share``; 1/N is even). With 50 nodes it was 0.57 for two members (the group could be
at most 1.74x one, whatever the cores); a cluster big enough to shard has far more nodes.

CPU: over each run's timed span, the cores each process ran (``/proc/PID/task/*/schedstat``):
the broker, the aggregators (and the cores' worth they were ready to run but waited for a CPU:
what other processes on the machine took from them), this process; and the group's events per
aggregator CPU-second, which does not depend on how busy the machine is. ``--profile DIR`` runs
the aggregators under cProfile.

The last line printed is a JSON object: ``{"events_per_s": {"1": x, "2": y}, "same_decisions":
true|false, "ratio": y/x, "runs": {...}, "whole_events_per_s": {...}, "busiest_share": {...},
"events_per_aggregator_cpu_s": {...}, "cpu_cores": {...}, "cpus": n}``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.process.aggregate import ensure_aggregates_topic
from policies.decisions import decision_to_dict
from policies.engine import Engine
from policies.loader import load_policy_text
from policies.partials import Merger
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.aggregates import Flush, decode_flush
from streams.broker import EmbeddedBroker
from streams.connection import KafkaConfig, ensure_topics
from streams.events import Event, GpuUtilization, InferenceLatency, encode_event
from streams.producer import KafkaProducer

T0 = 1_767_225_600.0
NODES, GPUS_PER_NODE, SERVICES = 500, 8, 200
BUSY = NODES * 4 // 5
RESOLUTION = 5.0
POLICY = f"""\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {{name: shards-bench}}
spec:
  pools:
    whole: {{nodeSelector: {{ebbtide.io/pool: whole}}, kind: whole}}
    mig: {{nodeSelector: {{ebbtide.io/pool: mig}}, kind: mig}}
  services:
{
    chr(10).join(
        f"    svc-{i:03d}: {{namespace: serving, pool: whole, replicas: {{min: 1, max: 8}}, "
        f"scale: {{maxStep: 2}}, slo: {{percentile: 99, objectiveMs: 200, window: 60s, "
        f"resolution: {RESOLUTION:g}s, breachAfter: 30s, minSamples: 20}}}}"
        for i in range(SERVICES)
    )
}
  training: {{selector: {{ebbtide.io/class: training}}}}
  mig:
    fromPool: whole
    toPool: mig
    convertBelow: 20%
    convertAfter: 150s
    profiles: {{A100-80GB: all-1g.10gb}}
    revertAfter: 5m
  budgets:
    scaleSteps: {{max: 100, per: 10m}}
"""


def snapshot() -> Snapshot:
    b = SnapshotBuilder()
    for n in range(NODES):
        b.node(f"node-{n:03d}", gpus=GPUS_PER_NODE, labels={"ebbtide.io/pool": "whole"})
    for i in range(SERVICES):
        b.workload("serving", f"svc-{i:03d}", replicas=1, nodes=[f"node-{i % BUSY:03d}"])
    return b.build()


def recording(count: int) -> Iterator[tuple[str, str, Event]]:
    """(``latency`` or ``gpu``, key, event), in event-time order; the same every call."""
    rnd = random.Random(16)
    base = [rnd.uniform(40, 95) if n < BUSY else rnd.uniform(0, 3) for n in range(NODES)]
    emitted, s = 0, 0
    while True:
        ts = T0 + s
        burst = (s % 1200) < 120
        for i in range(SERVICES):
            scale = 10.0 if burst and i % 10 == 0 else 1.0
            samples = [round(rnd.uniform(20, 150) * scale, 1) for _ in range(4)]
            name = f"svc-{i:03d}"
            yield (
                "latency",
                f"serving/{name}",
                InferenceLatency(ts=ts, service=name, namespace="serving", samples_ms=samples),
            )
            emitted += 1
            if emitted == count:
                return
        for n in range(NODES):
            for g in range(GPUS_PER_NODE):
                util = min(100.0, max(0.0, base[n] + rnd.uniform(-5, 5)))
                node = f"node-{n:03d}"
                yield "gpu", node, GpuUtilization(ts=ts + 0.5, node=node, gpu=g, util_pct=util)
                emitted += 1
                if emitted == count:
                    return
        s += 1


Decisions = list[list[dict[str, object]]]


def one_replica(count: int) -> Decisions:
    """One engine fed every event, evaluated every resolution of event time."""
    policy, snap = load_policy_text(POLICY), snapshot()
    engine = Engine(policy)
    engine.evaluate(T0, snap)  # index the snapshot first: node -> pool for every reading
    out: Decisions = []
    tick = T0 + RESOLUTION
    for _, _, event in recording(count):
        while event.time >= tick:
            out.append([decision_to_dict(d) for d in engine.evaluate(tick, snap)])
            tick += RESOLUTION
        engine.observe(event)
    out.append([decision_to_dict(d) for d in engine.evaluate(tick, snap)])
    return out


def merged(flushes: list[Flush], ticks: int) -> Decisions:
    """A decider merging ``flushes``, each interval pushed once event time has passed it."""
    policy, snap = load_policy_text(POLICY), snapshot()
    engine = Engine(policy)
    engine.evaluate(T0, snap)
    merger = Merger(engine)
    lat: set[tuple[str, int]] = set()
    util: set[tuple[int, float]] = set()
    for flush in flushes:
        got_lat, got_util = merger.index(flush)
        lat |= got_lat
        util |= got_util
    lat_by_end = sorted(lat, key=lambda k: k[1])
    util_by_end = sorted(util, key=lambda k: (k[0] + 1) * k[1])
    out: Decisions = []
    i = j = 0
    for k in range(1, ticks + 1):
        tick = T0 + k * RESOLUTION
        a = i
        while i < len(lat_by_end) and (lat_by_end[i][1] + 1) * RESOLUTION <= tick:
            i += 1
        b = j
        while j < len(util_by_end) and (util_by_end[j][0] + 1) * util_by_end[j][1] <= tick:
            j += 1
        merger.push(lat_by_end[a:i], util_by_end[b:j])
        out.append([decision_to_dict(d) for d in engine.evaluate(tick, snap)])
    return out


async def produce(config: KafkaConfig, topics: dict[str, str], count: int) -> None:
    async with KafkaProducer(config, linger_ms=20) as producer:
        for kind, key, event in recording(count):
            await producer.send(topics[kind], encode_event(event), key=key.encode())


async def read_flushes(config: KafkaConfig, topic: str, out: list[tuple[float, Flush]]) -> None:
    """Append every flush on ``topic`` to ``out`` with the time its aggregator sent it (the
    record's timestamp, set by the producer), until cancelled."""
    consumer = AIOKafkaConsumer(**config.client_kwargs(), auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        while True:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                out.extend((m.timestamp / 1000, decode_flush(m.value)) for m in messages)
    finally:
        await consumer.stop()


def crossing(flushes: list[tuple[float, Flush]], since: float, events: float) -> float:
    """When the group had folded ``events`` events, each partition's coverage interpolated
    linearly between the moments its flushes were sent, from ``since`` on."""
    points: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for at, f in sorted(flushes, key=lambda sent: sent[0]):
        line = points.setdefault((f.topic, f.partition), [(since, 0)])
        if at <= since:
            line[0] = (since, max(line[0][1], f.next))
        else:
            line.append((at, max(line[-1][1], f.next)))

    def folded(t: float) -> float:
        total = 0.0
        for line in points.values():
            i = bisect.bisect_right(line, (t, math.inf))
            if i == len(line):
                total += line[-1][1]
            elif i > 0:
                (t0, c0), (t1, c1) = line[i - 1], line[i]
                total += c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return total

    times = sorted({t for line in points.values() for t, _ in line})
    lo = next(t for t in times if folded(t) >= events)  # folded() is piecewise linear between
    if lo == times[0]:
        return lo
    hi, lo = lo, times[times.index(lo) - 1]
    f_lo, f_hi = folded(lo), folded(hi)
    return lo + (hi - lo) * (events - f_lo) / (f_hi - f_lo)


def children() -> dict[int, str]:
    """This process's child processes: pid -> command name."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                out[int(pid)] = Path(f"/proc/{pid}/comm").read_text().strip()
    return out


def cpu_s(pid: int | str) -> tuple[float, float]:
    """Seconds a process (all its threads) ran on a CPU so far, and seconds it was ready to run
    but waited for one (``/proc/PID/task/*/schedstat``): the second is what other processes
    on the machine cost it."""
    ran = waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
            ran, waited = ran + int(run_ns), waited + int(wait_ns)
    return ran / 1e9, waited / 1e9


@dataclass(frozen=True, slots=True)
class Run:
    rate: float
    """Events/s over the steady span (the module docstring says which)."""
    whole: float
    """Events/s from the final assignment to the whole recording covered."""
    busiest_share: float
    """The share of the events that the busiest member's partitions held."""
    flushes: list[Flush]
    cores: dict[str, float]
    """CPU cores each process ran over the steady span, and the aggregators' wait for one."""


async def run_group(
    broker: EmbeddedBroker,
    topics: dict[str, str],
    policy_file: Path,
    replicas: int,
    total: int,
    profile: Path | None = None,
) -> Run:
    """Start ``replicas`` aggregators in a new group and measure them until they covered the
    whole recording."""
    tag = uuid.uuid4().hex[:8]
    aggregates = f"bench.aggregates.{tag}"
    config = KafkaConfig(broker.bootstrap)
    await ensure_aggregates_topic(config, aggregates)
    env = os.environ | {
        "EBBTIDE_KAFKA__LATENCY_TOPIC": topics["latency"],
        "EBBTIDE_KAFKA__GPU_TOPIC": topics["gpu"],
        "EBBTIDE_SHARDS__AGGREGATES_TOPIC": aggregates,
        "EBBTIDE_SHARDS__GROUP_ID": f"bench-{tag}",
        "EBBTIDE_SHARDS__SESSION_TIMEOUT_S": "2",
        "EBBTIDE_SHARDS__HEARTBEAT_S": "0.5",
        "EBBTIDE_DECISIONS_TOPIC": "",
    }
    flushes: list[tuple[float, Flush]] = []  # (sent at, flush), in the order sent
    reading = asyncio.create_task(read_flushes(config, aggregates, flushes))
    assigned: dict[int, tuple[float, list[str]]] = {}  # member -> its last assignment: when, what

    async def watch(k: int, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "ingest.assigned":
                when = datetime.fromisoformat(entry["timestamp"]).timestamp()
                assigned[k] = (when, entry["partitions"])
            elif entry.get("level") in ("warning", "error", "critical"):
                text = f"{entry.get('event')}: {entry.get('exception', '')[-300:]}"
                print(f"aggregator {k}: {text}", file=sys.stderr)

    processes = []
    for k in range(replicas):
        profiled = (
            ()
            if profile is None
            else ("-m", "cProfile", "-o", str(profile / f"{replicas}-{k}-{tag}.prof"))
        )
        processes.append(
            await asyncio.create_subprocess_exec(
                *(sys.executable, *profiled, "-m", "controller"),
                *("run", "--role", "aggregate"),
                *("--policy", str(policy_file), "--bootstrap", broker.bootstrap),
                *("--metrics-address", "127.0.0.1:0"),
                env=env,
                stderr=asyncio.subprocess.PIPE,
            )
        )
    watchers = [
        asyncio.create_task(watch(k, p.stderr)) for k, p in enumerate(processes) if p.stderr
    ]

    def ends_by(when: float) -> dict[str, int]:
        """Per partition (``topic[p]``, as the assignment logs name it): the offset flushes
        sent by ``when`` covered it up to."""
        ends: dict[str, int] = {}
        for at, f in flushes:
            if at <= when:
                key = f"{f.topic}[{f.partition}]"
                ends[key] = max(ends.get(key, 0), f.next)
        return ends

    def covered_by(when: float) -> int:
        return sum(ends_by(when).values())

    pids = {"benchmark": "self"} | {f"aggregator-{k}": p.pid for k, p in enumerate(processes)}
    pids["broker"] = next(pid for pid, name in children().items() if name.startswith("tansu"))
    cpu: list[tuple[float, dict[str, tuple[float, float]]]] = []  # when, cpu_s per process
    deadline = time.time() + 300
    while covered_by(math.inf) < total:
        if time.time() > deadline or any(p.returncode is not None for p in processes):
            raise RuntimeError(f"group of {replicas} covered {covered_by(math.inf)} of {total}")
        cpu.append((time.time(), {name: cpu_s(pid) for name, pid in pids.items()}))
        await asyncio.sleep(0.2)  # sampling costs this process CPU the others could use
    cpu.append((time.time(), {name: cpu_s(pid) for name, pid in pids.items()}))
    stable = max(at for at, _ in assigned.values())
    if len(assigned) < replicas or any(not tps for _, tps in assigned.values()):
        raise RuntimeError(f"not every member of {replicas} had partitions: {assigned}")
    start, end = crossing(flushes, stable, 0.1 * total), crossing(flushes, stable, 0.9 * total)
    rate = 0.8 * total / (end - start)
    done = min(at for at, _ in flushes if covered_by(at) >= total)
    whole = (total - covered_by(stable)) / (done - stable)
    ends = ends_by(math.inf)
    busiest = max(sum(ends.get(tp, 0) for tp in tps) for _, tps in assigned.values())
    # CPU over the steady span, in cores: from the last sample before it to the first after.
    t0, before = max((s for s in cpu if s[0] <= start), default=cpu[0])
    t1, after = min(s for s in cpu if s[0] >= end)
    cores = {name: (after[name][0] - before[name][0]) / (t1 - t0) for name in pids}
    cores["aggregators waiting for a CPU"] = sum(
        after[name][1] - before[name][1] for name in pids if name.startswith("aggregator")
    ) / (t1 - t0)
    for p in processes:
        p.terminate()
    for p in processes:
        await p.wait()
    await asyncio.gather(*watchers)
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    return Run(rate, whole, busiest / total, [f for _, f in flushes], cores)


async def main(
    replicas: list[int], events: int, runs: int, partitions: int, profile: Path | None
) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        policy_file = Path(tmp) / "policy.yaml"
        policy_file.write_text(POLICY)
        config = KafkaConfig(broker.bootstrap)
        topics = {"latency": "bench.latency", "gpu": "bench.gpu"}
        await ensure_topics(config, list(topics.values()), partitions=partitions)
        t = time.perf_counter()
        await produce(config, topics, events)
        print(f"produced {events:,} events in {time.perf_counter() - t:.1f}s", flush=True)
        t = time.perf_counter()
        want = one_replica(events)
        print(
            f"one engine, every event: {events / (time.perf_counter() - t):,.0f} events/s "
            f"in-process, {sum(map(len, want))} decisions",
            flush=True,
        )
        rates: dict[str, list[float]] = {str(n): [] for n in replicas}
        wholes: dict[str, list[float]] = {str(n): [] for n in replicas}
        cpus: dict[str, list[dict[str, float]]] = {str(n): [] for n in replicas}
        shares: dict[str, list[float]] = {str(n): [] for n in replicas}
        same = True
        for run in range(runs):
            for n in replicas:
                got = await run_group(broker, topics, policy_file, n, events, profile)
                aggregators = sum(v for k, v in got.cores.items() if k.startswith("aggregator-"))
                cpus[str(n)].append(
                    got.cores
                    | {"aggregators": aggregators, "events_per_cpu_s": got.rate / aggregators}
                )
                decided = merged(got.flushes, len(want))
                same = same and decided == want
                rates[str(n)].append(got.rate)
                wholes[str(n)].append(got.whole)
                shares[str(n)].append(got.busiest_share)
                print(
                    f"run {run + 1}, {n} replica(s): {got.rate:,.0f} events/s "
                    f"(whole {got.whole:,.0f}), {len(got.flushes)} flushes, busiest member's "
                    f"share {got.busiest_share:.2f}, same decisions: {decided == want}, "
                    "CPU cores: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(got.cores.items())),
                    flush=True,
                )
    medians = {n: statistics.median(r) for n, r in rates.items()}
    result: dict[str, Any] = {
        "events_per_s": {n: round(v) for n, v in medians.items()},
        "same_decisions": same,
        "runs": {n: [round(v) for v in r] for n, r in rates.items()},
        "whole_events_per_s": {n: round(statistics.median(r)) for n, r in wholes.items()},
        "busiest_share": {n: round(max(r), 3) for n, r in shares.items()},
        "events_per_aggregator_cpu_s": {
            n: round(statistics.median(c["events_per_cpu_s"] for c in r)) for n, r in cpus.items()
        },
        "cpu_cores": {
            n: {
                k: round(statistics.median(c[k] for c in r), 2)
                for k in ("broker", "aggregators", "aggregators waiting for a CPU", "benchmark")
            }
            for n, r in cpus.items()
        },
        "events": events,
        "partitions": partitions,
        "cpus": os.cpu_count(),
    }
    if len(replicas) > 1:
        lo, hi = str(min(replicas)), str(max(replicas))
        result["ratio"] = round(medians[hi] / medians[lo], 2)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--events", type=int, default=1_200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="end with the JSON line only")
    parser.add_argument(
        "--profile", type=Path, help="run aggregators under cProfile, writing DIR/N-K-TAG.prof"
    )
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    out = asyncio.run(main(args.replicas, args.events, args.runs, args.partitions, args.profile))
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
