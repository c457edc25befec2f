"""Checkpoint notices expire, are cleared, and count against the eviction budget (issue 21,
item 5): a notice left by an abandoned preemption never lets a later one evict unannounced."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from controller.loop.port import Outcome
from policies.checkpoint import (
    ACK,
    DEFAULT_DEADLINE_S,
    FOR,
    GRACE_S,
    HANDSHAKE,
    NOTICE,
    next_step,
    stamp,
)
from policies.model import Policy
from policies.snapshot import Pod, frozen_map
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.workload_kinds import TRAINING, evict, kind_actuator, training_policy, writes

T0 = 1_900_000_000.0
EXPIRES = DEFAULT_DEADLINE_S + GRACE_S
DAYS = 3 * 86400.0


@pytest.mark.parametrize(
    ("annotations", "now", "action"),
    [
        pytest.param(
            {HANDSHAKE: "true", NOTICE: stamp(T0)}, T0 + EXPIRES - 1, "evict", id="within-grace"
        ),
        pytest.param({HANDSHAKE: "true", NOTICE: stamp(T0)}, T0 + EXPIRES, "notify", id="expired"),
        pytest.param(
            {HANDSHAKE: "true", NOTICE: stamp(T0), ACK: stamp(T0 + 5)},
            T0 + DAYS,
            "notify",
            id="expired-and-acked-is-not-acknowledged",
        ),
    ],
)
def test_a_notice_expires_grace_after_its_deadline(
    annotations: dict[str, str], now: float, action: str
) -> None:
    """A notice older than deadline + grace is no notice (nor is its ack): notify afresh."""
    assert next_step(annotations, now=now).action == action


async def _pod(kubeapi: KubeAPIServer, name: str, annotations: dict[str, str]) -> None:
    pod = make_pod(name, namespace="ml", labels=TRAINING, gpus=1)
    pod["metadata"]["annotations"] = annotations
    await kubeapi.create(pod)


def _annotations(kubeapi: KubeAPIServer, name: str) -> dict[str, Any]:
    stored = kubeapi.get("Pod", "ml", name)
    assert stored is not None
    return dict(stored["metadata"].get("annotations") or {})


async def test_a_notice_left_days_ago_gets_a_fresh_one_not_an_eviction(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A preemption abandoned three days ago left its notice and the workload's ack; the next
    preemption gives a fresh notice (the old ack removed) and evicts nothing yet."""
    await _pod(kubeapi, "train-0", {HANDSHAKE: "true", NOTICE: stamp(T0), ACK: stamp(T0 + 9)})
    now = T0 + DAYS
    act = kind_actuator(kube_client, ("Deployment",), clock=lambda: now)
    (result,) = await act.apply([evict("ml/train-0")])
    assert result.outcome is Outcome.IN_PROGRESS, result.detail
    assert "had expired" in result.detail
    stored = _annotations(kubeapi, "train-0")
    assert stored[NOTICE] == stamp(now)
    assert ACK not in stored
    assert not [p for _, p in writes(kubeapi) if p.endswith("/eviction")]


@pytest.mark.parametrize("dry_run", [False, True], ids=["live", "dry-run"])
async def test_expired_notices_are_cleared_from_their_pods(
    kubeapi: KubeAPIServer, kube_client: ApiClient, dry_run: bool
) -> None:
    """An expired notice, its need and its ack are removed from the pod; a standing notice
    and an opted-in pod never noticed are left alone; in dry-run nothing is written."""
    noticed = {HANDSHAKE: "true", NOTICE: stamp(T0), FOR: "serving/chat", ACK: stamp(T0 + 9)}
    await _pod(kubeapi, "old", noticed)
    await _pod(kubeapi, "fresh", {HANDSHAKE: "true", NOTICE: stamp(T0 + EXPIRES - 60)})
    await _pod(kubeapi, "never", {HANDSHAKE: "true"})
    now = T0 + EXPIRES
    act = kind_actuator(kube_client, ("Deployment",), clock=lambda: now, dry_run=dry_run)
    pods = [
        Pod("ml", p["metadata"]["name"], annotations=frozen_map(p["metadata"]["annotations"]))
        for p in kubeapi.objects("pods")
    ]
    cleared = await act.expire_notices(pods)
    assert cleared == ["ml/old"]
    if dry_run:
        assert writes(kubeapi) == []
        assert _annotations(kubeapi, "old") == noticed
        return
    assert _annotations(kubeapi, "old") == {HANDSHAKE: "true"}
    assert _annotations(kubeapi, "fresh")[NOTICE] == stamp(T0 + EXPIRES - 60)
    assert writes(kubeapi) == [("PATCH", "/api/v1/namespaces/ml/pods/old")]


def _one_eviction() -> Policy:
    policy = training_policy()
    budgets = policy.spec.budgets.model_copy(
        update={"evictions": policy.spec.budgets.evictions.model_copy(update={"max": 1})}
    )
    return policy.model_copy(update={"spec": policy.spec.model_copy(update={"budgets": budgets})})


async def test_a_notice_counts_against_the_eviction_budget(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """With one eviction per window, a notice spends it: the next eviction is refused (before,
    notices were refunded like a PDB's "not now", so any number could be given)."""
    await _pod(kubeapi, "asked", {HANDSHAKE: "true"})
    await _pod(kubeapi, "plain", {})
    act = kind_actuator(kube_client, ("Deployment",), policy=_one_eviction(), clock=lambda: T0)
    noticed, other = await act.apply([evict("ml/asked"), evict("ml/plain")])
    assert noticed.outcome is Outcome.IN_PROGRESS, noticed.detail
    assert other.outcome is Outcome.REFUSED, other.detail
    assert "budget spent" in other.detail
    assert kubeapi.get("Pod", "ml", "plain") is not None
