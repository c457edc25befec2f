"""Which inference servers run on this node: pods that ask to be scraped.

A pod opts in with annotations (the same idea as ``prometheus.io/scrape``, under Ebbtide's own
prefix so that turning on Ebbtide changes nothing for Prometheus)::

    ebbtide.io/scrape: "true"
    ebbtide.io/server: vllm          # a built-in kind (vllm, sglang, tgi, triton, kserve,
                                     # dcgm) or one from the agent's --server-kinds file
                                     # (dcgm: gpu.utilization events, no service needed)
    ebbtide.io/port: "8000"          # default: the kind's port
    ebbtide.io/path: /metrics        # default: the kind's path
    ebbtide.io/service: chat         # default: label app.kubernetes.io/name, then app
    ebbtide.io/model: llama-3-8b     # optional, copied to the events
    ebbtide.io/match: model=a        # optional: read only series with these labels

Only running pods with an IP are scraped, over the pod network (the agent's NetworkPolicy must
allow it to reach them). A pod whose annotations cannot be used is left out with one line
saying why (:attr:`Discovered.problems`), logged when it first appears.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from controller.agent.exposition import Labels
from controller.agent.servers import ServerKind
from controller.agent.signals import Target

__all__ = ["PREFIX", "Discovered", "PodDiscovery", "targets_from_pods"]

PREFIX = "ebbtide.io/"

log = structlog.get_logger("ebbtide.agent.discovery")


@dataclass(slots=True)
class Discovered:
    targets: list[Target] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    """``namespace/pod`` -> why it is not scraped."""


def targets_from_pods(
    pods: Iterable[Mapping[str, Any]], kinds: Mapping[str, ServerKind]
) -> Discovered:
    """Targets of the opted-in pods among ``pods`` (Kubernetes Pod objects as JSON)."""
    out = Discovered()
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        if annotations.get(PREFIX + "scrape", "").lower() != "true":
            continue
        name = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        try:
            target = _target(meta, annotations, status["podIP"], kinds)
            node = (pod.get("spec") or {}).get("nodeName")
            out.targets.append(replace(target, node=node) if node else target)
        except ValueError as exc:
            out.problems[name] = str(exc)
    return out


def _target(
    meta: Mapping[str, Any],
    annotations: Mapping[str, str],
    ip: str,
    kinds: Mapping[str, ServerKind],
) -> Target:
    kind_name = annotations.get(PREFIX + "server")
    if kind_name is None:
        raise ValueError(f"no {PREFIX}server annotation (one of {', '.join(sorted(kinds))})")
    kind = kinds.get(kind_name)
    if kind is None:
        raise ValueError(
            f"{PREFIX}server={kind_name!r} is not a known kind ({', '.join(sorted(kinds))})"
        )
    port_text = annotations.get(PREFIX + "port", str(kind.port))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{PREFIX}port={port_text!r} is not a port number")
    path = annotations.get(PREFIX + "path", kind.path)
    if not path.startswith("/"):
        raise ValueError(f"{PREFIX}path={path!r} must start with /")
    labels: Mapping[str, str] = meta.get("labels") or {}
    service = (
        annotations.get(PREFIX + "service")
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
    )
    if not service and kind.role == "gpu":
        service = kind.name  # a GPU exporter serves no service: its events are keyed by node
    if not service:
        raise ValueError(
            f"no service name: set {PREFIX}service (or label app.kubernetes.io/name or app)"
        )
    host = f"[{ip}]" if ":" in ip else ip
    return Target(
        url=f"http://{host}:{port_text}{path}",
        kind=kind,
        service=service,
        namespace=meta.get("namespace", "default"),
        pod=meta.get("name"),
        model=annotations.get(PREFIX + "model"),
        match=parse_match(annotations.get(PREFIX + "match", "")),
    )


def parse_match(text: str) -> Labels:
    """``"model=a,version=1"`` -> sorted label pairs; ``ValueError`` naming the bad part."""
    pairs: list[tuple[str, str]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"match {part!r} is not label=value")
        pairs.append((key.strip(), value.strip()))
    return tuple(sorted(pairs))


class PodDiscovery:
    """Lists this node's pods through the Kubernetes API at most every ``refresh_s`` seconds
    (a list per second per node would load the API server for nothing: pods start in tens of
    seconds), and serves the last list in between."""

    def __init__(
        self,
        api: Any,
        node: str,
        kinds: Mapping[str, ServerKind],
        *,
        refresh_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api, self._node, self._kinds = api, node, kinds
        self._refresh_s = refresh_s
        self._clock = clock
        self._at = float("-inf")
        self._targets: list[Target] = []
        self._reported: dict[str, str] = {}

    async def __call__(self) -> Sequence[Target]:
        if self._clock() - self._at < self._refresh_s:
            return self._targets
        from kubernetes_asyncio import client  # loaded only by agents that discover

        resp: Any = await client.CoreV1Api(self._api).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", _preload_content=False
        )
        body = json.loads(await resp.read())
        found = targets_from_pods(body.get("items", []), self._kinds)
        for pod, why in found.problems.items():
            if self._reported.get(pod) != why:
                log.warning("pod not scraped", pod=pod, reason=why)
        self._reported = found.problems
        self._targets, self._at = found.targets, self._clock()
        return self._targets
