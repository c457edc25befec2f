"""dcgm-exporter's exposition to gpu.utilization events: whole GPUs from DCGM_FI_DEV_GPU_UTIL,
MIG instances from DCGM_FI_PROF_GR_ENGINE_ACTIVE, pods from the exporter's labels."""

from __future__ import annotations

from controller.agent.exposition import Exposition, parse_exposition
from controller.agent.servers import BUILTIN
from controller.agent.servers.dcgm import gpu_events
from streams.events import EventDecoder, GpuUtilization, encode_event

# As dcgm-exporter's template writes a series (gpu, UUID, pci_bus_id, device, modelName, on MIG
# GPU_I_PROFILE and GPU_I_ID, Hostname, then the pod labels of its Kubernetes mapping).
EXPOSITION = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",container="vllm",namespace="prod",pod="chat-0"} 73
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbbb",pci_bus_id="00000000:0F:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",container="vllm",namespace="prod",pod="chat-0"} 70000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-cccc",pci_bus_id="00000000:17:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="gpu-node-1",container="ranker",namespace="ml",pod="ranker-1"} 4000
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",container="vllm",namespace="prod",pod="chat-0"} 11559
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-cccc",pci_bus_id="00000000:17:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="gpu-node-1",container="ranker",namespace="ml",pod="ranker-1"} 5856
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:07:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",container="vllm",namespace="prod",pod="chat-0"} 0.71
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-cccc",pci_bus_id="00000000:17:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="gpu-node-1",container="ranker",namespace="ml",pod="ranker-1"} 0.375
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="x",UUID="GPU-dddd",pci_bus_id="00000000:1F:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="1"} 0.5
"""  # noqa: E501


def test_dcgm_whole_gpus_and_mig_instances_with_pods() -> None:
    kind = BUILTIN["dcgm"]
    expo = parse_exposition(EXPOSITION, histograms=(), values=kind.value_names())
    assert isinstance(expo, Exposition)
    events, unreadable = gpu_events(expo, node="fallback-node", ts=50.0)
    assert unreadable == 1  # gpu="x"
    assert events == [
        GpuUtilization(50.0, "gpu-node-1", 0, 73.0, None, None, 70000.0, 81559.0, "prod/chat-0"),
        GpuUtilization(50.0, "gpu-node-1", 1, 0.0),
        GpuUtilization(50.0, "gpu-node-1", 2, 37.5, "1g.10gb", 9, 4000.0, 9856.0, "ml/ranker-1"),
    ]
    decoder = EventDecoder()
    for event in events:
        assert decoder.decode(encode_event(event), now=100.0) == event
