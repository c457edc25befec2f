"""Collector pauses on the controller's intake path: CPython's defaults vs ``tune_gc``.

Why it matters (issue 27): a full collection walks every tracked object, and a controller's
start-up alone leaves ~110,000 of them (kubernetes_asyncio's models, aiokafka, the policy); at
tens of thousands of events a second one lands every few seconds, and a decision waits behind it.

Set-up, in this process: the modules ``ebbtide run`` imports, and one engine with the latency
benchmark's policy (80 services). Each run decodes ``--events`` single-sample latency events in
batches of 1,000 with :meth:`streams.events.EventDecoder.decode_many` and feeds them to
:meth:`policies.engine.Engine.observe_many`, alongside one record-like object per message (as
aiokafka makes), and times every collection with ``gc.callbacks``. Runs alternate defaults
(700, 10, 10, nothing frozen) and :func:`controller.cli.run_command.tune_gc`; medians over
``--runs`` pairs are printed, and their ratio.

Usage: ``python benchmarks/gc_pauses.py [--events 300000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import policy_yaml

# The modules `ebbtide run` imports: the start-up heap a full collection walks.
import controller.kube.kube_runtime
import controller.process.app  # noqa: F401
from controller.cli.run_command import tune_gc
from policies.engine import Engine
from policies.loader import load_policy_text
from streams.events import DEFAULT_TOPICS, EventDecoder, InferenceLatency, encode_event

TOPIC = DEFAULT_TOPICS["inference.latency"]
BATCH = 1_000


class Record:
    """Stands for aiokafka's ConsumerRecord: one tracked object per message."""

    __slots__ = ("headers", "value")

    def __init__(self, value: bytes) -> None:
        self.value = value
        self.headers: list[Any] = []


def one_run(events: int, *, tuned: bool) -> tuple[int, float, float]:
    """Collections, their total and their longest pause (ms) while ``events`` are ingested."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    engine = Engine(load_policy_text(policy_yaml(80)))
    decoder = EventDecoder(topics=DEFAULT_TOPICS)
    if tuned:
        tune_gc()
    pauses: list[float] = []
    started = [0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0]) * 1000)

    gc.callbacks.append(timer)
    try:
        for first in range(0, events, BATCH):
            now = time.time()
            engine.advance(now)
            records = [
                Record(encode_event(InferenceLatency(
                    ts=now, service=f"svc-{i % 80}", namespace="bench", latency_ms=20.0
                )))
                for i in range(first, first + BATCH)
            ]  # fmt: skip
            decoded, _ = decoder.decode_many([r.value for r in records], now=now, topic=TOPIC)
            engine.observe_many(decoded)
    finally:
        gc.callbacks.remove(timer)
    return len(pauses), sum(pauses), max(pauses, default=0.0)


def main(events: int, runs: int) -> None:
    results: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}
    for run in range(runs):
        for tuned in (False, True):
            results[tuned].append(one_run(events, tuned=tuned))
            n, total, longest = results[tuned][-1]
            name = "tune_gc " if tuned else "defaults"
            print(f"run {run + 1} {name}: {n:>5} collections, {total:>7.1f} ms in all, "
                  f"longest {longest:>6.1f} ms")  # fmt: skip
    print(f"median over {runs} runs of {events:,} events:")
    medians = {}
    for tuned, rows in results.items():
        medians[tuned] = [statistics.median(r[k] for r in rows) for k in range(3)]
        n, total, longest = medians[tuned]
        name = "tune_gc " if tuned else "defaults"
        print(f"  {name}: {n:>7.0f} collections, {total:>7.1f} ms in all, longest {longest:.1f} ms")
    (_, d_total, d_long), (_, t_total, t_long) = medians[False], medians[True]
    if d_total and d_long:
        print(f"  tune_gc / defaults: {t_total / d_total:.2f} of the time collecting, "
              f"{t_long / d_long:.2f} of the longest pause")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    main(args.events, args.runs)
