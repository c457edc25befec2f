"""End-to-end harness: the embedded broker, the Kubernetes-API test server with a small GPU
cluster in it, the fake MIG manager, and ``ebbtide run`` as a real subprocess (the fixture that
assembles them is ``world`` in tests/e2e/conftest.py).

Events are produced with confluent-kafka (librdkafka), a client independent of the one under
test. The cluster:

* ``gpu-0``, ``gpu-1`` — whole-card pool, 4 A100-80GB each: serving/chat (2 replicas) and
  ml/train (6 replicas, elastic 2..6, low priority) run there;
* ``gpu-2`` — whole-card pool, 4 GPUs, idle: the MIG conversion candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from controller.kube.kube_runtime import KubeRuntime
from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from policies.miglayout import MigStrategy
from streams.broker import EmbeddedBroker, free_port
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_node, make_pod
from support.mig_manager import MigManager

HERE = Path(__file__).resolve().parents[1] / "e2e"
WHOLE = {"ebbtide.io/pool": "whole", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
TRAINING = {"ebbtide.io/class": "training", "app": "train"}


def deployment(namespace: str, name: str, replicas: int, *, labels: dict[str, str],
               annotations: dict[str, str] | None = None, gpus: int = 1,
               priority_class: str | None = None) -> dict[str, Any]:  # fmt: skip
    template_spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ]
    }
    if priority_class:
        template_spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations or {},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": labels["app"]}},
            "template": {"metadata": {"labels": labels}, "spec": template_spec},
        },
    }


def workload_pod(namespace: str, deploy: str, i: int, node: str, labels: dict[str, str],
                 priority_class: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod owned by the Deployment's ReplicaSet, as the Deployment controller makes them."""
    pod = make_pod(
        f"{deploy}-5d8f7-{i}",
        namespace=namespace,
        labels={**labels, "pod-template-hash": "5d8f7"},
        node=node,
        gpus=1,
        priority_class=priority_class,
    )
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deploy}-5d8f7",
         "uid": f"rs-{deploy}", "controller": True}
    ]  # fmt: skip
    pod["metadata"]["creationTimestamp"] = f"2026-12-01T00:00:{i:02d}Z"
    return pod


async def build_cluster(
    kubeapi: KubeAPIServer, *, full: bool = False, strategy: MigStrategy = "mixed"
) -> None:
    """The test cluster; ``full`` also runs training on ``gpu-2`` (10 replicas): no GPU free.
    Under ``strategy="single"`` the nodes carry the labels GFD writes there (the strategy and
    the cards' product)."""
    for name, value in (("training-low", 100), ("serving-high", 100000)):
        await kubeapi.create(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name}, "value": value}
        )  # fmt: skip
    gfd = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    labels = {**WHOLE, **(gfd if strategy == "single" else {})}
    for n in range(3):
        await kubeapi.create(make_node(f"gpu-{n}", labels=labels, gpus=4))
    chat_labels = {"app": "chat"}
    await kubeapi.create(deployment("serving", "chat", 2, labels=chat_labels,
                                    priority_class="serving-high"))  # fmt: skip
    replicas = 10 if full else 6
    bounds = {"ebbtide.io/min-replicas": "2", "ebbtide.io/max-replicas": str(replicas)}
    await kubeapi.create(
        deployment("ml", "train", replicas, labels=TRAINING, priority_class="training-low",
                   annotations=bounds)
    )  # fmt: skip
    for i in range(2):
        await kubeapi.create(workload_pod("serving", "chat", i, "gpu-0", chat_labels,
                                          "serving-high"))  # fmt: skip
    for i in range(replicas):
        node = "gpu-0" if i < 2 else "gpu-1" if i < 6 else "gpu-2"
        await kubeapi.create(workload_pod("ml", "train", i, node, TRAINING, "training-low"))


async def pin_training(kubeapi: KubeAPIServer) -> None:
    """Training is not elastic (no bounds; the full cluster's 10 replicas): only evictions free
    GPUs, allowed because chat outranks it (a Deployment Ebbtide grows back would be shrunk
    instead of having pods its ReplicaSet recreates evicted)."""
    bounds = {"ebbtide.io/min-replicas": None, "ebbtide.io/max-replicas": None}
    await kubeapi.patch("Deployment", "ml", "train", {"metadata": {"annotations": bounds}})


@dataclass
class World:
    """What one end-to-end test runs against."""

    broker: EmbeddedBroker
    kubeapi: KubeAPIServer
    mig: MigManager
    kubeconfig: Path
    tmp: Path
    processes: list[ControllerProcess] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    """Messages produced per topic."""

    def start(self, *extra: str, identity: str = "e2e", env: dict[str, str | None] | None = None,
              policy: Path = HERE / "policy.yaml") -> ControllerProcess:  # fmt: skip
        """A controller process (acting: ``EBBTIDE_DRY_RUN=false``); an ``env`` value of
        ``None`` or ``""`` unsets that variable."""
        process = ControllerProcess.start(self, *extra, identity=identity, env=env, policy=policy)
        self.processes.append(process)
        return process

    def produce(self, topic: str, events: list[dict[str, Any]], key: str) -> None:
        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5})
        for event in events:
            producer.produce(topic, json.dumps(event).encode(), key=key.encode())
        assert producer.flush(10) == 0
        self.sent[topic] = self.sent.get(topic, 0) + len(events)

    def latency(self, latency_ms: float, *, count: int = 50) -> None:
        now = time.time()
        events = [
            {"type": "inference.latency", "ts": now, "service": "chat", "namespace": "serving",
             "samples_ms": [latency_ms] * 20}
            for _ in range(count)
        ]  # fmt: skip
        self.produce("ebbtide.inference.latency", events, "serving/chat")

    def utilization(self, node: str, util_pct: float, gpus: int = 4) -> None:
        now = time.time()
        events = [
            {"type": "gpu.utilization", "ts": now, "node": node, "gpu": g, "util_pct": util_pct}
            for g in range(gpus)
        ]
        self.produce("ebbtide.gpu.utilization", events, node)

    def replicas(self, namespace: str, name: str) -> int:
        obj = self.kubeapi.get("Deployment", namespace, name)
        assert obj is not None
        return int(obj["spec"]["replicas"])


@dataclass
class ControllerProcess:
    """``ebbtide run`` in a subprocess, its metrics port and its log file."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(cls, world: World, *extra: str, identity: str, env: dict[str, str | None] | None,
              policy: Path) -> ControllerProcess:  # fmt: skip
        port = free_port()
        log = world.tmp / f"controller-{identity}-{uuid.uuid4().hex[:4]}.log"
        settings_env = {
            "KUBECONFIG": str(world.kubeconfig),
            "EBBTIDE_LOG_FORMAT": "json",
            "EBBTIDE_KUBE__LEASE_NAMESPACE": "ebbtide-system",
            "EBBTIDE_KUBE__LEASE_DURATION_S": "2",
            "EBBTIDE_KUBE__RENEW_DEADLINE_S": "1.5",
            "EBBTIDE_KUBE__RETRY_PERIOD_S": "1",
            "EBBTIDE_EVALUATE_EVERY_S": "0.25",
            "EBBTIDE_RELOAD_EVERY_S": "0.5",
            "EBBTIDE_DRY_RUN": "false",  # the tests act; a real cluster defaults to dry-run
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "controller", "run", "--policy", str(policy),
                 "--bootstrap", world.broker.bootstrap, "--identity", identity,
                 "--metrics-address", f"127.0.0.1:{port}", *extra],
                stdout=out, stderr=subprocess.STDOUT,
                env={k: v for k, v in (os.environ | settings_env | (env or {})).items() if v},
            )  # fmt: skip
        return cls(process, port, log)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def status(self) -> dict[str, Any]:
        """``/status`` straight from the replica (cheap enough to poll)."""
        code, body = self.get("/status")
        assert code == 200, body
        data: dict[str, Any] = json.loads(body)
        return data

    def status_cli(self, *args: str) -> dict[str, Any]:
        """``ebbtide status -o json`` against this replica, as a user runs it."""
        result = subprocess.run(
            [sys.executable, "-m", "controller", "status", "-o", "json",
             "--url", f"http://127.0.0.1:{self.port}", *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample from /metrics (0 when absent)."""
        _, text = self.get("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == name or (series.startswith(name + "{") and want in series):
                return float(value)
        return 0.0

    def decisions(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "decision":
                out.append(record)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


async def eventually(
    predicate: Callable[[], bool], within: float, tick: Callable[[], None] | None = None
) -> None:
    """Poll ``predicate`` (calling ``tick`` between polls, e.g. to keep producing events)."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        if tick is not None:
            tick()
        await asyncio.sleep(0.4)


async def ready(process: ControllerProcess, within: float = 40) -> None:
    def ok() -> bool:
        assert process.process.poll() is None, process.log.read_text()[-3000:]
        return process.get("/readyz")[0] == 200

    await eventually(ok, within)


@contextlib.asynccontextmanager
async def in_process_controller(
    kubeapi: KubeAPIServer, tmp: Path, *, policy: Path = HERE / "policy.yaml"
) -> AsyncIterator[Controller]:
    """A :class:`Controller` over a leading, synced :class:`KubeRuntime` on ``kubeapi``, in this
    process and without Kafka: tests feed its engine and call ``evaluate_once``."""
    settings = load_settings(
        policies=[policy],
        # The production lease timings: no other replica competes for the lease here, and a
        # 2 s lease is lost on a loaded machine (a test then sees "not the leader").
        kube={"kubeconfig": kubeapi.write_kubeconfig(tmp / "kubeconfig"),
              "lease_namespace": "ebbtide-system"},
        http={"address": "127.0.0.1:0"},
        dry_run=False,
    )  # fmt: skip
    loaded = load_policy_files(settings)
    runtime = await KubeRuntime.connect(settings.kube, loaded, dry_run=settings.dry_run_for(loaded))
    task = asyncio.create_task(runtime.run())
    try:
        deadline = time.monotonic() + 10
        while not (runtime.cluster.synced and runtime.is_leader()):
            assert time.monotonic() < deadline, "the runtime did not sync and lead in time"
            await asyncio.sleep(0.05)
        yield Controller(settings, runtime, loaded)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runtime.close()
