"""NVIDIA's dcgm-exporter as a GPU source, beside NVML.

From ``etc/default-counters.csv`` (``DCGM_FI_DEV_GPU_UTIL``, percent; ``DCGM_FI_DEV_FB_USED``
and ``DCGM_FI_DEV_FB_FREE``, MiB) and ``etc/dcp-metrics-included.csv``
(``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, the ratio of time the graphics engine was active, which
DCGM reports per MIG instance where NVML reports nothing). Labels as its exposition template
writes them: ``gpu``, ``UUID``, ``modelName``, ``Hostname``, on MIG instances ``GPU_I_PROFILE``
and ``GPU_I_ID``, and with its Kubernetes pod mapping ``namespace``, ``pod``, ``container``.
Metrics on port 9400.

A whole GPU is published from ``DCGM_FI_DEV_GPU_UTIL`` (what NVML reports too); a MIG instance
from ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` times 100. The pod comes from the exporter's labels. Run the
NVML agent with ``--mig-util skip`` on nodes where dcgm-exporter is scraped, so the two do not
both report an instance (NVML's memory-occupancy fallback is not activity).
"""

from __future__ import annotations

from controller.agent.exposition import Exposition
from controller.agent.servers.kind import ServerKind
from streams.events import GpuUtilization

__all__ = ["DCGM", "ENGINE_ACTIVE", "GPU_UTIL", "gpu_events"]

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"

DCGM = ServerKind(
    name="dcgm",
    port=9400,
    source="NVIDIA/dcgm-exporter: etc/default-counters.csv, etc/dcp-metrics-included.csv",
    role="gpu",
    gauges=(GPU_UTIL, ENGINE_ACTIVE, FB_USED, FB_FREE),
)


def _device(labels: dict[str, str]) -> tuple[str, str | None, str | None]:
    return labels.get("gpu", ""), labels.get("GPU_I_PROFILE"), labels.get("GPU_I_ID")


def gpu_events(
    expo: Exposition, *, node: str | None, ts: float
) -> tuple[list[GpuUtilization], int]:
    """``gpu.utilization`` events of one dcgm-exporter scrape, and how many series could not
    be read (no ``gpu`` label or no node name)."""
    memory: dict[tuple[str, str | None, str | None], dict[str, float]] = {}
    for name in (FB_USED, FB_FREE):
        for series in expo.values.get(name, ()):
            memory.setdefault(_device(dict(series.labels)), {})[name] = series.value
    out: list[GpuUtilization] = []
    unreadable = 0
    for name, scale, mig in ((GPU_UTIL, 1.0, False), (ENGINE_ACTIVE, 100.0, True)):
        for series in expo.values.get(name, ()):
            labels = dict(series.labels)
            gpu, profile, instance = _device(labels)
            where = labels.get("Hostname") or node
            if (profile is not None) != mig:
                continue  # whole GPUs from GPU_UTIL, MIG instances from GR_ENGINE_ACTIVE
            if not gpu.isdigit() or not where or (instance is not None and not instance.isdigit()):
                unreadable += 1
                continue
            mem = memory.get((gpu, profile, instance), {})
            used, free = mem.get(FB_USED), mem.get(FB_FREE)
            pod = labels.get("pod")
            out.append(
                GpuUtilization(
                    ts=ts,
                    node=where,
                    gpu=int(gpu),
                    util_pct=min(100.0, max(0.0, series.value * scale)),
                    mig_profile=profile,
                    mig_instance=int(instance) if instance is not None else None,
                    mem_used_mib=used,
                    mem_total_mib=used + free if used is not None and free is not None else None,
                    pod=f"{labels.get('namespace', 'default')}/{pod}" if pod else None,
                )
            )
    return out, unreadable
