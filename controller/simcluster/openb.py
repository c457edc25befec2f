"""A scenario from the Alibaba OpenB trace (cluster-trace-gpu-v2023): real nodes, real pod mix.

The trace has two CSV files: GPU nodes (``sn,cpu_milli,memory_mib,gpu,model``) and pods
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``, times in seconds). The scenario keeps every node (or an evenly
spaced sample) and the GPU pods alive at one moment, turned into what Ebbtide manages.

Choices (documented in ``docs/scenarios.md``):

* **When.** Pods alive at ``T``: scheduled (``scheduled_time`` set), ``creation_time <= T <
  deletion_time``. The default ``T`` is the moment with the most GPUs held by such pods (the
  earliest such moment). ``all`` takes every scheduled GPU pod regardless of time (the
  trace used as a packing workload, as the FGD paper does). Pods without GPUs are skipped.
* **Models.** ``V100M16/V100M32 → V100-16GB/V100-32GB``, ``P100 → P100-16GB``, ``T4 → T4-16GB``,
  ``A10 → A10-24GB``; others (the trace's anonymised ``G2``, ``G3``) pass through. Every node
  gets ``ebbtide.io/pool: whole`` and joins the one whole-card pool ``whole``.
* **Fractional GPUs.** ``gpu_milli < 1000`` is rounded up to one whole GPU: none of the trace's
  GPU models supports MIG, so there is no MIG profile to map a fraction to. The original share is
  kept in the ``openb.alibaba.com/gpu-milli`` annotation.
* **Services and jobs.** Pods are grouped by their resource shape (qos, GPUs, GPU share, CPU,
  memory): identical requests are the replicas of one deployment (the trace has no owner).
  ``LS`` groups become inference services (namespace ``serving``, ``ls-000``… by size,
  priority 1000); ``BE`` groups become elastic training jobs (namespace ``training``,
  ``be-000``…, kind Job, labelled ``ebbtide.io/class: training``, priority 10, ``min-replicas``
  half and ``max-replicas`` twice the replicas). ``Guaranteed`` (priority 2000) and
  ``Burstable`` (500) pods stay standalone pods (namespace ``other``): they hold GPUs but are
  neither scaled nor preempted as training.
* **Sampling.** ``--max-nodes N`` keeps N evenly spaced nodes (the mix of models survives) and the
  same fraction of pods (evenly spaced by name), so the load per GPU stays the same.
* ``created`` offsets keep the trace's creation order (seconds after the oldest pod kept).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from controller.controller_errors import ControllerError

__all__ = [
    "ATTRIBUTION",
    "MODEL_NAMES",
    "OpenbError",
    "OpenbNode",
    "OpenbPod",
    "OpenbSummary",
    "build_document",
    "from_openb",
    "peak_time",
    "read_nodes",
    "read_pods",
    "render",
]

MODEL_NAMES: Final = {
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
    "P100": "P100-16GB",
    "T4": "T4-16GB",
    "A10": "A10-24GB",
}
PRIORITY_CLASSES: Final = {
    "openb-guaranteed": 2000,
    "openb-ls": 1000,
    "openb-burstable": 500,
    "openb-be": 10,
}
POOL_LABELS: Final = {"ebbtide.io/pool": "whole"}
ATTRIBUTION: Final = """\
Derived from the Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 ("OpenB"), from
"Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
(Weng et al., USENIX ATC '23), github.com/alibaba/clusterdata. Provided for research and study
use: keep this file out of shipped packages."""
_NODE_COLUMNS: Final = ("sn", "gpu", "model")
_POD_COLUMNS: Final = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos",
    "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip

At = int | Literal["peak", "all"]


class OpenbError(ControllerError, ValueError):
    """A trace file that cannot be read, placed as ``FILE:LINE: message``."""


@dataclass(frozen=True, slots=True)
class OpenbNode:
    sn: str
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    qos: str
    creation: int
    deletion: int
    scheduled: int | None

    def alive_at(self, t: int) -> bool:
        return self.scheduled is not None and self.creation <= t < self.deletion

    @property
    def gpus(self) -> int:
        """Whole GPUs it gets in the scenario (a shared fraction rounds up to one)."""
        return self.num_gpu


@dataclass(frozen=True, slots=True)
class OpenbSummary:
    nodes: int
    gpus: int
    at: int | None
    services: int
    service_pods: int
    training_jobs: int
    training_pods: int
    other_pods: int
    gpus_requested: int

    def __str__(self) -> str:
        when = "every scheduled pod" if self.at is None else f"pods alive at t={self.at}s"
        return (
            f"openb: {self.nodes} nodes, {self.gpus} GPUs; {when}: {self.services} services "
            f"({self.service_pods} pods), {self.training_jobs} training jobs "
            f"({self.training_pods} pods), {self.other_pods} other pods; "
            f"{self.gpus_requested} GPUs requested"
        )


def _rows(path: Path, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OpenbError(f"{path}:1: cannot read: {exc}") from exc
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise OpenbError(f"{path}:1: missing columns: {', '.join(missing)}")
    for row in reader:
        yield reader.line_num, row


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    try:
        return int(row[column])
    except (TypeError, ValueError) as exc:
        raise OpenbError(f"{path}:{line}: {column}: not an integer: {row[column]!r}") from exc


def read_nodes(path: str | Path) -> list[OpenbNode]:
    """GPU nodes of an ``openb_node_list*.csv`` file, in file order."""
    p = Path(path)
    return [
        OpenbNode(row["sn"], _int(p, line, row, "gpu"), row["model"])
        for line, row in _rows(p, _NODE_COLUMNS)
    ]


def read_pods(path: str | Path) -> list[OpenbPod]:
    """Pods of an ``openb_pod_list*.csv`` file, in file order."""
    p = Path(path)
    out: list[OpenbPod] = []
    for line, row in _rows(p, _POD_COLUMNS):
        num = {c: _int(p, line, row, c) for c in _POD_COLUMNS[1:5]}
        times = {c: _int(p, line, row, c) for c in ("creation_time", "deletion_time")}
        sched = row["scheduled_time"]
        out.append(
            OpenbPod(
                row["name"],
                num["cpu_milli"],
                num["memory_mib"],
                num["num_gpu"],
                num["gpu_milli"],
                row["qos"],
                times["creation_time"],
                times["deletion_time"],
                _int(p, line, row, "scheduled_time") if sched else None,
            )
        )
    return out


def peak_time(pods: Iterable[OpenbPod]) -> int:
    """The earliest moment with the most GPUs held by scheduled pods (0 without any)."""
    changes: dict[int, int] = {}
    for pod in pods:
        if pod.scheduled is not None and pod.gpus > 0 and pod.creation < pod.deletion:
            changes[pod.creation] = changes.get(pod.creation, 0) + pod.gpus
            changes[pod.deletion] = changes.get(pod.deletion, 0) - pod.gpus
    held, best, best_t = 0, 0, 0
    for t in sorted(changes):
        held += changes[t]
        if held > best:
            best, best_t = held, t
    return best_t


def _sample(items: Sequence[Any], keep: int) -> list[Any]:
    if keep >= len(items):
        return list(items)
    return [items[i * len(items) // keep] for i in range(keep)]


def build_document(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    *,
    at: At = "peak",
    max_nodes: int | None = None,
    name: str = "openb",
) -> tuple[dict[str, Any], OpenbSummary]:
    """The scenario document (plain data, as YAML would give it) and a summary."""
    kept_nodes = _sample(nodes, max_nodes) if max_nodes is not None else list(nodes)
    t = peak_time(pods) if at == "peak" else None if at == "all" else int(at)
    alive = [
        p for p in pods if p.gpus > 0 and p.scheduled is not None and (t is None or p.alive_at(t))
    ]
    if len(kept_nodes) < len(nodes):
        share = len(kept_nodes) / len(nodes) if nodes else 0.0
        alive = _sample(sorted(alive, key=lambda p: p.name), math.ceil(len(alive) * share))
    origin = min((p.creation for p in alive), default=0)

    groups: dict[tuple[str, int, int, int, int], list[OpenbPod]] = {}
    others: list[OpenbPod] = []
    for pod in alive:
        if pod.qos in ("LS", "BE"):
            key = (pod.qos, pod.num_gpu, pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
            groups.setdefault(key, []).append(pod)
        else:
            others.append(pod)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    workloads: list[dict[str, Any]] = []
    counts = {"LS": 0, "BE": 0}
    for (qos, num_gpu, milli, cpu, mem), members in ordered:
        n = len(members)
        first = min(p.creation for p in members)
        shape = f"cpu={cpu}m memory={mem}Mi gpu={num_gpu}x{milli}m"
        wl: dict[str, Any] = {
            "namespace": "serving" if qos == "LS" else "training",
            "name": f"{'ls' if qos == 'LS' else 'be'}-{counts[qos]:03d}",
            "kind": "Deployment" if qos == "LS" else "Job",
            "replicas": n,
            "gpusPerReplica": num_gpu,
            "pool": "whole",
            "priorityClass": "openb-ls" if qos == "LS" else "openb-be",
            "created": f"{first - origin}s",
        }
        counts[qos] += 1
        if qos == "BE":
            wl["labels"] = {"ebbtide.io/class": "training"}
            wl["elastic"] = {"min": max(1, n // 2), "max": 2 * n}
        wl["annotations"] = {"openb.alibaba.com/shape": shape}
        if milli < 1000:
            wl["podAnnotations"] = {"openb.alibaba.com/gpu-milli": str(milli)}
        workloads.append(wl)
    standalone: list[dict[str, Any]] = []
    for pod in sorted(others, key=lambda p: p.name):
        cls = "openb-guaranteed" if pod.qos == "Guaranteed" else "openb-burstable"
        entry: dict[str, Any] = {
            "namespace": "other",
            "name": pod.name,
            "gpus": pod.gpus,
            "pool": "whole",
            "priorityClass": cls,
            "created": f"{pod.creation - origin}s",
        }
        if pod.gpu_milli < 1000:
            entry["annotations"] = {"openb.alibaba.com/gpu-milli": str(pod.gpu_milli)}
        standalone.append(entry)

    doc: dict[str, Any] = {
        "apiVersion": "ebbtide.io/v1alpha1",
        "kind": "Scenario",
        "metadata": {
            "name": name,
            "description": "Alibaba OpenB GPU cluster"
            + (f" at t={t}s" if t is not None else ", every scheduled pod"),
        },
        "spec": {
            "seed": 0,
            "pools": {"whole": {"nodeSelector": dict(POOL_LABELS), "kind": "whole"}},
            "priorityClasses": dict(PRIORITY_CLASSES),
            "nodes": [
                {
                    "name": n.sn,
                    "gpus": n.gpus,
                    "model": MODEL_NAMES.get(n.model, n.model),
                    "labels": dict(POOL_LABELS),
                }
                for n in kept_nodes
            ],
            "workloads": workloads,
            "pods": standalone,
        },
    }
    summary = OpenbSummary(
        nodes=len(kept_nodes),
        gpus=sum(n.gpus for n in kept_nodes),
        at=t,
        services=counts["LS"],
        service_pods=sum(w["replicas"] for w in workloads if w["namespace"] == "serving"),
        training_jobs=counts["BE"],
        training_pods=sum(w["replicas"] for w in workloads if w["namespace"] == "training"),
        other_pods=len(standalone),
        gpus_requested=sum(p.gpus for p in alive),
    )
    return doc, summary


def render(doc: dict[str, Any], *, command: str) -> str:
    """The scenario file: a header (attribution, how it was made) and the YAML document."""
    yaml = YAML(typ="rt")
    yaml.default_flow_style = None
    yaml.width = 100
    buf = io.StringIO()
    spec = doc.get("spec", {})
    for section in ("nodes", "pods"):
        rows = []
        for row in spec.get(section, []):
            flow = CommentedMap(row)
            flow.fa.set_flow_style()
            rows.append(flow)
        if section in spec:
            spec[section] = rows
    yaml.dump(doc, buf)
    header = [*ATTRIBUTION.splitlines(), f"Generated by: {command}"]
    header += ["Choices (pods grouped by shape, fractions rounded up): see docs/scenarios.md."]
    return "".join(f"# {line}\n" for line in header) + buf.getvalue()


def from_openb(
    nodes_csv: str | Path,
    pods_csv: str | Path,
    *,
    at: At = "peak",
    max_nodes: int | None = None,
    name: str = "openb",
    command: str = "ebbtide scenario from-openb",
) -> tuple[str, OpenbSummary]:
    """Read the two CSV files and return the scenario file's text and a summary."""
    doc, summary = build_document(
        read_nodes(nodes_csv), read_pods(pods_csv), at=at, max_nodes=max_nodes, name=name
    )
    return render(doc, command=command), summary
