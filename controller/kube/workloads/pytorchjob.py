"""Kubeflow PyTorchJob (training operator ``kubeflow.org/v1``).

The training operator owns the job's size: an elastic job (``spec.elasticPolicy``) runs between
``elasticPolicy.minReplicas`` and ``maxReplicas`` Worker replicas, and the operator removes the
highest-index workers first when ``Worker.replicas`` goes down, so worker-0 (the rendezvous
host) stays. Ebbtide therefore:

* takes the bounds from ``elasticPolicy`` (never below 1, so worker-0 stays), not from its own
  annotations, and writes ``Worker.replicas`` through ``/scale``;
* never resizes a job without ``elasticPolicy`` (torchrun's world size is fixed): such a job is
  evicted whole or left alone, as the policy decides;
* never resizes a job whose ``elasticPolicy.metrics`` is set: the operator then runs its own
  HorizontalPodAutoscaler on the job, and two autoscalers would fight;
* never evicts the Master or worker-0 of an elastic job: shrinking it is the owner's way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from controller.kube.translate import PYTORCHJOB, Obj, get_path
from controller.kube.workloads.base import Adapter, Patch, int_or_none, meta

__all__ = ["PYTORCHJOBS", "PyTorchJobAdapter"]

_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"


def _elastic(obj: Obj) -> Mapping[str, Any] | None:
    policy = get_path(obj, "spec.elasticPolicy")
    return policy if isinstance(policy, Mapping) else None


class PyTorchJobAdapter(Adapter):
    """See the module docstring."""

    via_scale = True
    suspend_path = "spec.runPolicy.suspend"

    def bounds(self, obj: Obj) -> tuple[int, int]:
        replicas = self.replicas(obj)
        elastic = _elastic(obj)
        if elastic is None or elastic.get("metrics"):
            return replicas, replicas  # never resized
        lo = int_or_none(elastic.get("minReplicas"))
        hi = int_or_none(elastic.get("maxReplicas"))
        lo = max(1, replicas if lo is None else lo)
        return lo, max(lo, replicas if hi is None else hi)

    def owner_refusal(self, obj: Obj, to: int) -> str | None:
        elastic = _elastic(obj)
        if elastic is None:
            return "the PyTorchJob has no elasticPolicy: its world size is fixed"
        if elastic.get("metrics"):
            return (
                "the PyTorchJob's elasticPolicy.metrics is set: the training operator's "
                "HorizontalPodAutoscaler owns its size"
            )
        return super().owner_refusal(obj, to)

    def resize(self, obj: Obj, to: int, pods: Sequence[Obj]) -> Patch:
        return Patch({"spec": {"replicas": to}}, sub="scale")

    def pod_refusal(self, obj: Obj, pod: Obj) -> str | None:
        """Why this pod of the job must not be evicted: the Master, or worker-0 of an elastic
        job (which shrinks through its replicas instead)."""
        labels: Mapping[str, str] = meta(pod).get("labels") or {}
        role = labels.get(_REPLICA_TYPE, "").lower()
        if role == "master":
            return "the PyTorchJob's Master is never evicted"
        if _elastic(obj) is not None and role == "worker" and labels.get(_REPLICA_INDEX) == "0":
            return "worker-0 of an elastic PyTorchJob is never evicted (it shrinks instead)"
        return None


PYTORCHJOBS = PyTorchJobAdapter(PYTORCHJOB)
