"""The chart's agent with scraping on (values/scrape.yaml): the flags, a token allowed to list
pods and nothing else, egress to the servers' ports, and custom kinds the agent accepts."""

from __future__ import annotations

from pathlib import Path

from controller.agent.servers import known_kinds

from .conftest import Rendered


def test_scraping_agent_flags_rbac_and_egress(
    rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    r = rendered["scrape"]
    spec = r.one("DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True  # to list pods, without releaseDuringMig
    args = spec["containers"][0]["args"]
    assert "--scrape-pods" in args
    assert "--scrape-interval=2s" in args
    assert "--server-kinds=/etc/ebbtide/kinds/kinds.yaml" in args
    assert r.one("ClusterRole", "-agent")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ]
    egress = r.one("NetworkPolicy", "-agent")["spec"]["egress"]
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in egress]
    assert ports[0] == [53, 53]
    assert ports[-2:] == [[443, 6443], [8000, 9400]]  # the API server (pods), the servers
    kinds = tmp_path / "kinds.yaml"
    kinds.write_text(r.one("ConfigMap", "-agent-kinds")["data"]["kinds.yaml"])
    assert known_kinds(kinds)["llamacpp"].latency[0].metric == "llamacpp:request_latency_seconds"


def test_agent_without_scraping_gets_no_pod_access(rendered: dict[str, Rendered]) -> None:
    r = rendered["agent"]
    args = r.one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scrape-pods" not in args
    rules = r.one("ClusterRole", "-agent")["rules"]
    assert all("pods" not in rule["resources"] for rule in rules)
