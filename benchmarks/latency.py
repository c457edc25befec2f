"""Reaction time of ``ebbtide run``: from a latency event on Kafka to the Kubernetes API call.

Set-up, all on loopback: the embedded broker; the Kubernetes-API test server (in this process)
with one big GPU node and 20 inference Deployments ``bench/svc-K`` of 1 replica; ``ebbtide run``
as a subprocess with a policy that scales each service when its P99 exceeds 100 ms, acting as
soon as it does (``breachAfter: 0s``), so what is measured is the pipeline, not a policy hold.

At each background rate (1k, 10k, 50k events/s of healthy 20 ms samples across the services,
produced by librdkafka from a thread), trials tip one fresh service at a time into breach with
one message of slow samples, stamped with the send time T. Then:

* event → decision = the decision's ``ts`` (the controller's clock when it decided) - T;
* event → API call = when the ``/scale`` PATCH for that service reached the API server - T
  (the server's request log, polled every millisecond).

Usage: ``python benchmarks/latency.py [--rates 1000 10000 50000] [--trials 15]``.
The issue's target: event → API call p99 <= 100 ms at 10k events/s.
"""

# ruff: noqa: ASYNC210, ASYNC220, ASYNC240 - a benchmark driver: blocking calls are deliberate

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from streams.broker import EmbeddedBroker, free_port
from support.e2e import deployment
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node

SERVICES = 20
TOPIC = "ebbtide.inference.latency"


def policy_yaml(count: int) -> str:
    services = "\n".join(
        f"""    svc-{k}:
      namespace: bench
      pool: gpus
      gpusPerReplica: 1
      replicas: {{min: 1, max: 8}}
      slo: {{percentile: 99, objectiveMs: 100, window: 10s, resolution: 1s, breachAfter: 0s,
            recoverBelow: 80%, recoverAfter: 5s, minSamples: 20}}
      scale: {{tolerance: 10%}}"""
        for k in range(count)
    )
    return f"""apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {{name: latency-bench}}
spec:
  pools:
    gpus: {{nodeSelector: {{pool: gpus}}, kind: whole}}
  services:
{services}
  budgets:
    evictions: {{max: 10, per: 1m}}
    scaleSteps: {{max: 1000, per: 1m}}
    migConversions: {{max: 1, per: 1h}}
  cooldowns: {{service: 1h}}
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Background(threading.Thread):
    """Healthy traffic at ``rate`` events/s (one 20 ms sample each), paced in 10 ms slices."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.rate, self.stop_event = rate, threading.Event()
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self.sent = 0

    def run(self) -> None:
        per_slice = max(1, self.rate // 100)
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            now = time.time()
            for i in range(per_slice):
                k = (self.sent + i) % SERVICES
                event = {"type": "inference.latency", "ts": now, "service": f"svc-{k}",
                         "namespace": "bench", "latency_ms": 20.0}  # fmt: skip
                self.producer.produce(TOPIC, json.dumps(event).encode(), key=f"bench/svc-{k}")
            self.sent += per_slice
            self.producer.poll(0)
            next_at += 0.01
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.producer.flush(10)


async def main(rates: list[int], trials: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ebbtide-latency-"))
    policy = tmp / "policy.yaml"
    policy.write_text(policy_yaml(SERVICES * len(rates)))
    with EmbeddedBroker(log_path=tmp / "tansu.log") as broker:
        async with KubeAPIServer() as kubeapi:
            labels = {"pool": "gpus", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
            node = make_node("big", labels=labels, gpus=1000)
            await kubeapi.create(node)
            for k in range(SERVICES * len(rates)):
                await kubeapi.create(deployment("bench", f"svc-{k}", 1, labels={"app": f"s{k}"}))
            port = free_port()
            env = os.environ | {
                "KUBECONFIG": str(kubeapi.write_kubeconfig(tmp / "kubeconfig")),
                "EBBTIDE_LOG_FORMAT": "json",
                "EBBTIDE_KUBE__LEASE_NAMESPACE": "default",
                "EBBTIDE_KAFKA__DECISIONS_TOPIC": "ebbtide.decisions",
            }
            log = tmp / "controller.log"
            with log.open("wb") as out:
                controller = subprocess.Popen(
                    [sys.executable, "-m", "controller", "run", "--policy", str(policy),
                     "--bootstrap", broker.bootstrap, "--identity", "bench",
                     "--metrics-address", f"127.0.0.1:{port}", "--live"],
                    stdout=out, stderr=subprocess.STDOUT, env=env,
                )  # fmt: skip
            try:
                await _ready(port)
                print(f"controller ready; logs in {log}")
                print(f"{'rate ev/s':>10} {'trials':>6} {'event→decision p50/p99 ms':>28} "
                      f"{'event→API call p50/p99 ms':>28}")  # fmt: skip
                for i, rate in enumerate(rates):
                    await _measure(broker.bootstrap, kubeapi, log, rate, trials, offset=i)
            finally:
                controller.terminate()
                controller.wait(30)


async def _ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("controller not ready")


async def _measure(
    bootstrap: str, kubeapi: KubeAPIServer, log: Path, rate: int, trials: int, *, offset: int
) -> None:
    background = Background(bootstrap, rate)
    background.start()
    await asyncio.sleep(3)  # steady state
    tipper = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    to_decision: list[float] = []
    to_api: list[float] = []
    for trial in range(min(trials, SERVICES)):
        service = f"svc-{offset * SERVICES + trial}"  # fresh: the policy's cooldown is an hour
        seen = len(kubeapi.requests)
        sent_at = time.time()
        event = {"type": "inference.latency", "ts": sent_at, "service": service,
                 "namespace": "bench", "samples_ms": [900.0] * 200}  # fmt: skip
        tipper.produce(TOPIC, json.dumps(event).encode(), key=f"bench/{service}")
        tipper.flush(5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            hit = any(
                r.method == "PATCH" and r.path.endswith(f"/deployments/{service}/scale")
                for r in kubeapi.requests[seen:]
            )
            if hit:
                to_api.append((time.time() - sent_at) * 1000)
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.2)
        for line in log.read_text().splitlines():
            if f'"target": "bench/{service}"' in line and '"event": "decision"' in line:
                to_decision.append((json.loads(line)["ts"] - sent_at) * 1000)
                break
    background.stop_event.set()
    background.join(10)
    if to_api:
        d50, d99 = (percentile(to_decision, q) for q in (0.5, 0.99)) if to_decision else (0, 0)
        a50, a99 = percentile(to_api, 0.5), percentile(to_api, 0.99)
        print(f"{rate:>10,} {len(to_api):>6} {d50:>13.1f} / {d99:<12.1f} {a50:>13.1f} / "
              f"{a99:<12.1f}  (background sent {background.sent:,})")  # fmt: skip
    else:
        print(f"{rate:>10,}: no API call observed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(main(args.rates, args.trials))
