"""The NVML reader against a fake pynvml: whole GPUs, MIG instances, failing devices."""

from __future__ import annotations

import pytest

from agent.fake_nvml import (
    DRIVER_NOT_LOADED,
    FakeGpu,
    FakeMig,
    FakeNvml,
    h100_node,
)
from controller.agent.nvml import DeviceFailure, GpuReading, MigReading, NvmlReader, NvmlUnavailable


def test_whole_gpus_and_mig_instances_are_read() -> None:
    """One reading per whole GPU and per MIG instance (none for a MIG parent or empty slot)."""
    with NvmlReader(h100_node()) as reader:
        sample = reader.read()
    assert sample.gpus == (
        GpuReading(0, "GPU-0000", "NVIDIA H100 80GB HBM3", 87.0, 40000.0, 81559.0),
        GpuReading(1, "GPU-1111", "NVIDIA H100 80GB HBM3", 3.0, 512.0, 81559.0),
        GpuReading(3, "GPU-3333", "NVIDIA H100 80GB HBM3", 50.0, 1000.0, 81559.0),
    )
    assert sample.migs == (
        MigReading(2, "GPU-2222", "MIG-aaaa", "1g.10gb", 7, 0, None, 4000.0, 9856.0),
        MigReading(2, "GPU-2222", "MIG-bbbb", "1g.10gb", 8, 0, None, 0.0, 9856.0),
        MigReading(2, "GPU-2222", "MIG-cccc", "3g.40gb", 2, 0, None, 20000.0, 40192.0),
    )
    assert sample.failures == ()
    assert sample.devices == 6


def test_a_lost_gpu_is_skipped_and_the_others_are_read() -> None:
    """NVML_ERROR_GPU_IS_LOST on one device becomes a DeviceFailure; the rest still read."""
    with NvmlReader(h100_node(lost=1)) as reader:
        sample = reader.read()
    assert [g.index for g in sample.gpus] == [0, 3]
    assert len(sample.migs) == 3
    assert sample.failures == (DeviceFailure(1, None, "GPU is lost"),)


def test_a_failing_mig_instance_is_skipped_alone() -> None:
    """An error inside one MIG slot fails that slot only, not its siblings or its GPU."""
    gpu = FakeGpu("GPU-9", migs=[FakeMig("MIG-1", "1g.10gb", gi=1), None])
    gpu.failing_slots = frozenset({1})
    nvml = FakeNvml([gpu])
    with NvmlReader(nvml) as reader:
        sample = reader.read()
    assert [m.uuid for m in sample.migs] == ["MIG-1"]
    assert sample.failures == (DeviceFailure(0, 1, "Unknown Error"),)


@pytest.mark.parametrize(
    ("slices", "total_mib", "expected"),
    [
        pytest.param(1, 9856.0, "1g.10gb", id="h100-1g.10gb"),
        pytest.param(3, 40192.0, "3g.39gb", id="rounded-from-attributes"),
        pytest.param(7, 81408.0, "7g.80gb", id="h100-7g.80gb"),
    ],
)
def test_profile_from_attributes_when_the_name_has_none(
    slices: int, total_mib: float, expected: str
) -> None:
    """Without a profile in the device name, slices and memory size name the profile."""
    mig = FakeMig("MIG-x", "ignored", gi=1, slices=slices, total_mib=total_mib)
    mig.name_has_profile = False
    with NvmlReader(FakeNvml([FakeGpu("GPU-x", migs=[mig])])) as reader:
        assert reader.read().migs[0].profile == expected


def test_a_gpu_that_is_not_mig_capable_is_read_whole() -> None:
    """nvmlDeviceGetMigMode NOT_SUPPORTED (pre-Ampere) means a whole GPU, not a failure."""
    nvml = FakeNvml([FakeGpu("GPU-v100", util=12, mig_capable=False, name="Tesla V100")])
    with NvmlReader(nvml) as reader:
        sample = reader.read()
    assert [(g.uuid, g.util_pct) for g in sample.gpus] == [("GPU-v100", 12.0)]
    assert sample.failures == ()


def test_init_failure_is_nvml_unavailable() -> None:
    """A failing nvmlInit becomes NvmlUnavailable with NVML's message."""
    with pytest.raises(NvmlUnavailable, match="cannot initialise NVML: Driver Not Loaded"):
        NvmlReader(FakeNvml([], init_error=DRIVER_NOT_LOADED)).open()


def test_only_queries_are_called() -> None:
    """The reader is read-only: every NVML call is init/shutdown or a Get query."""
    nvml = h100_node(lost=0)
    with NvmlReader(nvml) as reader:
        reader.read()
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"
    writes = [c for c in nvml.calls[1:-1] if not c.startswith(("nvmlDeviceGet", "nvmlSystemGet"))]
    assert writes == []


def test_read_before_open_is_a_bug() -> None:
    """Reading an unopened reader raises instead of calling NVML uninitialised."""
    with pytest.raises(RuntimeError, match="before open"):
        NvmlReader(h100_node()).read()
