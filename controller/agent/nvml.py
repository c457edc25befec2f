"""Reading GPUs and MIG instances through NVML, read-only, into plain frozen dataclasses.

The reader takes the ``pynvml`` module (from ``nvidia-ml-py``) as a constructor argument, so
tests inject a small fake with the same function names and error class, and no test needs a
GPU. ``pynvml`` is untyped: it is ``Any`` at this edge and nothing untyped leaves this module.

Only query functions are called (``nvmlInit``/``nvmlShutdown`` aside): the agent never changes
MIG mode, clocks, power limits or any other setting.

What one :meth:`NvmlReader.read` returns, per device index:

* a GPU with MIG disabled → one :class:`GpuReading` (utilization, memory);
* a GPU with MIG enabled → one :class:`MigReading` per MIG device, and no whole-GPU reading:
  NVML reports no utilization for a MIG-enabled parent, and a whole-GPU event for it would let
  the controller count a partitioned card as an idle whole card;
* a device whose query fails (``NVML_ERROR_GPU_IS_LOST``, ``UNKNOWN``, a fallen-off-the-bus
  card) → one :class:`DeviceFailure`; the other devices are still read.

MIG utilization: ``nvmlDeviceGetUtilizationRates`` on a MIG device handle returns
``NVML_ERROR_NOT_SUPPORTED`` on current drivers; the per-instance graphics-engine activity that
dcgm-exporter shows (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``) comes from DCGM's profiling module, not
NVML. The reader still tries, and reports ``util_pct=None`` when NVML says no; the publisher
decides what to do with that (see :mod:`controller.agent.publisher`).

MIG profile names (``1g.10gb``) come from the MIG device's name (``NVIDIA H100 80GB HBM3 MIG
1g.10gb``); when the name carries none, they are derived from the instance's attributes (slice
count and memory size), which matches NVIDIA's naming for the standard profiles.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import structlog

from controller.controller_errors import ControllerError

__all__ = [
    "DeviceFailure",
    "GpuReading",
    "MigReading",
    "NvmlReader",
    "NvmlUnavailable",
    "Sample",
    "load_pynvml",
]

log = structlog.get_logger(__name__)

MIB: Final = 1024 * 1024
_PROFILE_RE: Final = re.compile(r"(?<![\w.])([1-9]g\.[0-9]+gb(?:\+me)?)\b")
# Symbolic NVML return codes (nvml.h); a fake module does not need to define them.
_NOT_SUPPORTED: Final = 3
_NOT_FOUND: Final = 6
_MIG_ENABLE: Final = 1


class NvmlUnavailable(ControllerError, RuntimeError):
    """NVML cannot be used on this machine: no driver, no library, or no permission."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One whole GPU (MIG disabled)."""

    index: int
    uuid: str
    name: str
    util_pct: float | None
    """GPU (SM) utilization over NVML's last sample period; ``None`` when not supported."""
    mem_used_mib: float
    mem_total_mib: float


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (a GPU instance with its compute instance) on a MIG-enabled GPU."""

    gpu_index: int
    gpu_uuid: str
    uuid: str
    """The MIG device's own UUID (``MIG-…``), which device plugins hand to pods."""
    profile: str
    """e.g. ``1g.10gb``."""
    gpu_instance: int
    compute_instance: int | None
    util_pct: float | None
    """``None`` on drivers that report no utilization for MIG devices (most of them)."""
    mem_used_mib: float
    mem_total_mib: float


@dataclass(frozen=True, slots=True)
class DeviceFailure:
    """A device that could not be read this round; the others were."""

    index: int
    mig_index: int | None
    reason: str
    """NVML's message, e.g. ``GPU is lost``."""


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything one round read, in device order."""

    gpus: tuple[GpuReading, ...]
    migs: tuple[MigReading, ...]
    failures: tuple[DeviceFailure, ...]

    @property
    def devices(self) -> int:
        return len(self.gpus) + len(self.migs)


def load_pynvml() -> Any:
    """The real ``pynvml`` module, or :class:`NvmlUnavailable` when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable("cannot load NVML: the nvidia-ml-py package is missing") from exc


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads every device on each :meth:`read`; ``with`` (or open/close) brackets NVML init."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml: Any = nvml
        self._open = False

    @property
    def is_open(self) -> bool:
        """NVML is initialised: the process holds the GPU device files open."""
        return self._open

    def open(self) -> None:
        if self._nvml is None:
            self._nvml = load_pynvml()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise NvmlUnavailable(f"cannot initialise NVML: {_text(exc)}") from exc
        self._open = True
        try:
            driver = _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            driver = "unknown"
        log.info("nvml ready", driver=driver)

    def close(self) -> None:
        if self._open and self._nvml is not None:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.warning("nvml shutdown failed", error=_text(exc))

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def read(self) -> Sample:
        """Read every device once. Per-device errors become :class:`DeviceFailure` entries;
        only a failure to count devices (NVML itself gone) raises :class:`NvmlUnavailable`."""
        nvml = self._nvml
        if not self._open or nvml is None:
            raise RuntimeError("NvmlReader.read() before open()")
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"cannot count GPUs: {_text(exc)}") from exc
        gpus: list[GpuReading] = []
        migs: list[MigReading] = []
        failures: list[DeviceFailure] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                if self._mig_enabled(handle):
                    migs.extend(self._read_migs(handle, index, uuid, failures))
                else:
                    gpus.append(self._read_gpu(handle, index, uuid))
            except nvml.NVMLError as exc:
                failures.append(DeviceFailure(index, None, _text(exc)))
        return Sample(tuple(gpus), tuple(migs), tuple(failures))

    # -- one device ---------------------------------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _mig_enabled(self, handle: Any) -> bool:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as exc:
            if self._code(exc) == _NOT_SUPPORTED:
                return False  # not a MIG-capable GPU
            raise
        return int(current) == _MIG_ENABLE

    def _utilization(self, handle: Any) -> float | None:
        nvml = self._nvml
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        except nvml.NVMLError as exc:
            if self._code(exc) == _NOT_SUPPORTED:
                return None
            raise
        return min(100.0, max(0.0, float(rates.gpu)))

    def _memory(self, handle: Any) -> tuple[float, float]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        total = float(info.total) / MIB
        return min(float(info.used) / MIB, total), total

    def _read_gpu(self, handle: Any, index: int, uuid: str) -> GpuReading:
        used, total = self._memory(handle)
        return GpuReading(
            index=index,
            uuid=uuid,
            name=_text(self._nvml.nvmlDeviceGetName(handle)),
            util_pct=self._utilization(handle),
            mem_used_mib=used,
            mem_total_mib=total,
        )

    def _read_migs(
        self, parent: Any, index: int, uuid: str, failures: list[DeviceFailure]
    ) -> list[MigReading]:
        nvml = self._nvml
        out: list[MigReading] = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except nvml.NVMLError as exc:
                if self._code(exc) == _NOT_FOUND:
                    continue  # an empty slot: fewer instances than the maximum
                failures.append(DeviceFailure(index, slot, _text(exc)))
                continue
            try:
                out.append(self._read_mig(mig, index, uuid))
            except (nvml.NVMLError, ValueError) as exc:
                failures.append(DeviceFailure(index, slot, _text(exc)))
        return out

    def _read_mig(self, mig: Any, index: int, uuid: str) -> MigReading:
        nvml = self._nvml
        used, total = self._memory(mig)
        try:
            ci: int | None = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        except nvml.NVMLError:
            ci = None
        return MigReading(
            gpu_index=index,
            gpu_uuid=uuid,
            uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
            profile=self._profile(mig),
            gpu_instance=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
            compute_instance=ci,
            util_pct=self._utilization(mig),
            mem_used_mib=used,
            mem_total_mib=total,
        )

    def _profile(self, mig: Any) -> str:
        nvml = self._nvml
        try:
            match = _PROFILE_RE.search(_text(nvml.nvmlDeviceGetName(mig)))
        except nvml.NVMLError:
            match = None
        if match:
            return match.group(1)
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        slices = int(attrs.gpuInstanceSliceCount)
        gib = round(int(attrs.memorySizeMB) / 1024)
        if not 1 <= slices <= 9 or gib <= 0:
            raise ValueError(f"cannot tell the MIG profile: {slices} slices, {gib} GiB")
        return f"{slices}g.{gib}gb"
