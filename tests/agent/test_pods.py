"""Pod attribution: the pod-resources wire codec, and a real gRPC fake kubelet on a unix socket."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.fake_kubelet import pod, serve_kubelet
from controller.agent.pods import (
    ContainerDevices,
    ContainerResources,
    PodAttribution,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    decode_response,
    device_owners,
    encode_response,
)

# A ListPodResourcesResponse serialized by the real protobuf runtime (6.33) from kubelet's
# v1 api.proto, with fields the agent does not read: packed cpu_ids, memory, device topology.
GOLDEN = bytes.fromhex(
    "0a590a09747261696e65722d3012026d6c1a480a046d61696e122a0a0e6e76696469612e636f6d2f677075"
    "12084750552d3030303012084750552d333333331a040a0208011a0402038201220e0a066d656d6f7279"
    "1080808080200a3e0a08636861742d376639120470726f641a2c0a0673657276657212220a166e766964"
    "69612e636f6d2f6d69672d31672e3130676212084d49472d61616161"
)
PODS = [
    PodResources(
        "trainer-0",
        "ml",
        (
            ContainerResources(
                "main", (ContainerDevices("nvidia.com/gpu", ("GPU-0000", "GPU-3333")),)
            ),
        ),
    ),
    PodResources(
        "chat-7f9",
        "prod",
        (
            ContainerResources(
                "server", (ContainerDevices("nvidia.com/mig-1g.10gb", ("MIG-aaaa",)),)
            ),
        ),
    ),
]


def test_decodes_what_protobuf_encodes() -> None:
    """The hand-written decoder reads real protobuf output and skips the fields it ignores."""
    assert decode_response(GOLDEN) == PODS


def test_encode_round_trips() -> None:
    """encode_response is decode_response's inverse (what the fake kubelet relies on)."""
    assert decode_response(encode_response(PODS)) == PODS


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(GOLDEN[:-3], id="truncated-string"),
        pytest.param(b"\x0a\xff", id="truncated-varint"),
        pytest.param(b"\x0b", id="group-wire-type"),
        pytest.param(b"\x09\x00\x00", id="truncated-fixed64"),
    ],
)
def test_malformed_input_is_an_error(raw: bytes) -> None:
    """Broken bytes raise PodResourcesError instead of returning a partial answer."""
    with pytest.raises(PodResourcesError):
        decode_response(raw)


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            PODS,
            {"GPU-0000": "ml/trainer-0", "GPU-3333": "ml/trainer-0", "MIG-aaaa": "prod/chat-7f9"},
            id="gpus-and-mig",
        ),
        pytest.param(
            [pod("a", "p", "GPU-1::0"), pod("b", "q", "GPU-1::1")], {}, id="shared-by-two-pods"
        ),
        pytest.param(
            [pod("a", "p", "GPU-1::0", "GPU-1::3")], {"GPU-1": "a/p"}, id="replicas-of-one-pod"
        ),
        pytest.param([pod("", "p", "GPU-1")], {}, id="pod-without-namespace"),
    ],
)
def test_device_owners(pods: list[PodResources], expected: dict[str, str]) -> None:
    """Device → pod, with time-slicing replicas folded and shared devices left out."""
    before = list(pods)
    assert device_owners(pods) == expected
    assert pods == before


async def test_lists_pods_from_a_grpc_kubelet(socket_path: Path) -> None:
    """The client calls List over the unix socket and maps devices to pods."""
    server = await serve_kubelet(socket_path, lambda: encode_response(PODS))
    attribution = PodAttribution(PodResourcesClient(str(socket_path)))
    try:
        owners = await attribution.owners()
    finally:
        await attribution.close()
        await server.stop(None)
    assert owners == {
        "GPU-0000": "ml/trainer-0",
        "GPU-3333": "ml/trainer-0",
        "MIG-aaaa": "prod/chat-7f9",
    }
    assert attribution.failures == 0


async def test_kubelet_errors_degrade_to_no_pods(socket_path: Path) -> None:
    """UNAVAILABLE from the kubelet, then garbage, give an empty mapping; recovery is seen."""
    answers: list[Callable[[], bytes]] = [
        lambda: (_ for _ in ()).throw(PodResourcesError("down")),
        lambda: b"\x0b",
        lambda: encode_response([pod("a", "p", "GPU-1")]),
    ]
    server = await serve_kubelet(socket_path, lambda: answers.pop(0)())
    attribution = PodAttribution(PodResourcesClient(str(socket_path)))
    try:
        assert await attribution.owners() == {}
        assert await attribution.owners() == {}
        assert await attribution.owners() == {"GPU-1": "a/p"}
    finally:
        await attribution.close()
        await server.stop(None)
    assert attribution.failures == 2


async def test_missing_socket_degrades_to_no_pods(tmp_path: Path) -> None:
    """No kubelet socket (attribution not mounted) is an empty mapping, not a crash."""
    attribution = PodAttribution(PodResourcesClient(str(tmp_path / "absent.sock")))
    assert await attribution.owners() == {}
    assert await attribution.owners() == {}
    await attribution.close()
    assert attribution.failures == 2
