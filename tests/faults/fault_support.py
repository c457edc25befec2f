"""Helpers of the fault-injection suite: a steady event stream, and readers of what the
controller did — its applied decisions, its writes in the API server's request log, its
committed offsets — and of whether the cluster it leaves behind is consistent."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer
from confluent_kafka import KafkaError, Message, Producer

from support.e2e import ControllerProcess, World
from support.kubeapi import LoggedRequest

__all__ = [
    "FLOW_ANNOTATION",
    "LATENCY",
    "SteadyStream",
    "applied",
    "evictions",
    "inconsistencies",
    "kill",
    "most_in_window",
    "repeated",
    "topic_messages",
    "writes",
]

LATENCY = "ebbtide.inference.latency"
ACTIONS = frozenset({"scale", "evict", "mig_convert", "mig_revert"})
FLOW_ANNOTATION = "ebbtide.io/mig-flow"


class SteadyStream:
    """Breaching latency events for serving/chat at a steady rate from a thread, each with a
    sequence number (an unknown field, ignored by the decoder). ``acked`` counts delivery
    reports without error; ``errors`` holds the others.

    The producer is at-least-once (librdkafka retries, no idempotence): a batch in flight when
    the broker dies may be written twice. It is not idempotent because tansu 0.6.0 on s3://
    storage loses that batch when it is: the batch's offsets are taken but its data is gone
    after the SIGKILL, and the producer's retry is answered as a duplicate (acknowledged, not
    written) — 20 acked events missing in 3 runs of 3."""

    def __init__(self, bootstrap: str, *, rate: int = 200, latency_ms: float = 900.0) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
        self._rate = rate
        self._latency_ms = latency_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-stream", daemon=True)
        self.produced = 0
        self.acked = 0
        self.errors: list[str] = []

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        tick = 0.1
        while not self._stop.is_set():
            started = time.monotonic()
            for _ in range(int(self._rate * tick)):
                event = {
                    "type": "inference.latency", "ts": time.time(), "service": "chat",
                    "namespace": "serving", "samples_ms": [self._latency_ms] * 5,
                    "seq": self.produced,
                }  # fmt: skip
                self._producer.produce(
                    LATENCY, json.dumps(event).encode(), key=b"serving/chat",
                    on_delivery=self._delivered,
                )  # fmt: skip
                self.produced += 1
            self._producer.poll(0)
            self._stop.wait(max(0.0, tick - (time.monotonic() - started)))

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_s: float = 30) -> None:
        """Stop producing and wait until every message is delivered (or has failed)."""
        self._stop.set()
        self._thread.join(5)
        assert self._producer.flush(flush_s) == 0, "messages left undelivered"


async def topic_messages(
    world: World, topic: str, *, quiet_s: float = 1.0
) -> list[tuple[int, bytes]]:
    """Every message (offset, value) on partition 0 of ``topic``, read from the start until
    ``quiet_s`` pass without a new one."""
    reader = AIOKafkaConsumer(
        topic,
        bootstrap_servers=world.broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await reader.start()
    out: list[tuple[int, bytes]] = []
    try:
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            batches = await reader.getmany(timeout_ms=200)
            for records in batches.values():
                quiet_since = time.monotonic()
                out += [(m.offset, m.value) for m in records if m.value is not None]
    finally:
        await reader.stop()
    return out


def kill(process: ControllerProcess) -> None:
    """SIGKILL: no shutdown, no final commit, nothing flushed."""
    process.process.send_signal(signal.SIGKILL)
    process.process.wait(10)


def applied(processes: list[ControllerProcess]) -> list[dict[str, Any]]:
    """Every action the ``processes`` logged as applied (a log line cut by SIGKILL is skipped)."""
    return [
        d
        for p in processes
        for d in p.decisions()
        if d["action"] in ACTIONS and d["outcome"] == "applied" and not d.get("dry_run")
    ]


def repeated(decisions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Applied actions that occur more than once: same action, target, from and to."""
    keys = Counter((d["action"], d["target"], d.get("from"), d.get("to")) for d in decisions)
    return [k for k, n in keys.items() if n > 1]


def most_in_window(times: list[float], per_s: float) -> int:
    """The largest number of ``times`` inside any window of ``per_s`` seconds."""
    ordered = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(ordered):
        while t - ordered[lo] >= per_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def writes(
    requests: list[LoggedRequest], method: str, path_regex: str, *, ok: bool = True
) -> list[LoggedRequest]:
    """Requests of ``method`` whose path matches; with ``ok`` only those answered 2xx."""
    pattern = re.compile(path_regex)
    return [
        r
        for r in requests
        if r.method == method
        and pattern.search(r.path)
        and (not ok or (r.status is not None and 200 <= r.status < 300))
    ]


def evictions(requests: list[LoggedRequest]) -> Counter[str]:
    """Pods evicted (Eviction answered 201), by ``namespace/name``."""
    out: Counter[str] = Counter()
    for r in writes(requests, "POST", r"/pods/[^/]+/eviction$"):
        parts = r.path.split("/")
        out[f"{parts[-4]}/{parts[-2]}"] += 1
    return out


def inconsistencies(world: World, bounds: dict[str, tuple[int, int]]) -> list[str]:
    """What is wrong with the cluster the controller left: a node cordoned or with a MIG flow
    left on it, a workload outside its replica ``bounds`` (``namespace/name`` → min, max)."""
    problems = []
    for node in world.kubeapi.objects("Node"):
        name = node["metadata"]["name"]
        if node["spec"].get("unschedulable"):
            problems.append(f"node {name} left cordoned")
        if FLOW_ANNOTATION in (node["metadata"].get("annotations") or {}):
            problems.append(f"node {name} left with a MIG flow")
    for key, (low, high) in bounds.items():
        namespace, name = key.split("/")
        replicas = world.replicas(namespace, name)
        if not low <= replicas <= high:
            problems.append(f"{key} at {replicas} replicas, outside {low}..{high}")
    return problems
