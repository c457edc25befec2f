"""Shared builders for the policy tests: a small valid policy, snapshots, and event feeders."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from ruamel.yaml import YAML

from policies.checkpoint import Notices
from policies.engine import Engine
from policies.inventory import Inventory
from policies.loader import load_policy_text
from policies.model import Policy
from policies.preemption import Fit, Plan, plan_capacity
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import GpuUtilization, InferenceLatency

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
WHOLE = {"ebbtide.io/pool": "whole"}
MIG = {"ebbtide.io/pool": "mig"}
TRAINING = {"ebbtide.io/class": "training"}
SERVING_PRIORITY = 1000
"""Priority of chat's pods in :func:`cluster`."""

BASE: dict[str, Any] = {
    "apiVersion": "ebbtide.io/v1alpha1",
    "kind": "Policy",
    "metadata": {"name": "test"},
    "spec": {
        "protectedNamespaces": ["kube-system"],
        "pools": {
            "whole": {"nodeSelector": dict(WHOLE), "kind": "whole"},
            "mig": {"nodeSelector": dict(MIG), "kind": "mig"},
        },
        "services": {
            "chat": {
                "namespace": "serving",
                "pool": "whole",
                "gpusPerReplica": 1,
                "replicas": {"min": 1, "max": 10},
                "slo": {
                    "percentile": 99,
                    "objectiveMs": 100,
                    "window": "30s",
                    "resolution": "1s",
                    "breachAfter": "10s",
                    "recoverBelow": "80%",
                    "recoverAfter": "20s",
                    "minSamples": 10,
                },
                "scale": {"tolerance": "10%"},
                "cooldown": "30s",
            }
        },
        "training": {
            "selector": dict(TRAINING),
            "victimOrder": ["priority", "newest"],
            "gracePeriod": "15s",
            "elastic": {"growAfter": "60s", "growStep": 1},
        },
        "mig": {
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "10m",
            "nodeIdleBelow": "5%",
            "maxConcurrent": 1,
            "profiles": {"A100-80GB": "all-1g.10gb"},
            "revertAfter": "2m",
        },
        "budgets": {
            "evictions": {"max": 4, "per": "10m"},
            "scaleSteps": {"max": 20, "per": "10m"},
            "migConversions": {"max": 2, "per": "1h"},
        },
        "cooldowns": {"service": "30s", "trainingGrow": "60s"},
    },
}


def policy_dict(**spec_overrides: Any) -> dict[str, Any]:
    """A deep copy of :data:`BASE` with ``spec`` keys replaced (``None`` removes a key)."""
    data = copy.deepcopy(BASE)
    for key, value in spec_overrides.items():
        if value is None:
            data["spec"].pop(key, None)
        else:
            data["spec"][key] = value
    return data


def to_yaml(data: dict[str, Any]) -> str:
    import io

    out = io.StringIO()
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.dump(data, out)
    return out.getvalue()


def make_policy(**spec_overrides: Any) -> Policy:
    return load_policy_text(to_yaml(policy_dict(**spec_overrides)), "test.yaml")


def training(
    b: SnapshotBuilder,
    name: str,
    *,
    replicas: int,
    nodes: list[str],
    priority: int = 0,
    created: float = 0.0,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    gang: int | None = None,
    namespace: str = "ml",
    gpus_per_replica: int = 1,
    annotations: dict[str, str] | None = None,
) -> SnapshotBuilder:
    """A training workload with its pods, elastic/gang annotations as given."""
    ann = dict(annotations or {})
    if min_replicas is not None:
        ann["ebbtide.io/min-replicas"] = str(min_replicas)
    if max_replicas is not None:
        ann["ebbtide.io/max-replicas"] = str(max_replicas)
    if gang is not None:
        ann["ebbtide.io/gang-minimum"] = str(gang)
    return b.workload(
        namespace,
        name,
        kind="PyTorchJob",
        replicas=replicas,
        gpus_per_replica=gpus_per_replica,
        labels=TRAINING,
        annotations=ann,
        priority=priority,
        created=created,
        nodes=nodes,
    )


def cluster(whole_nodes: int = 2, gpus: int = 8, mig_nodes: int = 0) -> SnapshotBuilder:
    """Nodes ``w0…`` in the whole pool and ``m0…`` (MIG) in the mig pool; chat with 1 replica
    at priority :data:`SERVING_PRIORITY`, above training's (as serving runs in production: a
    pod its owner recreates is evicted only for pods that outrank it)."""
    b = SnapshotBuilder()
    for i in range(whole_nodes):
        b.node(f"w{i}", gpus=gpus, labels=WHOLE)
    for i in range(mig_nodes):
        b.node(f"m{i}", gpus=gpus, labels=MIG, mig_config="all-1g.10gb")
    b.workload("serving", "chat", replicas=1, nodes=["w0"], priority=SERVING_PRIORITY)
    return b


def latency(ts: float, ms: float, service: str = "chat", ns: str = "serving") -> InferenceLatency:
    return InferenceLatency(ts=ts, service=service, namespace=ns, latency_ms=ms)


def feed_latency(engine: Engine, start: float, end: float, ms: float, per_s: int = 20) -> None:
    """``per_s`` requests per second of ``ms`` latency over ``[start, end)``."""
    t = start
    while t < end:
        for k in range(per_s):
            engine.observe(latency(t + k / per_s, ms))
        t += 1.0


def run(
    engine: Engine, snapshot: Snapshot, start: float, end: float, ms: float, step: float = 1.0
) -> Iterator[tuple[float, list[Any]]]:
    """Feed ``ms`` latencies and evaluate once per ``step`` over ``[start, end)``."""
    t = start
    while t < end:
        feed_latency(engine, t, t + step, ms)
        yield t + step, engine.evaluate(t + step, snapshot)
        t += step


def util(ts: float, node: str, gpu: int, pct: float) -> GpuUtilization:
    return GpuUtilization(ts=ts, node=node, gpu=gpu, util_pct=pct)


def plan(
    snapshot: Snapshot,
    needed: int,
    *,
    evictions: int = 10,
    scales: int = 10,
    held: Mapping[str, str] | None = None,
    fit: Fit | None = None,
    claimant: int | None = None,
    policy: Policy | None = None,
    notices: Notices | None = None,
    claimant_waits: bool = False,
) -> Plan:
    """The victim plan for ``needed`` GPUs in the whole pool under the default policy's victim
    order (``policy``: another one's training settings); checks that the snapshot was not
    mutated."""
    inv = Inventory(snapshot, policy or make_policy())
    before = copy.deepcopy(snapshot)
    out = plan_capacity(
        needed=needed,
        pool="whole",
        training=list(inv.training.values()),
        loose_pods=inv.loose_training_pods,
        pod_pool=inv.node_pool,
        victim_order=["priority", "newest"],
        protected_namespaces=frozenset({"kube-system"}),
        scale_budget=scales,
        eviction_budget=evictions,
        held=held,
        fit=fit,
        claimant_priority=claimant,
        notices=notices,
        claimant_waits=claimant_waits,
    )
    assert snapshot == before  # inputs are not mutated
    return out
