"""Realistic manifests of the workload kinds Ebbtide acts on (``manifests/``), and the resource
types the test API server serves them as: JobSet (with its admission webhook), RayCluster,
batch/v1 Job, Kueue Workload and KEDA ScaledObject (PyTorchJob and HorizontalPodAutoscalers are
served by default)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient
from ruamel.yaml import YAML

from controller.kube.actuator import KubeActuator
from controller.kube.client import ApiLimits
from controller.kube.informer import Backoff
from controller.kube.state import ClusterStateSettings, KubeClusterState, workload_kinds
from controller.kube.translate import WorkloadKind
from controller.kube.workloads.autoscalers import Owners
from controller.loop.gate import SafetyGate
from policies.decisions import Evict, Explanation, Scale
from policies.model import Policy

from .jobset_webhook import validate_jobset_update
from .kubeapi import KubeAPIServer
from .kubeapi_store import ResourceType

__all__ = [
    "COSCHEDULING_PODGROUP",
    "JOB",
    "JOBSET",
    "KUEUE_WORKLOAD",
    "RAYCLUSTER",
    "SCALED_OBJECT",
    "TRAINING",
    "VOLCANO_PODGROUP",
    "events",
    "evict",
    "kind_actuator",
    "kueue_state",
    "manifest",
    "manifests",
    "scale",
    "synced_state",
    "training_policy",
    "writes",
]

JOBSET = ResourceType(
    group="jobset.x-k8s.io",
    version="v1alpha2",
    plural="jobsets",
    kind="JobSet",
    validate_update=validate_jobset_update,
)
"""JobSet, behind its validating webhook (``replicatedJobs`` immutable: :mod:`.jobset_webhook`)."""
RAYCLUSTER = ResourceType(group="ray.io", version="v1", plural="rayclusters", kind="RayCluster")
JOB = ResourceType(group="batch", version="v1", plural="jobs", kind="Job")
KUEUE_WORKLOAD = ResourceType(
    group="kueue.x-k8s.io", version="v1beta1", plural="workloads", kind="Workload"
)
SCALED_OBJECT = ResourceType(
    group="keda.sh", version="v1alpha1", plural="scaledobjects", kind="ScaledObject"
)

VOLCANO_PODGROUP = ResourceType(
    group="scheduling.volcano.sh", version="v1beta1", plural="podgroups", kind="PodGroup"
)
COSCHEDULING_PODGROUP = ResourceType(
    group="scheduling.x-k8s.io", version="v1alpha1", plural="podgroups", kind="PodGroup"
)

_DIR = Path(__file__).parent / "manifests"


@cache
def _load(file: str) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in YAML(typ="safe").load_all((_DIR / file).read_text()) if d)


def manifests(file: str) -> list[dict[str, Any]]:
    """Fresh copies of every object in ``manifests/<file>``."""
    return copy.deepcopy(list(_load(file)))


def manifest(file: str, kind: str | None = None) -> dict[str, Any]:
    """A fresh copy of the (first, or first ``kind``) object in ``manifests/<file>``."""
    docs = [d for d in _load(file) if kind is None or d["kind"] == kind]
    return copy.deepcopy(docs[0])


TRAINING = {"ebbtide.io/class": "training"}


@asynccontextmanager
async def synced_state(
    api: ApiClient,
    settings: ClusterStateSettings | None = None,
    *,
    kinds: tuple[WorkloadKind, ...] | None = None,
) -> AsyncIterator[KubeClusterState]:
    """A started KubeClusterState (fast retries and the default kinds unless ``settings`` or
    ``kinds`` say otherwise), synced; stopped on exit."""
    settings = settings or ClusterStateSettings(backoff=Backoff(base_s=0.02, max_s=0.2))
    if kinds is not None:
        settings = dataclasses.replace(settings, workload_kinds=kinds)
    state = KubeClusterState(api, settings)
    task = asyncio.create_task(state.run(), name="workload kinds state")
    try:
        await asyncio.wait_for(state.wait_synced(), 5)
        yield state
    finally:
        state.stop()
        await asyncio.wait_for(task, 5)


def training_policy(**training: Any) -> Policy:
    """A policy selecting ``ebbtide.io/class: training`` workloads, with ample budgets."""
    return Policy.model_validate(
        {
            "apiVersion": "ebbtide.io/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "kinds"},
            "spec": {
                "pools": {"whole": {"nodeSelector": {"ebbtide.io/pool": "whole"}}},
                "training": {"selector": dict(TRAINING), **training},
                "budgets": {"evictions": {"max": 10, "per": "10m"}},
            },
        }
    )


def kind_actuator(
    api: ApiClient,
    kinds: tuple[str, ...],
    *,
    policy: Policy | None = None,
    dry_run: bool = False,
    owners: Callable[[], Owners] = dict,
    clock: Callable[[], float] = time.time,
) -> KubeActuator:
    """A leader's actuator for the named kinds, with short API limits."""
    gate = SafetyGate(
        policy or training_policy(), is_leader=lambda: True, dry_run=dry_run, clock=clock
    )
    return KubeActuator(
        api,
        gate,
        nodes=list,
        workload_kinds=workload_kinds(kinds),
        limits=ApiLimits(timeout_s=0.5, attempts=3, deadline_s=5.0),
        owners=owners,
    )


def why(rule: str = "free-gpus-evict-training") -> Explanation:
    return Explanation.of(rule, "serving/chat breaching", inputs={"gpus_needed": 1})


_AT = itertools.count(1)


def scale(workload: str, kind: str, frm: int, to: int) -> Scale:
    """A training Scale decision, each at its own time (so each is its own decision)."""
    return Scale(float(next(_AT)), workload, kind, frm, to, "training", why())


def evict(pod: str, workload: str | None = None) -> Evict:
    """An Evict decision, each at its own time."""
    return Evict(float(next(_AT)), pod, "gpu-1", workload, 10.0, why())


def events(server: KubeAPIServer) -> list[tuple[str, str, str]]:
    """(reason, involved kind/name, message) of every core/v1 Event."""
    return [
        (e["reason"], f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}", e["message"])
        for e in server.objects("events")
    ]


def kueue_state(
    server: KubeAPIServer, workload: str, kind: str, name: str
) -> tuple[bool, str | None]:
    """(the Kueue Workload ``ml/<workload>`` is active, the ``kind`` ``ml/<name>``'s
    ``ebbtide.io/preempted`` mark)."""
    stored, job = server.get("Workload", "ml", workload), server.get(kind, "ml", name)
    assert stored is not None
    assert job is not None
    mark = (job["metadata"].get("annotations") or {}).get("ebbtide.io/preempted")
    return bool(stored["spec"]["active"]), mark


def writes(server: KubeAPIServer) -> list[tuple[str, str]]:
    """(method, path) of every request that was not a read, Events left out."""
    return [
        (r.method, r.path) for r in server.requests if r.method != "GET" and "/events" not in r.path
    ]
