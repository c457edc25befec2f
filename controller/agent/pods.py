"""Which pod uses each GPU or MIG device: the kubelet pod-resources API.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); ``List`` returns, per pod and container, the
device ids the device plugins allocated. The NVIDIA device plugin hands out GPU UUIDs
(``GPU-…``), MIG device UUIDs (``MIG-…``, or ``MIG-GPU-…/gi/ci`` on old drivers), GPU indexes
under ``deviceIDStrategy=index``, and ``UUID::N`` replicas under time-slicing.

Why this source: it is the kubelet's own record of allocations, read locally (no API-server
load, no RBAC beyond mounting the socket read-only), and it sees MIG devices, which scanning
``NVIDIA_VISIBLE_DEVICES`` in ``/proc`` does not do reliably (and that needs ``hostPID``).

Why gRPC without generated protobuf code: the call needs four tiny messages, of which the agent
reads four string fields. Generated ``_pb2`` modules would add ``protobuf`` with its
generated-code/runtime version lock-step and untyped output; instead :func:`decode_response`
reads the protobuf wire format directly (skipping every field it does not know, so newer
kubelets with more fields still parse) and ``grpcio`` carries the bytes with a raw serializer.
:func:`encode_response` is its inverse, for fake kubelets in tests.

Attribution is optional and never fatal: any failure (no socket, kubelet down, timeout, an
unparsable answer) yields no mapping, so events go out without a ``pod`` field.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import grpc  # type: ignore[import-untyped, unused-ignore]
import structlog

from controller.controller_errors import ControllerError

__all__ = [
    "DEFAULT_SOCKET",
    "ContainerDevices",
    "ContainerResources",
    "PodAttribution",
    "PodResources",
    "PodResourcesClient",
    "PodResourcesError",
    "decode_response",
    "device_owners",
    "encode_response",
]

log = structlog.get_logger(__name__)

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD: Final = "/v1.PodResourcesLister/List"
_MAX_MESSAGE: Final = 16 * 1024 * 1024  # the kubelet's own cap on this API


class PodResourcesError(ControllerError):
    """The pod-resources API could not be asked, or its answer could not be read."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


# -- protobuf wire format (only what this API needs) ------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise PodResourcesError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The length-delimited fields of one message as ``(number, payload)``; others skipped."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise PodResourcesError("truncated length-delimited field")
            yield number, data[pos : pos + size]
            pos += size
        else:
            raise PodResourcesError(f"unsupported wire type {wire}")
    if pos != len(data):
        raise PodResourcesError("truncated fixed-width field")


def _str(payload: bytes) -> str:
    return payload.decode("utf-8", errors="replace")


def _decode_devices(data: bytes) -> ContainerDevices:
    resource, ids = "", []
    for number, payload in _fields(data):
        if number == 1:
            resource = _str(payload)
        elif number == 2:
            ids.append(_str(payload))
    return ContainerDevices(resource, tuple(ids))


def _decode_container(data: bytes) -> ContainerResources:
    name, devices = "", []
    for number, payload in _fields(data):
        if number == 1:
            name = _str(payload)
        elif number == 2:
            devices.append(_decode_devices(payload))
    return ContainerResources(name, tuple(devices))


def _decode_pod(data: bytes) -> PodResources:
    name, namespace, containers = "", "", []
    for number, payload in _fields(data):
        if number == 1:
            name = _str(payload)
        elif number == 2:
            namespace = _str(payload)
        elif number == 3:
            containers.append(_decode_container(payload))
    return PodResources(name, namespace, tuple(containers))


def decode_response(data: bytes) -> list[PodResources]:
    """A serialized ``v1.ListPodResourcesResponse`` → its pods (unknown fields ignored)."""
    return [_decode_pod(payload) for number, payload in _fields(data) if number == 1]


def _field(number: int, payload: bytes) -> bytes:
    out = bytearray()
    for value in ((number << 3) | 2, len(payload)):
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out) + payload


def encode_response(pods: Iterable[PodResources]) -> bytes:
    """The inverse of :func:`decode_response`, for fake kubelets."""
    out = bytearray()
    for pod in pods:
        body = _field(1, pod.name.encode()) + _field(2, pod.namespace.encode())
        for container in pod.containers:
            cbody = _field(1, container.name.encode())
            for dev in container.devices:
                dbody = _field(1, dev.resource_name.encode())
                dbody += b"".join(_field(2, i.encode()) for i in dev.device_ids)
                cbody += _field(2, dbody)
            body += _field(3, cbody)
        out += _field(1, body)
    return bytes(out)


def device_owners(pods: Iterable[PodResources]) -> dict[str, str]:
    """Device id → ``namespace/name`` of the one pod holding it. A time-slicing replica id
    (``UUID::N``) counts as its device; a device shared by several pods is left out, since
    naming one of them would be a guess."""
    owners: dict[str, str] = {}
    shared: set[str] = set()
    for pod in pods:
        if not pod.name or not pod.namespace:
            continue
        owner = f"{pod.namespace}/{pod.name}"
        for container in pod.containers:
            for dev in container.devices:
                for device_id in dev.device_ids:
                    key = device_id.split("::", 1)[0]
                    if owners.setdefault(key, owner) != owner:
                        shared.add(key)
    return {k: v for k, v in owners.items() if k not in shared}


# -- the client -------------------------------------------------------------------------------


class PodResourcesClient:
    """Calls ``v1.PodResourcesLister/List`` on the kubelet's unix socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._channel: Any = None
        self._list: Any = None

    def _target(self) -> str:
        # A missing socket (no kubelet mount) is common and deserves a clearer word than
        # gRPC's UNAVAILABLE after a timeout. A stat on a local path does not block for long.
        if not os.path.exists(self.socket_path):
            raise PodResourcesError(f"no kubelet pod-resources socket at {self.socket_path}")
        return f"unix:{os.path.abspath(self.socket_path)}"

    async def list(self) -> list[PodResources]:
        target = self._target()
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                target,
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE),
                    ("grpc.enable_http_proxy", 0),
                ],
            )
            self._list = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda _request: b"",  # an empty ListPodResourcesRequest
                response_deserializer=bytes,
            )
        try:
            raw = await self._list(b"", timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(f"pod-resources List failed: {exc.code().name}") from exc
        return decode_response(raw)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


class PodAttribution:
    """Device → pod, refreshed on demand; every failure degrades to an empty mapping."""

    def __init__(self, client: PodResourcesClient) -> None:
        self._client = client
        self._last_error: str | None = None
        self.failures = 0

    async def owners(self) -> Mapping[str, str]:
        try:
            pods = await self._client.list()
        except Exception as exc:  # optional enrichment: nothing here may stop publishing
            self.failures += 1
            error = str(exc) if isinstance(exc, PodResourcesError) else repr(exc)
            if error != self._last_error:  # say it once, not every round
                log.warning("pod attribution unavailable; publishing without pod", error=error)
                self._last_error = error
            return {}
        if self._last_error is not None:
            log.info("pod attribution available again")
            self._last_error = None
        return device_owners(pods)

    async def close(self) -> None:
        await self._client.close()
