"""Which pods of a node are scraped, from their annotations; targets given on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.agent.discovery import PodDiscovery, targets_from_pods
from controller.agent.servers import BUILTIN, KindsError, known_kinds
from controller.cli.scrape_command import parse_target
from support.kubeapi_objects import make_pod


def pod(
    name: str,
    annotations: dict[str, str],
    *,
    phase: str = "Running",
    ip: str | None = "10.1.2.3",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {
            "name": name,
            "namespace": "prod",
            "annotations": annotations,
            "labels": labels or {},
        },
        "status": status,
    }


ON = {"ebbtide.io/scrape": "true"}


def test_annotated_running_pods_become_targets_with_kind_defaults() -> None:
    found = targets_from_pods(
        [
            pod(
                "chat-1",
                {**ON, "ebbtide.io/server": "vllm"},
                labels={"app.kubernetes.io/name": "chat"},
            ),
            pod(
                "sg-1",
                {
                    **ON,
                    "ebbtide.io/server": "sglang",
                    "ebbtide.io/service": "code",
                    "ebbtide.io/port": "9000",
                    "ebbtide.io/path": "/m",
                    "ebbtide.io/model": "qwen",
                },
            ),
            pod(
                "tr-1",
                {**ON, "ebbtide.io/server": "triton", "ebbtide.io/match": "model=a, version=1"},
                labels={"app": "ranker"},
                ip="fd00::7",
            ),
            pod("off", {"ebbtide.io/server": "vllm"}, labels={"app": "x"}),
            pod(
                "pending", {**ON, "ebbtide.io/server": "vllm"}, phase="Pending", labels={"app": "x"}
            ),
        ],
        BUILTIN,
    )
    assert found.problems == {}
    assert [(t.url, t.service, t.pod, t.kind.name) for t in found.targets] == [
        ("http://10.1.2.3:8000/metrics", "chat", "chat-1", "vllm"),
        ("http://10.1.2.3:9000/m", "code", "sg-1", "sglang"),
        ("http://[fd00::7]:8002/metrics", "ranker", "tr-1", "triton"),
    ]
    assert found.targets[1].model == "qwen"
    assert found.targets[2].match == (("model", "a"), ("version", "1"))


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        pytest.param({"ebbtide.io/service": "s"}, "no ebbtide.io/server annotation", id="no-kind"),
        pytest.param(
            {"ebbtide.io/server": "ollama", "ebbtide.io/service": "s"},
            "not a known kind",
            id="unknown-kind",
        ),
        pytest.param(
            {"ebbtide.io/server": "vllm", "ebbtide.io/service": "s", "ebbtide.io/port": "http"},
            "not a port",
            id="bad-port",
        ),
        pytest.param({"ebbtide.io/server": "vllm"}, "no service name", id="no-service"),
        pytest.param(
            {"ebbtide.io/server": "vllm", "ebbtide.io/service": "s", "ebbtide.io/match": "model"},
            "not label=value",
            id="bad-match",
        ),
    ],
)
def test_unusable_annotations_are_one_line_each(annotations: dict[str, str], why: str) -> None:
    found = targets_from_pods([pod("p", {**ON, **annotations})], BUILTIN)
    assert found.targets == []
    assert why in found.problems["prod/p"]


def test_target_option() -> None:
    t = parse_target("kserve:ml/iris=http://10.0.0.9:8080/metrics#model_name=iris", BUILTIN)
    assert (t.kind.name, t.namespace, t.service, t.url) == (
        "kserve",
        "ml",
        "iris",
        "http://10.0.0.9:8080/metrics",
    )
    assert t.match == (("model_name", "iris"),)
    for bad in ("vllm=http://x", "nope:a/b=http://x", "vllm:a/b=ftp://x"):
        with pytest.raises(ValueError, match=r"expected|unknown|http"):
            parse_target(bad, BUILTIN)


def test_custom_kinds_file(tmp_path: Any) -> None:
    path = tmp_path / "kinds.yaml"
    path.write_text(
        "kinds:\n"
        "  - name: llamacpp\n"
        "    port: 8080\n"
        "    latency: [{metric: llamacpp:request_latency_seconds, objective: e2e}]\n"
        "    waiting: [llamacpp:requests_deferred]\n"
    )
    kinds = known_kinds(path)
    assert kinds["llamacpp"].waiting == ("llamacpp:requests_deferred",)
    assert "vllm" in kinds
    path.write_text(
        "kinds:\n  - name: x\n    port: 80\n    latency: [{metric: m, objective: p99}]\n"
    )
    with pytest.raises(KindsError, match=r"kinds\.0\.latency\.0\.objective"):
        known_kinds(path)


def test_the_documented_custom_kind_loads(tmp_path: Any) -> None:
    """docs/servers/custom.md's example is a file the agent accepts."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "servers" / "custom.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "kinds.yaml"
    path.write_text(block)
    kind = known_kinds(path)["llamacpp"]
    assert kind.tokens == ("llamacpp:tokens_predicted_total",)
    assert kind.latency[0].objective == "e2e"


@pytest.mark.kube_rbac(None)
async def test_pod_discovery_lists_this_nodes_pods_over_the_api(
    kubeapi: Any, kube_client: Any
) -> None:
    """Over HTTP to the Kubernetes API test server: only this node's annotated running pods,
    listed again once the refresh time has passed."""

    def annotated(name: str, node: str, ip: str) -> dict[str, Any]:
        pod = make_pod(name, namespace="prod", node=node, labels={"app": name.split("-")[0]})
        pod["metadata"]["annotations"] = {**ON, "ebbtide.io/server": "vllm"}
        pod["status"]["podIP"] = ip
        return pod

    await kubeapi.create(annotated("chat-0", "gpu-1", "10.0.1.5"))
    await kubeapi.create(annotated("chat-1", "gpu-2", "10.0.2.5"))
    now = [0.0]
    discovery = PodDiscovery(kube_client, "gpu-1", BUILTIN, refresh_s=15.0, clock=lambda: now[0])
    assert [t.url for t in await discovery()] == ["http://10.0.1.5:8000/metrics"]
    assert (await discovery())[0].node == "gpu-1"
    await kubeapi.create(annotated("code-0", "gpu-1", "10.0.1.6"))
    assert len(await discovery()) == 1  # not listed again before the refresh time
    now[0] = 16.0
    assert sorted(t.service for t in await discovery()) == ["chat", "code"]
