"""The Kubernetes actuator over real HTTP against the test API server: scale through ``/scale``,
evict through the Eviction API, safety refusals, dry-run, leadership, budgets and API faults —
asserting on what the server stored and on its request log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import ApiClient, Configuration

from controller.kube.actuator import KubeActuator
from controller.kube.client import ApiLimits
from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult, Notice, Outcome
from policies.decisions import Decision, Evict, Explanation, Scale
from policies.model import Policy
from support.kubeapi import KubeAPIServer
from support.kubeapi_objects import make_pod
from support.kubeapi_rbac import chart_authorizer

Obj = dict[str, Any]
TRAINING = {"ebbtide.io/class": "training"}
DND = "ebbtide.io/do-not-disrupt"
WHY = Explanation.of(
    "free-gpus-evict-training",
    "serving/chat breaching (P99 450ms > objective 300ms)",
    inputs={"p99_ms": 450.0, "gpus_needed": 2},
    thresholds={"objective_ms": 300},
)
FAST = ApiLimits(timeout_s=0.3, attempts=4, deadline_s=5.0)


def policy(*, evictions: int = 10, **spec: Any) -> Policy:
    body: dict[str, Any] = {
        "protectedNamespaces": ["kube-system"],
        "pools": {
            "whole": {"nodeSelector": {"ebbtide.io/pool": "whole"}},
            "mig": {"nodeSelector": {"ebbtide.io/pool": "mig"}, "kind": "mig"},
        },
        "training": {"selector": dict(TRAINING)},
        "budgets": {"evictions": {"max": evictions, "per": "10m"}},
        **spec,
    }
    meta = {"name": "test"}
    return Policy.model_validate(
        {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": meta, "spec": body}
    )


def actuator(
    api: ApiClient,
    *,
    p: Policy | None = None,
    is_leader: Callable[[], bool] = lambda: True,
    dry_run: bool = False,
    limits: ApiLimits = FAST,
) -> KubeActuator:
    gate = SafetyGate(p or policy(), is_leader=is_leader, dry_run=dry_run)
    return KubeActuator(api, gate, nodes=list, limits=limits)  # no MIG flows here


def deployment(name: str, replicas: int, *, ns: str = "ml", labels: Obj | None = None) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels or TRAINING)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}},
        },
    }


def statefulset(name: str, replicas: int) -> Obj:
    obj = deployment(name, replicas)
    obj["kind"] = "StatefulSet"
    obj["spec"]["serviceName"] = name
    return obj


def pytorchjob(name: str, workers: int) -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "ml", "labels": dict(TRAINING)},
        "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": 2 * workers},
            "pytorchReplicaSpecs": {"Worker": {"replicas": workers}},
        },
    }


def gpu_pod(name: str, *, ns: str = "ml", labels: Obj | None = None, **kw: Any) -> Obj:
    return make_pod(name, namespace=ns, labels=TRAINING if labels is None else labels, gpus=1, **kw)


def shrink(workload: str = "ml/train", kind: str = "Deployment", **kw: Any) -> Scale:
    return Scale(1.0, workload, kind, kw.pop("frm", 4), kw.pop("to", 2), "training", WHY, **kw)


def evict(pod: str = "ml/train-0", **kw: Any) -> Evict:
    return Evict(1.0, pod, "gpu-1", "ml/train", kw.pop("grace_s", 15.0), WHY, **kw)


def writes(server: KubeAPIServer, path_regex: str) -> list[Any]:
    return [r for r in server.requests if r.method != "GET" and r.path.endswith(path_regex)]


def events(server: KubeAPIServer) -> list[tuple[str, str, str]]:
    """(reason, involved kind/name, message) of every core/v1 Event."""
    return [
        (e["reason"], f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}", e["message"])
        for e in server.objects("events")
    ]


async def handlers_done(server: KubeAPIServer) -> None:
    """Wait until every request's handler has ended: a delayed one answered late, or cancelled
    when its client gave up, so none is left that could still change the store."""
    await server.until(lambda: all(r.finished for r in server.requests))


def replicas(server: KubeAPIServer, kind: str, name: str) -> int:
    obj = server.get(kind, "ml", name)
    assert obj is not None
    if kind == "PyTorchJob":
        return int(obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])
    return int(obj["spec"]["replicas"])


# --- scale ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind", "path"),
    [
        (deployment("train", 4), "Deployment", "/deployments/train/scale"),
        (statefulset("train", 4), "StatefulSet", "/statefulsets/train/scale"),
        (pytorchjob("train", 4), "PyTorchJob", "/pytorchjobs/train/scale"),
    ],
    ids=["deployment", "statefulset", "pytorchjob"],
)
async def test_scale_shrinks_through_the_scale_subresource(
    kubeapi: KubeAPIServer, kube_client: ApiClient, obj: Obj, kind: str, path: str
) -> None:
    """A shrink is one conditional merge patch of /scale, with an EbbtideScaled Event."""
    await kubeapi.create(obj)
    act = actuator(kube_client)
    [result] = await act.apply([shrink(kind=kind)])
    assert (result.outcome, result.detail) == (Outcome.APPLIED, "scaled 4→2")
    assert replicas(kubeapi, kind, "train") == 2
    [patch] = writes(kubeapi, path)
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body["spec"] == {"replicas": 2}
    assert patch.body["metadata"]["resourceVersion"]
    [(reason, involved, message)] = events(kubeapi)
    assert (reason, involved) == ("EbbtideScaled", f"{kind}/train")
    assert "[free-gpus-evict-training]" in message
    assert "p99_ms=450" in message
    assert "objective_ms=300" in message
    event = kubeapi.objects("events")[0]
    assert event["reportingComponent"] == "ebbtide.io/controller"
    assert event["involvedObject"]["uid"] == kubeapi.get(kind, "ml", "train")["metadata"]["uid"]  # type: ignore[index]
    assert act.stats.total(action="scale", outcome=Outcome.APPLIED) == 1


async def test_scale_already_at_target_writes_nothing(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A workload already at ``to`` is ALREADY_DONE: no write of any kind reaches the server."""
    await kubeapi.create(deployment("train", 2))
    [result] = await actuator(kube_client).apply([shrink()])
    assert result.outcome is Outcome.ALREADY_DONE
    assert [r for r in kubeapi.requests if r.method != "GET"] == []


async def test_scale_scripted_conflict_rereads_and_writes_once(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A 409 on the write re-reads, still finds ``from``, and writes once more: one change."""
    await kubeapi.create(deployment("train", 4))
    kubeapi.faults.add(method="PATCH", path_regex="/scale$", status=409, times=1)
    [result] = await actuator(kube_client).apply([shrink()])
    assert result.outcome is Outcome.APPLIED
    assert [r.status for r in writes(kubeapi, "/scale")] == [409, 200]
    assert kubeapi.get("Deployment", "ml", "train")["metadata"]["generation"] == 2  # type: ignore[index]


@pytest.mark.parametrize(
    ("fault", "transient"),
    [
        ({"status": 409, "times": None}, True),
        ({"status": 503, "times": None}, True),
        ({"status": 422, "times": None}, False),
    ],
    ids=["conflicts-every-time", "server-error-every-time", "refused-by-a-webhook"],
)
async def test_a_failed_scale_says_whether_a_retry_may_meet_it_again(
    kubeapi: KubeAPIServer, kube_client: ApiClient, fault: Obj, transient: bool
) -> None:
    """A scale that keeps conflicting or meets a server error FAILS as transient (retried after
    the hold-off); a refusal that repeats itself (a webhook's 422) FAILS as lasting (the
    workload is held off the victim plan)."""
    await kubeapi.create(deployment("train", 4))
    kubeapi.faults.add(method="PATCH", path_regex="/scale$", **fault)
    [result] = await actuator(kube_client).apply([shrink()])
    await handlers_done(kubeapi)
    assert result.outcome is Outcome.FAILED, result.detail
    assert result.transient is transient


@pytest.mark.parametrize(
    ("theirs", "outcome"),
    [(2, Outcome.ALREADY_DONE), (3, Outcome.REFUSED)],
    ids=["they-reached-to", "they-set-something-else"],
)
async def test_scale_concurrent_change_is_never_overwritten(
    kubeapi: KubeAPIServer, kube_client: ApiClient, theirs: int, outcome: Outcome
) -> None:
    """A change between our read and write makes ours a 409; we re-read and never overwrite."""
    await kubeapi.create(deployment("train", 4))
    kubeapi.faults.add(method="PATCH", path_regex="/scale$", status=None, delay=0.3)
    act = actuator(kube_client, limits=ApiLimits(timeout_s=2.0, attempts=2))

    async def someone_else() -> None:
        await asyncio.sleep(0.1)
        await kubeapi.patch("Deployment", "ml", "train", {"spec": {"replicas": theirs}})

    [result], _ = await asyncio.gather(act.apply([shrink()]), someone_else())
    assert result.outcome is outcome
    assert replicas(kubeapi, "Deployment", "train") == theirs
    assert [r.status for r in writes(kubeapi, "/scale")] == [409]
    if outcome is Outcome.REFUSED:
        assert "changed under us" in result.detail


# --- evict ---------------------------------------------------------------------------------------


async def test_eviction_201_deletes_the_pod_with_the_decided_grace(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """An eviction posts policy/v1 Eviction with the grace period and a uid precondition."""
    created = await kubeapi.create(gpu_pod("train-0"))
    act = actuator(kube_client)
    [result] = await act.apply([evict(grace_s=15.0)])
    assert result.outcome is Outcome.APPLIED
    assert kubeapi.get("pods", "ml", "train-0") is None
    [post] = writes(kubeapi, "/eviction")
    assert (post.status, post.body["deleteOptions"]) == (
        201,
        {"gracePeriodSeconds": 15, "preconditions": {"uid": created["metadata"]["uid"]}},
    )
    assert [e[:2] for e in events(kubeapi)] == [("EbbtideEvicted", "Pod/train-0")]
    assert act.gate.budgets.evictions.used(act.gate.now()) == 1


async def test_pdb_429_is_blocked_and_the_pod_stays(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A PDB refusal is BLOCKED: no delete behind its back, the pod stays, no budget spent."""
    await kubeapi.create(gpu_pod("train-0", labels={**TRAINING, "app": "train"}))
    await kubeapi.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "minAvailable": 1},
        }
    )
    act = actuator(kube_client)
    [result] = await act.apply([evict()])
    assert result.outcome is Outcome.BLOCKED
    assert kubeapi.get("pods", "ml", "train-0") is not None
    assert [r.status for r in writes(kubeapi, "/eviction")] == [429]
    assert not [r for r in kubeapi.requests if r.method == "DELETE"]
    assert [e[0] for e in events(kubeapi)] == ["EbbtideEvictionBlocked"]
    assert act.gate.budgets.evictions.used(act.gate.now()) == 0


async def test_gone_or_terminating_pod_is_already_done(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A pod that is gone, or already terminating, is ALREADY_DONE with no eviction posted."""
    pod = gpu_pod("train-1")
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    await kubeapi.create(pod)
    await kubeapi.delete("pods", "ml", "train-1")
    results = await actuator(kube_client).apply([evict("ml/train-0"), evict("ml/train-1")])
    assert [r.outcome for r in results] == [Outcome.ALREADY_DONE, Outcome.ALREADY_DONE]
    assert writes(kubeapi, "/eviction") == []


REFUSALS = [
    ("protected-namespace", gpu_pod("p", ns="kube-system"), evict("kube-system/p"), "protected"),
    ("do-not-disrupt", {"annotations": {DND: "true"}}, evict("ml/p"), "do-not-disrupt"),
    ("outside-selector", gpu_pod("p", labels={"app": "web"}), evict("ml/p"), "training selector"),
    ("workload-outside", deployment("train", 4, labels={"app": "x"}), shrink(), "selector"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "decision", "why"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
async def test_refusals_write_an_event_and_nothing_else(
    kubeapi: KubeAPIServer, kube_client: ApiClient, obj: Obj, decision: Decision, why: str
) -> None:
    """Protected, do-not-disrupt or unselected live objects: REFUSED, an Event, no write."""
    if "annotations" in obj:  # the live pod gained the annotation after the engine decided
        pod = gpu_pod("p")
        pod["metadata"]["annotations"] = obj["annotations"]
        obj = pod
    await kubeapi.create(obj)
    [result] = await actuator(kube_client).apply([decision])
    assert result.outcome is Outcome.REFUSED
    assert why in result.detail
    assert [r.path for r in kubeapi.requests if r.method != "GET"] == [
        f"/api/v1/namespaces/{obj['metadata']['namespace']}/events"
    ]
    [(reason, _, message)] = events(kubeapi)
    assert reason == "EbbtideRefused"
    assert why in message


async def test_budget_caps_a_burst_of_evictions(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Ten evictions against a budget of three: three pods go, seven are REFUSED and stay."""
    for i in range(10):
        await kubeapi.create(gpu_pod(f"train-{i}"))
    act = actuator(kube_client, p=policy(evictions=3))
    results = await act.apply([evict(f"ml/train-{i}") for i in range(10)])
    assert [r.outcome for r in results] == [Outcome.APPLIED] * 3 + [Outcome.REFUSED] * 7
    assert len(kubeapi.objects("pods", "ml")) == 7
    assert "evictions budget spent" in results[-1].detail


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    limit=st.integers(0, 4),
    concurrent=st.booleans(),
)
async def test_budget_holds_for_random_decision_sequences(
    picks: list[int], limit: int, concurrent: bool
) -> None:
    """Random (repeated, overlapping) eviction sequences never evict more pods than the budget."""
    server = KubeAPIServer(authorizer=chart_authorizer())
    async with server, ApiClient(Configuration(host=server.url)) as api:
        for i in range(6):
            await server.create(gpu_pod(f"train-{i}"))
        act = actuator(api, p=policy(evictions=limit))
        decisions = [evict(f"ml/train-{i}") for i in picks]
        if concurrent:
            batches = await asyncio.gather(*(act.apply([d]) for d in decisions))
            results = [r for batch in batches for r in batch]
        else:
            results = await act.apply(decisions)
        evicted = 6 - len(server.objects("pods", "ml"))
        applied = sum(r.outcome is Outcome.APPLIED for r in results)
        assert evicted == applied <= limit
        assert len([r for r in writes(server, "/eviction") if r.status == 201]) == evicted
        assert server.forbidden == []


# --- faults --------------------------------------------------------------------------------------

FAULTS = [
    ("500x2", {"status": 500, "times": 2}),
    ("429x2", {"status": 429, "times": 2, "message": "slow down"}),
    ("timeout", {"status": None, "delay": 1.0}),
    ("timeout-committed", {"status": None, "delay": 1.0, "commit": True}),
]


@pytest.mark.parametrize("fault", [f[1] for f in FAULTS], ids=[f[0] for f in FAULTS])
async def test_faults_on_eviction_retry_and_evict_exactly_once(
    kubeapi: KubeAPIServer, kube_client: ApiClient, fault: Obj
) -> None:
    """5xx, throttling and timeouts (even one whose write landed) are retried: one eviction."""
    await kubeapi.create(gpu_pod("train-0"))
    kubeapi.faults.add(method="POST", path_regex="/eviction$", **fault)
    act = actuator(kube_client)
    [result] = await act.apply([evict()])
    await handlers_done(kubeapi)
    assert result.outcome is Outcome.APPLIED
    assert kubeapi.get("pods", "ml", "train-0") is None
    assert [r.status for r in writes(kubeapi, "/eviction")].count(201) <= 1
    assert act.gate.budgets.evictions.used(act.gate.now()) == 1


@pytest.mark.parametrize("fault", [f[1] for f in FAULTS], ids=[f[0] for f in FAULTS])
async def test_faults_on_scale_retry_and_scale_exactly_once(
    kubeapi: KubeAPIServer, kube_client: ApiClient, fault: Obj
) -> None:
    """5xx, throttling and timeouts on /scale are retried and change the spec exactly once."""
    await kubeapi.create(deployment("train", 4))
    kubeapi.faults.add(method="PATCH", path_regex="/scale$", **fault)
    act = actuator(kube_client)
    [result] = await act.apply([shrink()])
    await handlers_done(kubeapi)
    assert result.outcome is Outcome.APPLIED
    stored = kubeapi.get("Deployment", "ml", "train")
    assert stored is not None
    assert (stored["spec"]["replicas"], stored["metadata"]["generation"]) == (2, 2)
    assert act.gate.budgets.scale_steps.used(act.gate.now()) == 1


async def test_event_write_failure_never_fails_the_action(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Events failing with 500 are logged and counted; the eviction is still APPLIED."""
    await kubeapi.create(gpu_pod("train-0"))
    kubeapi.faults.add(method="POST", path_regex="/events$", status=500, times=None)
    act = actuator(kube_client)
    [result] = await act.apply([evict()])
    assert result.outcome is Outcome.APPLIED
    assert (act.stats.events_failed, act.stats.events_written) == (1, 0)


# --- dry-run, leadership, in-flight ------------------------------------------------------------


@pytest.mark.parametrize("source", ["process", "policy", "decision"])
async def test_dry_run_writes_nothing_but_would_events(
    kubeapi: KubeAPIServer, kube_client: ApiClient, source: str
) -> None:
    """In dry-run (from the process, the policy or the decision) only "would" Events are written."""
    await kubeapi.create(deployment("train", 4))
    await kubeapi.create(gpu_pod("train-0"))
    p = policy(dryRun=True) if source == "policy" else policy()
    act = actuator(kube_client, p=p, dry_run=source == "process")
    flag = {"dry_run": True} if source == "decision" else {}
    results = await act.apply([shrink(**flag), evict(**flag)])
    assert [r.outcome for r in results] == [Outcome.DRY_RUN, Outcome.DRY_RUN]
    assert {r.path.rsplit("/", 1)[-1] for r in kubeapi.requests if r.method != "GET"} == {"events"}
    assert sorted(e[0] for e in events(kubeapi)) == ["EbbtideWouldEvict", "EbbtideWouldScale"]
    assert all("would" in e[2] for e in events(kubeapi))
    assert replicas(kubeapi, "Deployment", "train") == 4
    assert kubeapi.get("pods", "ml", "train-0") is not None


async def test_kill_switch_refuses_with_events_only(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The kill switch (process or policy) refuses everything: Events say why, nothing else."""
    await kubeapi.create(deployment("train", 4))
    act = actuator(kube_client, p=policy(killSwitch=True))
    [result] = await act.apply([shrink()])
    assert result.outcome is Outcome.REFUSED
    assert "killSwitch" in result.detail
    assert {r.path.rsplit("/", 1)[-1] for r in kubeapi.requests if r.method != "GET"} == {"events"}
    assert replicas(kubeapi, "Deployment", "train") == 4


async def test_not_leader_writes_nothing(kubeapi: KubeAPIServer, kube_client: ApiClient) -> None:
    """A follower refuses every decision without a single request, Events included."""
    await kubeapi.create(deployment("train", 4))
    await kubeapi.create(gpu_pod("train-0"))
    act = actuator(kube_client, is_leader=lambda: False)
    results = await act.apply([shrink(), evict()])
    assert [(r.outcome, r.detail) for r in results] == [(Outcome.REFUSED, "not the leader")] * 2
    assert kubeapi.requests == []


async def test_leadership_lost_during_the_read_stops_the_write(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """Leadership is checked again right before the write: lost meanwhile, nothing is written."""
    await kubeapi.create(gpu_pod("train-0"))
    checks = iter([True, False])
    act = actuator(kube_client, is_leader=lambda: next(checks, False))
    [result] = await act.apply([evict()])
    assert result.outcome is Outcome.REFUSED
    assert "leadership lost" in result.detail
    assert [r for r in kubeapi.requests if r.method != "GET"] == []


async def test_overlapping_applies_never_issue_an_action_twice(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """The same eviction from two overlapping applies is posted once; the other IN_PROGRESS."""
    await kubeapi.create(gpu_pod("train-0"))
    kubeapi.faults.add(method="GET", path_regex="/pods/train-0$", status=None, delay=0.1)
    act = actuator(kube_client)
    first, second = await asyncio.gather(act.apply([evict()]), act.apply([evict()]))
    outcomes: list[ActionResult] = [*first, *second]
    assert sorted(r.outcome.value for r in outcomes) == ["applied", "in_progress"]
    assert len(writes(kubeapi, "/eviction")) == 1


async def test_a_notice_is_an_event_on_the_workload_from_the_leader_only(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A state the engine reports without a decision (a service whose latency no longer moves
    with its replicas) is a Warning Event on its workload, with its uid; a follower writes
    nothing."""
    await kubeapi.create(deployment("chat", 3, ns="serving", labels={}))
    notice = Notice(
        "serving/chat", "Deployment", "LatencyNotScaling", "P99 is set by the work", True
    )
    await actuator(kube_client, is_leader=lambda: False).notice(notice)
    assert events(kubeapi) == []
    await actuator(kube_client).notice(notice)
    [event] = kubeapi.objects("events")
    assert (event["reason"], event["type"], event["message"]) == (
        "LatencyNotScaling",
        "Warning",
        "P99 is set by the work",
    )
    involved = event["involvedObject"]
    assert (involved["kind"], involved["namespace"], involved["name"]) == (
        "Deployment",
        "serving",
        "chat",
    )
    assert involved["apiVersion"] == "apps/v1"
