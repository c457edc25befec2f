"""The node telemetry agent (``ebbtide agent``): NVML readings in, ``gpu.utilization`` events out.

Three parts, each testable alone:

* :mod:`controller.agent.nvml` reads whole GPUs and MIG instances through an injectable
  ``pynvml``-compatible module, read-only, tolerating a failing device;
* :mod:`controller.agent.pods` finds the pod using each device through the kubelet
  pod-resources API;
* :mod:`controller.agent.publisher` samples on an interval and publishes one event per device,
  rate-bounded, batched per round, with backoff while the broker is away.
* :mod:`controller.agent.migwatch` watches the agent's own Node and tells the publisher to
  let go of NVML while the MIG manager reconfigures it (imported only when that is asked for:
  it loads the Kubernetes client).
"""

from controller.agent.nvml import (
    DeviceFailure,
    GpuReading,
    MigReading,
    NvmlReader,
    NvmlUnavailable,
    Sample,
)
from controller.agent.pods import PodAttribution, PodResourcesClient, PodResourcesError
from controller.agent.publisher import Agent, AgentSettings, AgentStats, TokenBucket, to_events

__all__ = [
    "Agent",
    "AgentSettings",
    "AgentStats",
    "DeviceFailure",
    "GpuReading",
    "MigReading",
    "NvmlReader",
    "NvmlUnavailable",
    "PodAttribution",
    "PodResourcesClient",
    "PodResourcesError",
    "Sample",
    "TokenBucket",
    "to_events",
]
