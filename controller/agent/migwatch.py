"""Let go of the GPUs while the NVIDIA MIG manager reconfigures this node.

Changing MIG mode needs a GPU reset, and a GPU reset fails while any process holds the device:
an initialised NVML library keeps ``/dev/nvidia*`` open. The MIG manager stops the GPU
operator's own clients first — it sets ``nvidia.com/mig.config.state=pending``, turns their
``nvidia.com/gpu.deploy.<component>`` labels to ``false`` and waits for their pods to go
(NVIDIA/mig-parted ``deployments/gpu-operator/reconfigure-mig.sh``) — but it knows only its own
components. Rather than piggy-back on one of those labels (which would tie the agent's
scheduling to another component's), the agent watches its own Node and calls
``nvmlShutdown`` while the state is ``pending`` or ``rebooting``, and ``nvmlInit`` again once it
is anything else (``success``, ``failed``, unset). The manager spends seconds stopping its own
components after ``pending``; the watch delivers the label within about a second, so the agent
is gone before the reset.

:class:`MigWatch` is a one-object :class:`~controller.kube.informer.Informer` (field selector
``metadata.name=<node>``): list+watch with its resume, 410 and backoff handling, no polling.
It needs ``get``/``list``/``watch`` on nodes (the chart grants them when
``agent.releaseDuringMig`` is on). Until its first list it reports nothing to release.
"""

from __future__ import annotations

import asyncio
from typing import Final

from kubernetes_asyncio.client import ApiClient

from controller.kube.informer import Change, Informer
from controller.kube.migannotation import STATE_LABEL, labels_of
from controller.kube.state import NODES

__all__ = ["RELEASE_STATES", "MigWatch"]

#: ``nvidia.com/mig.config.state`` values during which the agent holds no NVML handle.
RELEASE_STATES: Final = frozenset({"pending", "rebooting"})


class MigWatch:
    """Follows ``nvidia.com/mig.config.state`` of one node; :attr:`release` says whether NVML
    must be let go now, :meth:`changed` wakes on every change of it."""

    def __init__(self, api: ApiClient, node: str) -> None:
        self.node = node
        self._informer = Informer(
            api, NODES, field_selector=f"metadata.name={node}", on_change=self._on_change
        )
        self._changed = asyncio.Event()

    @property
    def state(self) -> str | None:
        """The node's MIG state as last seen (``None``: unset, or not listed yet)."""
        node = self._informer.get(self.node)
        return None if node is None else labels_of(node).get(STATE_LABEL)

    @property
    def release(self) -> bool:
        return self.state in RELEASE_STATES

    async def run(self) -> None:
        """List and watch the node until cancelled or :meth:`stop`."""
        await self._informer.run()

    def stop(self) -> None:
        self._informer.stop()

    async def changed(self) -> None:
        """Wait for the next change of the node (any change: the caller re-reads ``release``)."""
        await self._changed.wait()
        self._changed.clear()

    def _on_change(self, _change: Change) -> None:
        self._changed.set()
