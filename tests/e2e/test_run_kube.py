"""`ebbtide run` end to end: Kafka events in, Kubernetes API calls out, as SREs run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streams.broker import free_port
from support.e2e import HERE, World, eventually, ready

pytestmark = pytest.mark.slow
Obj = dict[str, Any]


async def delete_surplus_pods(world: World, namespace: str, deploy: str) -> None:
    """Play the Deployment controller: remove the newest pods beyond spec.replicas."""
    want = world.replicas(namespace, deploy)
    names = sorted(
        p["metadata"]["name"]
        for p in world.kubeapi.objects("Pod", namespace)
        if p["metadata"]["name"].startswith(deploy)
    )
    for name in names[want:]:
        await world.kubeapi.delete("Pod", namespace, name)


@pytest.mark.full_cluster
async def test_breach_shrinks_training_and_recovery_grows_it_back(world: World) -> None:
    """With no GPU free, slow chat requests on Kafka shrink the elastic training job through
    /scale and scale chat up; inference pods are never touched; fast requests afterwards grow
    training back."""
    controller = world.start()
    await ready(controller)
    started = time.monotonic()
    await eventually(lambda: world.replicas("ml", "train") < 10, 20, lambda: world.latency(900))
    reaction = time.monotonic() - started
    shrunk = world.replicas("ml", "train")
    assert 2 <= shrunk < 10
    assert world.replicas("serving", "chat") > 2
    assert len(world.kubeapi.objects("Pod", "serving")) == 2  # inference never evicted
    assert reaction < 10  # breachAfter is 2s; the rest is window fill and one evaluation

    await delete_surplus_pods(world, "ml", "train")
    await eventually(lambda: world.replicas("ml", "train") > shrunk, 30, lambda: world.latency(40))
    decisions = controller.decisions()
    rules = {d["rule"] for d in decisions}
    assert any(
        d["action"] == "scale" and d["target"] == "ml/train" and d["to"] < d["from"]
        for d in decisions
    )
    assert any(
        d["action"] == "scale" and d["target"] == "ml/train" and d["to"] > d["from"]
        for d in decisions
    )
    assert all(d["target"] != "serving/chat" or d["action"] == "scale" for d in decisions)
    assert rules  # every decision names its rule
    assert controller.metric("ebbtide_actions_total", action="scale", outcome="applied") >= 2
    assert controller.stop() == 0


async def convert_the_idle_node(world: World) -> Obj:
    """Feed utilization until the idle whole-card node ``gpu-2`` is converted to MIG through
    the fake MIG manager (relabelled, moved to the MIG pool, uncordoned, flow annotation gone),
    check the others stayed whole, stop the controller and return the node."""
    controller = world.start()
    await ready(controller)

    def feed() -> None:
        world.utilization("gpu-0", 80)  # pool mean 53 %: clearly under convertBelow (60 %)
        world.utilization("gpu-1", 80)
        world.utilization("gpu-2", 0)

    def converted() -> bool:
        node = world.kubeapi.get("Node", None, "gpu-2")
        assert node is not None
        labels = node["metadata"].get("labels", {})
        return (
            labels.get("nvidia.com/mig.config") == "all-1g.10gb"
            and labels.get("nvidia.com/mig.config.state") == "success"
            and labels.get("ebbtide.io/pool") == "mig"
            and not node["spec"].get("unschedulable")
            and "ebbtide.io/mig-flow" not in node["metadata"].get("annotations", {})
        )

    await eventually(converted, 40, feed)
    for other in ("gpu-0", "gpu-1"):
        node = world.kubeapi.get("Node", None, other)
        assert node is not None
        assert node["metadata"]["labels"]["ebbtide.io/pool"] == "whole"
    assert world.mig.applied[0][:2] == ("gpu-2", "all-1g.10gb")
    assert controller.stop() == 0
    node = world.kubeapi.get("Node", None, "gpu-2")
    assert node is not None
    return node


async def test_an_idle_node_is_converted_to_mig(world: World) -> None:
    """Idle-GPU utilization events convert the idle whole-card node to MIG (mixed strategy:
    the instances as nvidia.com/mig-1g.10gb)."""
    node = await convert_the_idle_node(world)
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "28"


@pytest.mark.mig_single
async def test_an_idle_node_is_converted_to_mig_under_the_single_strategy(world: World) -> None:
    """Under mig.strategy=single (the GPU operator's MIG guide) the same conversion finishes:
    the node advertises its 28 instances as nvidia.com/gpu, GFD's product names the profile,
    and no conversion failed or rolled back."""
    node = await convert_the_idle_node(world)
    gpu = {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
    assert gpu == {"nvidia.com/gpu": "28"}
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "28"
    assert [a for a in world.mig.applied if a[1] != "all-1g.10gb"] == []


@pytest.mark.parametrize(
    "env", [{}, {"EBBTIDE_DRY_RUN": None}], ids=["--dry-run", "the-default-against-kube"]
)
async def test_dry_run_writes_nothing_but_reports_what_it_would_do(
    world: World, env: dict[str, str | None]
) -> None:
    """With --dry-run, and by default against a real cluster, a breach and an idle node produce
    decisions marked dry_run, and the only writes the API server sees are Events and the
    Lease."""
    controller = world.start(*([] if env else ["--dry-run"]), env=env)
    await ready(controller)

    def feed() -> None:
        world.latency(900)
        world.utilization("gpu-2", 0)

    await eventually(lambda: any(d["action"] == "scale" for d in controller.decisions()), 20, feed)
    assert all(d["dry_run"] for d in controller.decisions())
    assert world.replicas("ml", "train") == 6
    assert world.replicas("serving", "chat") == 2
    assert (
        world.kubeapi.get("Node", None, "gpu-2")["metadata"]["labels"]["ebbtide.io/pool"] == "whole"
    )
    writes = [
        r
        for r in world.kubeapi.requests
        if r.method in ("POST", "PUT", "PATCH", "DELETE")
        and "/events" not in r.path
        and "/leases" not in r.path
    ]
    assert writes == []
    assert controller.stop() == 0


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", "run", *args],
        capture_output=True, text=True, timeout=60, env=os.environ | (env or {}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(
            ["--policy", str(HERE / "policy.yaml"), "--bootstrap", "127.0.0.1:{port}",
             "--cluster", "kube", "--kubeconfig", "{kubeconfig}"],
            {}, "cannot reach Kafka", id="unreachable-broker",
        ),
        pytest.param(
            ["--policy", str(HERE / "policy.yaml"), "--kubeconfig", "/nonexistent/kubeconfig"],
            {}, "no Kubernetes configuration: /nonexistent/kubeconfig does not exist",
            id="missing-kubeconfig",
        ),
        pytest.param(
            ["--policy", "{bad_policy}"], {}, "invalid policy", id="invalid-policy",
        ),
        pytest.param(
            ["--policy", str(HERE / "policy.yaml"), "--cluster", "mesos"], {},
            "cluster must be 'kube' or 'sim:SCENARIO'", id="bad-cluster",
        ),
    ],
)  # fmt: skip
def test_bad_settings_fail_with_one_clear_line(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    """A wrong setting is one line on stderr and a non-zero exit, never a traceback."""
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text("apiVersion: ebbtide.io/v1alpha1\nkind: Policy\nspec: {pools: 3}\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    filled = [
        a.format(port=free_port(), kubeconfig=kubeconfig, bad_policy=bad_policy) for a in args
    ]
    result = run_cli(*filled, env=env)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
