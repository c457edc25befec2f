"""A fake kubelet: a real gRPC server answering ``v1.PodResourcesLister/List`` on a unix socket."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]

from controller.agent.pods import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesError,
)


def pod(namespace: str, name: str, *device_ids: str) -> PodResources:
    return PodResources(
        name,
        namespace,
        (ContainerResources("c", (ContainerDevices("nvidia.com/gpu", device_ids),)),),
    )


async def serve_kubelet(path: Path, answer: Callable[[], bytes]) -> Any:
    """A real gRPC server speaking v1.PodResourcesLister/List on a unix socket."""

    async def list_handler(request: bytes, context: Any) -> bytes:
        assert request == b""  # an empty ListPodResourcesRequest
        try:
            return answer()
        except PodResourcesError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
            raise

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                list_handler, request_deserializer=bytes, response_serializer=bytes
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server
