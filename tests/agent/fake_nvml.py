"""A fake ``pynvml``: the query functions the agent calls, over GPUs described in plain Python.

Same names, same error class shape (``NVMLError`` with a numeric ``value``) and the same return
shapes as ``nvidia-ml-py`` (``.gpu`` on utilization rates, bytes in ``.used``/``.total``,
``[current, pending]`` MIG mode). It defines no setter at all, and records every call, so a test
can prove the agent stays read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024
NOT_SUPPORTED, NOT_FOUND, DRIVER_NOT_LOADED, GPU_IS_LOST, UNKNOWN = 3, 6, 9, 15, 999
_MESSAGES = {
    NOT_SUPPORTED: "Not Supported",
    NOT_FOUND: "Not Found",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    GPU_IS_LOST: "GPU is lost",
    UNKNOWN: "Unknown Error",
}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeMig:
    uuid: str
    profile: str
    gi: int
    ci: int = 0
    used_mib: float = 0.0
    total_mib: float = 9856.0
    slices: int = 1
    util: int | None = None
    """``None``: NVML_ERROR_NOT_SUPPORTED, as on real drivers."""
    name_has_profile: bool = True


@dataclass
class FakeGpu:
    uuid: str
    util: int = 0
    used_mib: float = 0.0
    total_mib: float = 81559.0
    name: str = "NVIDIA H100 80GB HBM3"
    migs: list[FakeMig | None] | None = None
    """``None``: MIG disabled; otherwise MIG slots in order, ``None`` for an empty slot."""
    mig_capable: bool = True
    lost: bool = False
    """Every query but getting the handle fails with NVML_ERROR_GPU_IS_LOST."""
    failing_slots: frozenset[int] = frozenset()
    """MIG slots whose handle lookup fails with NVML_ERROR_UNKNOWN."""


@dataclass(frozen=True)
class _Handle:
    gpu: int
    slot: int | None = None


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    init_error: int | None = None
    calls: list[str] = field(default_factory=list)
    NVMLError: type[FakeNVMLError] = FakeNVMLError

    # -- helpers ----------------------------------------------------------------------------

    def _gpu(self, handle: _Handle, call: str) -> FakeGpu:
        self.calls.append(call)
        gpu = self.gpus[handle.gpu]
        if gpu.lost:
            raise FakeNVMLError(GPU_IS_LOST)
        return gpu

    def _mig(self, handle: _Handle, call: str) -> FakeMig:
        gpu = self._gpu(handle, call)
        assert gpu.migs is not None
        assert handle.slot is not None
        mig = gpu.migs[handle.slot]
        assert mig is not None
        return mig

    # -- the pynvml API ---------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls.append("nvmlSystemGetDriverVersion")
        return "580.65.06"

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self.calls.append("nvmlDeviceGetHandleByIndex")
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        if handle.slot is not None:
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> bytes:
        if handle.slot is not None:
            mig = self._mig(handle, "nvmlDeviceGetName")
            gpu = self.gpus[handle.gpu]
            return f"{gpu.name} MIG {mig.profile}".encode() if mig.name_has_profile else b"MIG"
        return self._gpu(handle, "nvmlDeviceGetName").name.encode()  # pynvml may give bytes

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if not gpu.mig_capable:
            raise FakeNVMLError(NOT_SUPPORTED)
        mode = int(gpu.migs is not None)
        return [mode, mode]

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        if handle.slot is not None:
            util = self._mig(handle, "nvmlDeviceGetUtilizationRates").util
        else:
            gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
            util = None if gpu.migs is not None else gpu.util
        if util is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return SimpleNamespace(gpu=util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> Any:
        if handle.slot is not None:
            mig = self._mig(handle, "nvmlDeviceGetMemoryInfo")
            used, total = mig.used_mib, mig.total_mib
        else:
            gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
            used, total = gpu.used_mib, gpu.total_mib
        return SimpleNamespace(
            used=int(used * MIB), total=int(total * MIB), free=int((total - used) * MIB)
        )

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return len(gpu.migs or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index in gpu.failing_slots:
            raise FakeNVMLError(UNKNOWN)
        if gpu.migs is None or index >= len(gpu.migs) or gpu.migs[index] is None:
            raise FakeNVMLError(NOT_FOUND)
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId").gi

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId").ci

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> Any:
        mig = self._mig(handle, "nvmlDeviceGetAttributes")
        return SimpleNamespace(gpuInstanceSliceCount=mig.slices, memorySizeMB=int(mig.total_mib))


def h100_node(*, lost: int | None = None) -> FakeNvml:
    """Four H100s: 0 and 1 whole, 2 MIG-enabled (two 1g.10gb, one 3g.40gb, an empty slot),
    3 whole. ``lost``: the index of a GPU that has fallen off the bus."""
    gpus = [
        FakeGpu("GPU-0000", util=87, used_mib=40000.0),
        FakeGpu("GPU-1111", util=3, used_mib=512.0),
        FakeGpu(
            "GPU-2222",
            migs=[
                FakeMig("MIG-aaaa", "1g.10gb", gi=7, ci=0, used_mib=4000.0),
                FakeMig("MIG-bbbb", "1g.10gb", gi=8, ci=0, used_mib=0.0),
                None,
                FakeMig("MIG-cccc", "3g.40gb", gi=2, ci=0, used_mib=20000.0, total_mib=40192.0),
            ],
        ),
        FakeGpu("GPU-3333", util=50, used_mib=1000.0),
    ]
    if lost is not None:
        gpus[lost].lost = True
    return FakeNvml(gpus)
