"""Benchmark ``ebbtide replay``: events/s and peak memory on large generated recordings.

Run: ``python benchmarks/replay_speed.py [--lengths 1000000 5000000] [--runs 3] [--gzip]``, or
``python benchmarks/replay_speed.py --shape sparse [--hours 24] [--samples 40] [--runs 3]``. Prints
figures; asserts nothing. Targets: dense (issue 6) >= 200k events/s on one core with memory
independent of the recording's length; sparse (issue 27) >= 10,000x real time, and the replay's
rate >= 0.6x its floor measured in the same run: decoding the recording and ``Engine.observe``
on every event alone (the replay's own decoder, batches and garbage-collector setting, an engine
that has indexed the inferred cluster's snapshot; no ticks). Replay and floor runs alternate,
each in a fresh process; the ratio printed is the median replay rate over the median floor rate,
in wall time and in the processes' CPU time.

The scene: 1,000 GPUs (125 nodes of 8 in pool ``whole``) and 200 inference services. Each
simulated second every GPU reports its utilization and every service one latency event of 4
requests (1,200 events/s of event time); every tenth service has a 2-minute burst at 10x its
latency every 20 minutes, so SLOs breach and the engine scales services and shrinks training.
The cluster is inferred from the recording (that pass is timed apart: ``inventory``). Each
length runs in a fresh process (so peak RSS is that run's own), ``--runs`` times; the median
events/s of the replay loop (engine, simulated cluster, accounting, ``decisions.jsonl``) is
reported, then the report's rendering time.

The sparse shape (``--shape sparse``) is a quiet day: 143 containers each reporting once a
minute (23 inference services, one latency event of 40 requests each; 15 nodes of 8 GPUs, one
utilization reading each), at fixed offsets within the minute, so the engine ticks once a
second with ~2.4 events between ticks: a replay's speed there is the cost of a quiet tick.
Every fourth service has a 20-minute burst at 10x its latency every 6 hours, so it breaches,
scales up and later back down; three of the 15 nodes idle, but the whole-card pool's mean
stays above ``convertBelow``, so MIG converts nothing. ``--samples 1`` makes each latency event
one request (``latency_ms``), with ``minSamples: 3`` so a 5-minute window of them still breaches
(``minSamples`` is 20 otherwise).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = 1_767_225_600.0
NODES, GPUS_PER_NODE, SERVICES = 125, 8, 200
PER_SECOND = NODES * GPUS_PER_NODE + SERVICES
SPARSE_NODES, SPARSE_SERVICES = 15, 23


def _policy(name: str, services: str, *, mig_extra: str = "", scale_steps: int) -> str:
    return f"""\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {{name: {name}}}
spec:
  pools:
    whole: {{nodeSelector: {{ebbtide.io/pool: whole}}, kind: whole}}
    mig: {{nodeSelector: {{ebbtide.io/pool: mig}}, kind: mig}}
  services:
{services}
  training: {{selector: {{ebbtide.io/class: training}}}}
  mig:
    fromPool: whole
    toPool: mig
    convertBelow: 20%
    convertAfter: 30m
{mig_extra}    profiles: {{A100-80GB: all-1g.10gb}}
    revertAfter: 5m
  budgets:
    scaleSteps: {{max: {scale_steps}, per: 10m}}
"""


def policy_text() -> str:
    services = "\n".join(
        f"    svc-{i:03d}: {{namespace: serving, pool: whole, replicas: {{min: 2, max: 8}}, "
        f"scale: {{maxStep: 2}}, slo: {{percentile: 99, objectiveMs: 200, window: 60s, "
        f"resolution: 5s, breachAfter: 30s, minSamples: 20}}}}"
        for i in range(SERVICES)
    )
    return _policy("bench", services, scale_steps=100)


def sparse_policy_text(samples: int) -> str:
    """The sparse day's policy; ``minSamples`` fits a 5-minute window of ``samples``-request
    latency events, one a minute."""
    min_samples = min(20, max(3, 5 * samples // 2))
    services = "\n".join(
        f"    sparse-{i:02d}: {{namespace: serving, pool: whole, replicas: {{min: 2, max: 8}}, "
        f"scale: {{maxStep: 2, down: {{below: 50%, stabilization: 10m, maxStep: 1}}}}, "
        f"slo: {{percentile: 99, objectiveMs: 200, window: 5m, resolution: 1m, breachAfter: 2m, "
        f"recoverAfter: 5m, staleAfter: 10m, minSamples: {min_samples}}}}}"
        for i in range(SPARSE_SERVICES)
    )
    return _policy(
        "bench-sparse",
        services,
        mig_extra="    nodeIdleBelow: 5%\n    minWholeNodes: 2\n",
        scale_steps=30,
    )


def generate_sparse(path: Path, hours: float, samples: int) -> int:
    """Write the sparse day (see the module docstring); returns the number of events."""
    rnd = random.Random(16)
    containers: list[tuple[float, str]] = []
    latency = '"latency_ms":%s' if samples == 1 else '"samples_ms":[%s]'
    for i in range(SPARSE_SERVICES):
        containers.append(
            (
                rnd.uniform(0, 60),
                '{"topic":"ebbtide.inference.latency","partition":0,"offset":0,"ts_ms":%d,'
                f'"key":"serving/sparse-{i:02d}","headers":[],"value":{{"type":'
                f'"inference.latency","ts":%r,"service":"sparse-{i:02d}","namespace":"serving",'
                + latency
                + "}}\n",
            )
        )
    for n in range(SPARSE_NODES):
        for g in range(GPUS_PER_NODE):
            containers.append(
                (
                    rnd.uniform(0, 60),
                    '{"topic":"ebbtide.gpu.utilization","partition":0,"offset":0,"ts_ms":%d,'
                    f'"key":"node-{n:02d}","headers":[],"value":{{"type":"gpu.utilization",'
                    f'"ts":%r,"node":"node-{n:02d}","gpu":{g},"util_pct":%.1f}}}}\n',
                )
            )
    order = sorted(range(len(containers)), key=lambda c: containers[c][0])
    base_util = [
        rnd.uniform(40, 95) if n < SPARSE_NODES - 3 else rnd.uniform(0, 3)
        for n in range(SPARSE_NODES)
    ]
    written = 0
    with open(path, "w") as out:
        for minute in range(round(hours * 60)):
            chunk = []
            for c in order:
                offset, tpl = containers[c]
                ts = T0 + minute * 60 + round(offset, 3)
                if c < SPARSE_SERVICES:
                    phase = (minute + c * 37) % 360
                    scale = 10.0 if c % 4 == 0 and phase < 20 else 1.0
                    v = ",".join(f"{rnd.uniform(20, 150) * scale:.1f}" for _ in range(samples))
                    chunk.append(tpl % (int(ts * 1000), ts, v))
                else:
                    n = (c - SPARSE_SERVICES) // GPUS_PER_NODE
                    u = min(100.0, max(0.0, base_util[n] + rnd.uniform(-5, 5)))
                    chunk.append(tpl % (int(ts * 1000), ts, u))
            out.write("".join(chunk))
            written += len(chunk)
    return written


def generate(path: Path, events: int) -> None:
    """Write a recording of ``events`` messages (gzip when ``path`` ends in .gz)."""
    rnd = random.Random(6)
    lat = [
        '{"topic":"ebbtide.inference.latency","partition":0,"offset":0,"ts_ms":%d,'
        f'"key":"serving/svc-{i:03d}","headers":[],"value":{{"type":"inference.latency",'
        f'"ts":%r,"service":"svc-{i:03d}","namespace":"serving","samples_ms":[%s]}}}}\n'
        for i in range(SERVICES)
    ]
    gpu = [
        '{"topic":"ebbtide.gpu.utilization","partition":0,"offset":0,"ts_ms":%d,'
        f'"key":"node-{n:03d}","headers":[],"value":{{"type":"gpu.utilization",'
        f'"ts":%r,"node":"node-{n:03d}","gpu":{g},"util_pct":%.1f}}}}\n'
        for n in range(NODES)
        for g in range(GPUS_PER_NODE)
    ]
    base_util = [rnd.uniform(40, 95) if n < 110 else rnd.uniform(0, 3) for n in range(NODES)]
    written, s = 0, 0
    gz = path.suffix == ".gz"
    with gzip.open(path, "wt", compresslevel=1) if gz else open(path, "w") as out:
        while written < events:
            ts, ms = T0 + s, int((T0 + s) * 1000)
            burst = (s % 1200) < 120
            chunk = []
            for i, tpl in enumerate(lat):
                scale = 10.0 if burst and i % 10 == 0 else 1.0
                v = ",".join(f"{rnd.uniform(20, 150) * scale:.1f}" for _ in range(4))
                chunk.append(tpl % (ms, ts, v))
            for k, tpl in enumerate(gpu):
                u = min(100.0, max(0.0, base_util[k // GPUS_PER_NODE] + rnd.uniform(-5, 5)))
                chunk.append(tpl % (ms, ts, u))
            take = min(len(chunk), events - written)
            out.write("".join(chunk[:take]))
            written += take
            s += 1


def run_once(path: Path, out: Path, policy_yaml: str) -> dict[str, float]:
    """One replay in this process; figures as a dict (printed as JSON by the child)."""
    from controller.offline.accounting.report import write_outputs
    from controller.offline.replay.inferred import infer_cluster
    from controller.offline.replay.replayer import replay
    from policies.loader import load_policy_text

    policy = load_policy_text(policy_yaml)
    t = time.perf_counter()
    inferred = infer_cluster(path, policy)
    inventory_s = time.perf_counter() - t
    t, cpu = time.perf_counter(), time.process_time()
    result = replay(path, policy=policy, cluster=inferred.simulate, out_dir=out, span=inferred.span)
    replay_s, replay_cpu_s = time.perf_counter() - t, time.process_time() - cpu
    t = time.perf_counter()
    write_outputs(result, out)
    report_s = time.perf_counter() - t
    s = result.summary.to_dict()
    span_s = s["time"]["ticks"] * s["time"]["evaluate_every_s"]
    return {
        "events": s["events"]["total"],
        "replay_s": replay_s,
        "inventory_s": inventory_s,
        "report_s": report_s,
        "events_per_s": s["events"]["total"] / replay_s,
        "events_per_cpu_s": s["events"]["total"] / replay_cpu_s,
        "ticks_per_s": s["time"]["ticks"] / replay_s,
        "x_real_time": span_s / replay_s,
        "actions": s["actions"]["total"],
        "breaches": sum(v["breaches_total"] for v in s["slo"].values()),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def floor_once(path: Path, policy_yaml: str) -> dict[str, float]:
    """The sparse day's floor in this process: decode and ``observe`` every event, nothing
    else (see the module docstring)."""
    import gc

    from controller.offline.replay.inferred import infer_cluster
    from controller.offline.replay.replayer import GC_THRESHOLD
    from controller.offline.replay.source import read_event_batches
    from policies.engine import Engine
    from policies.loader import load_policy_text
    from streams.events import EventDecoder, Rejection

    policy = load_policy_text(policy_yaml)
    engine = Engine(policy)
    engine.evaluate(T0, infer_cluster(path, policy).simulate(T0).snapshot())  # nodes -> pools
    engine.advance(math.inf)  # no tick follows: no event is taken as skewed
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GC_THRESHOLD), *before[1:])  # as the replay does
    observe = engine.observe
    events = 0
    t, cpu = time.perf_counter(), time.process_time()
    for batch in read_event_batches(path, EventDecoder()):
        for item in batch:
            if type(item) is not Rejection:
                observe(item)  # type: ignore[arg-type]
                events += 1
    floor_s, floor_cpu_s = time.perf_counter() - t, time.process_time() - cpu
    gc.set_threshold(*before)
    return {
        "events": events,
        "floor_s": floor_s,
        "events_per_s": events / floor_s,
        "events_per_cpu_s": events / floor_cpu_s,
    }


def measure(path: Path, tmp: str, shape: str, runs: int) -> list[dict[str, float]]:
    """``runs`` replays of ``path`` (or floors: ``shape`` ``floor:N``), each in a fresh
    process (its peak RSS is its own)."""
    return [_child(path, tmp, shape) for _ in range(runs)]


def _child(path: Path, tmp: str, shape: str) -> dict[str, float]:
    child = subprocess.run(
        [sys.executable, __file__, "--child", str(path), str(Path(tmp) / "out"), shape],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(child.stdout.strip().splitlines()[-1]))


def sparse(hours: float, runs: int, samples: int) -> None:
    """The sparse day: events/s and how many times faster than real time."""
    with tempfile.TemporaryDirectory(prefix="ebbtide-bench-") as tmp:
        path = Path(tmp) / "sparse.jsonl"
        n = generate_sparse(path, hours, samples)
        print(
            f"generated a sparse {hours:g} h: {n:,} events, 143 containers, "
            f"{samples} request(s) per latency event",
            flush=True,
        )
        runs_, floors = [], []
        for _ in range(runs):  # alternating, so both see the machine as it is
            runs_.append(_child(path, tmp, f"sparse:{samples}"))
            floors.append(_child(path, tmp, f"floor:{samples}"))
        rate = statistics.median(r["events_per_s"] for r in runs_)
        floor = statistics.median(r["events_per_s"] for r in floors)
        first = runs_[0]
        print(
            f"  sparse: replay {rate:,.0f} events/s (median of {len(runs_)}: "
            + ", ".join(f"{r['events_per_s']:,.0f}" for r in runs_)
            + f"), {statistics.median(r['x_real_time'] for r in runs_):,.0f}x real time, "
            f"{statistics.median(r['ticks_per_s'] for r in runs_):,.0f} ticks/s, "
            f"{first['actions']:.0f} actions, {first['breaches']:.0f} breaches, "
            f"peak RSS {max(r['peak_rss_mib'] for r in runs_):,.0f} MiB",
            flush=True,
        )
        cpu_rate = statistics.median(r["events_per_cpu_s"] for r in runs_)
        cpu_floor = statistics.median(r["events_per_cpu_s"] for r in floors)
        print(
            f"  floor (decode + observe alone): {floor:,.0f} events/s (median of {len(floors)}: "
            + ", ".join(f"{r['events_per_s']:,.0f}" for r in floors)
            + f"); replay / floor = {rate / floor:.3f} (pairs: "
            + ", ".join(
                f"{r['events_per_s'] / f['events_per_s']:.3f}"
                for r, f in zip(runs_, floors, strict=True)
            )
            + ")",
            flush=True,
        )
        # CPU seconds of the process (time.process_time): steadier than wall time when other
        # work shares the cores, which stretches both sides' wall time unevenly.
        print(
            f"  per CPU-second: replay {cpu_rate:,.0f}, floor {cpu_floor:,.0f} events/s; "
            f"replay / floor = {cpu_rate / cpu_floor:.3f} (pairs: "
            + ", ".join(
                f"{r['events_per_cpu_s'] / f['events_per_cpu_s']:.3f}"
                for r, f in zip(runs_, floors, strict=True)
            )
            + ")",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("dense", "sparse"), default="dense")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--hours", type=float, default=24.0, help="the sparse recording's span")
    parser.add_argument(
        "--samples", type=int, default=40, help="requests per latency event in the sparse shape"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="gzip the recordings")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        shape, _, samples = args.child[2].partition(":")
        text = sparse_policy_text(int(samples)) if shape in ("sparse", "floor") else policy_text()
        if shape == "floor":
            print(json.dumps(floor_once(Path(args.child[0]), text)))
            return
        print(json.dumps(run_once(Path(args.child[0]), Path(args.child[1]), text)))
        return
    if args.shape == "sparse":
        sparse(args.hours, args.runs, args.samples)
        return
    with tempfile.TemporaryDirectory(prefix="ebbtide-bench-") as tmp:
        rows = []
        for n in args.lengths:
            path = Path(tmp) / f"r{n}.jsonl{'.gz' if args.gzip else ''}"
            t = time.perf_counter()
            generate(path, n)
            print(
                f"generated {n:,} events ({path.stat().st_size / 2**20:,.0f} MiB) "
                f"in {time.perf_counter() - t:.1f}s",
                flush=True,
            )
            runs = measure(path, tmp, "dense", args.runs)
            rate = statistics.median(r["events_per_s"] for r in runs)
            first = runs[0]
            rows.append((n, rate, max(r["peak_rss_mib"] for r in runs), first))
            print(
                f"  {n:>10,} events: replay {rate:,.0f} events/s (median of {len(runs)}: "
                + ", ".join(f"{r['events_per_s']:,.0f}" for r in runs)
                + f"), peak RSS {rows[-1][2]:,.0f} MiB, inventory pass "
                f"{first['inventory_s']:.1f}s, report {first['report_s']:.2f}s, "
                f"{first['actions']:.0f} actions, {first['breaches']:.0f} breaches",
                flush=True,
            )
            path.unlink()
        if len(rows) > 1:
            lo, hi = rows[0], rows[-1]
            print(
                f"memory: {lo[2]:,.0f} MiB at {lo[0]:,} events, {hi[2]:,.0f} MiB at {hi[0]:,} "
                f"({hi[0] / lo[0]:.0f}x the events, {hi[2] / lo[2]:.2f}x the memory)"
            )


if __name__ == "__main__":
    main()
