"""A fake NVIDIA MIG manager that reacts to node labels in a ``KubeAPIServer``.

The real mig-manager (a DaemonSet from the GPU operator) watches its node's label
``nvidia.com/mig.config``; when it changes it reports ``nvidia.com/mig.config.state=pending``,
repartitions the GPUs and reports ``success`` (the device plugin then advertises the new
``nvidia.com/mig-<profile>`` resources) or ``failed``. It does not drain the node.

This fake does the same through the server's store, so its writes produce watch events but do
not appear in the request log. Tests script each node's outcome: ``success`` (the default),
``failed``, or ``never`` (stays ``pending`` forever), with a per-node or default delay.

On success the node's status is written first and the ``success`` label second, so a controller
that sees ``success`` also sees the new capacity — unless the script says ``advertise``: then,
as with the real manager (which lets the device plugin back only after applying the layout),
``success`` comes first and the resources that many seconds later (``None``: never). A script's
``reboot`` spends that long in ``rebooting`` after ``pending``, as the real manager does when a
GPU reset fails and it reboots the node. Resources come from a profile table, per GPU::

    {"all-1g.10gb": {"nvidia.com/mig-1g.10gb": 7}, "all-disabled": {}}

An empty profile means MIG disabled: the node advertises ``nvidia.com/gpu`` again. Every
``nvidia.com/mig-*`` and ``nvidia.com/gpu`` resource not in the profile is removed. An unknown
profile name fails, as it does for the real manager. The GPU count is the node's
``nvidia.com/gpu.count`` label (read as :func:`policies.miglayout.cards_of` reads it), else the
``nvidia.com/gpu`` capacity first seen, else 1.

The profile table is written as the ``mixed`` strategy advertises it. With ``strategy="single"``
the fake plays the device plugin and GPU feature discovery of a cluster installed with
``mig.strategy=single`` (NVIDIA/k8s-device-plugin ``internal/rm`` and ``internal/lm/
mig-strategy.go``): the instances of a one-profile layout are advertised as ``nvidia.com/gpu``
(8 GPUs at ``all-1g.10gb``: ``nvidia.com/gpu: 56``), and GFD relabels the node,
``nvidia.com/gpu.product`` ``<card>-MIG-<profile>`` and ``nvidia.com/gpu.count`` the number of
instances; back at whole cards, the card's product and count. A layout of several profiles makes
the plugin refuse to start (no GPU resource at all) and GFD label the product
``<card>-MIG-INVALID`` with count 0, while the manager itself reports ``success``. The nodes'
``nvidia.com/mig.strategy`` label is the test's to set, as GFD would from the same setting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from policies.miglayout import (
    COUNT_LABEL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    MigStrategy,
    cards_of,
    mig_product,
)

from .kubeapi import KubeAPIServer
from .kubeapi_objects import MERGE_PATCH, ApiError, Obj
from .kubeapi_store import Watcher, WatchEvent

__all__ = ["A100_80GB_PROFILES", "CONFIG_LABEL", "STATE_LABEL", "MigManager", "Outcome"]

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
Outcome = Literal["success", "failed", "never"]

A100_80GB_PROFILES: Mapping[str, Mapping[str, int]] = {
    "all-disabled": {},
    "all-1g.10gb": {"nvidia.com/mig-1g.10gb": 7},
    "all-1g.20gb": {"nvidia.com/mig-1g.20gb": 4},
    "all-2g.20gb": {"nvidia.com/mig-2g.20gb": 3},
    "all-3g.40gb": {"nvidia.com/mig-3g.40gb": 2},
    "all-7g.80gb": {"nvidia.com/mig-7g.80gb": 1},
    "all-balanced": {
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 1,
    },
}
"""mig-parted's default A100-80GB / H100-80GB layouts, resources per GPU."""


@dataclass(frozen=True)
class _Script:
    outcome: Outcome
    delay: float | None
    then: Outcome | None = None
    reboot: float = 0.0
    advertise: float | None = 0.0


class MigManager:
    """Watches nodes in ``server`` and plays the MIG manager's part for each."""

    def __init__(
        self,
        server: KubeAPIServer,
        *,
        profiles: Mapping[str, Mapping[str, int]],
        delay: float = 0.1,
        strategy: MigStrategy = "mixed",
    ) -> None:
        self._server = server
        self._profiles = profiles
        self._strategy = strategy
        self._delay = delay
        self._scripts: dict[str, _Script] = {}
        self._gpu_counts: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._watcher: Watcher | None = None
        self.applied: list[tuple[str, str, Outcome]] = []
        """(node, config, outcome) for every reconfiguration that finished or was left pending."""

    def script(
        self,
        node: str,
        outcome: Outcome,
        *,
        delay: float | None = None,
        then: Outcome | None = None,
        reboot: float = 0.0,
        advertise: float | None = 0.0,
    ) -> None:
        """Decide how the next reconfigurations of ``node`` end: all as ``outcome``, or with
        ``then``, the next one as ``outcome`` and those after it as ``then``; ``reboot`` and
        ``advertise`` (seconds) apply to every one of them."""
        self._scripts[node] = _Script(outcome, delay, then, reboot, advertise)

    async def start(self) -> None:
        store = self._server.store
        nodes = store.resolve("nodes")
        self._watcher = store.watch(nodes, None, None)  # replays existing nodes as ADDED
        self._loop_task = asyncio.create_task(
            self._run(self._watcher.queue), name="fake-mig-manager"
        )

    async def close(self) -> None:
        if self._watcher is not None:
            self._server.store.unwatch(self._watcher)
        tasks = [*self._tasks.values(), *([self._loop_task] if self._loop_task else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self, queue: asyncio.Queue[WatchEvent | None]) -> None:
        while (event := await queue.get()) is not None:
            node = event.obj
            name = node["metadata"]["name"]
            self._remember_gpus(node)
            if event.type == "DELETED":
                self._cancel(name)
                continue
            labels = node["metadata"].get("labels") or {}
            config = labels.get(CONFIG_LABEL)
            before = ((event.old or {}).get("metadata", {}).get("labels") or {}).get(CONFIG_LABEL)
            is_new = event.type == "ADDED" and labels.get(STATE_LABEL) != "success"
            if config is not None and (config != before or is_new):
                self._cancel(name)
                self._tasks[name] = asyncio.create_task(
                    self._reconfigure(name, config), name=f"fake-mig-manager:{name}"
                )

    def _cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    def _remember_gpus(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        capacity = (node.get("status") or {}).get("capacity") or {}
        labels = node["metadata"].get("labels") or {}
        if cards := cards_of(labels):
            self._gpu_counts[name] = cards
        elif (
            name not in self._gpu_counts and COUNT_LABEL not in labels and GPU_RESOURCE in capacity
        ):
            self._gpu_counts[name] = int(capacity[GPU_RESOURCE])

    async def _reconfigure(self, name: str, config: str) -> None:
        script = self._scripts.get(name, _Script("success", None))
        try:
            await self._label(name, "pending")
            if script.then is not None:  # this reconfiguration is under way: the next one is
                self._scripts[name] = _Script(
                    script.then, script.delay, None, script.reboot, script.advertise
                )
            if script.outcome == "never":
                self.applied.append((name, config, "never"))
                return
            if script.reboot:
                await self._label(name, "rebooting")
                await asyncio.sleep(script.reboot)
            await asyncio.sleep(self._delay if script.delay is None else script.delay)
            profile = self._profiles.get(config)
            if script.outcome == "failed" or profile is None:
                await self._label(name, "failed")
                self.applied.append((name, config, "failed"))
                return
            if script.advertise == 0.0:
                await self._set_resources(name, profile)
            await self._label(name, "success")
            self.applied.append((name, config, "success"))
            if script.advertise:
                await asyncio.sleep(script.advertise)
                await self._set_resources(name, profile)
        except ApiError:  # the node went away meanwhile
            return

    async def _label(self, name: str, state: str) -> None:
        patch = {"metadata": {"labels": {STATE_LABEL: state}}}
        await self._server.patch("nodes", None, name, patch)

    def _advertised(self, gpus: int, profile: Mapping[str, int]) -> tuple[dict[str, int], str]:
        """The resources the device plugin advertises for ``profile`` on ``gpus`` GPUs, and
        the MIG profile GFD writes into the product label under ``single`` (see the module
        docstring; ``""``: whole cards, ``"INVALID"``: a layout the strategy cannot serve)."""
        if not profile:
            return {GPU_RESOURCE: gpus}, ""
        if self._strategy == "mixed":
            return {key: count * gpus for key, count in profile.items()}, ""
        if len(profile) != 1:
            return {}, "INVALID"
        ((key, count),) = profile.items()
        return {GPU_RESOURCE: count * gpus}, key.removeprefix(MIG_RESOURCE_PREFIX)

    async def _set_resources(self, name: str, profile: Mapping[str, int]) -> None:
        gpus = self._gpu_counts.get(name, 1)
        counts, product_profile = self._advertised(gpus, profile)
        wanted = {key: str(n) for key, n in counts.items()}
        node = self._server.store.get(self._server.store.resolve("nodes"), None, name)
        if self._strategy == "single":
            await self._relabel_as_gfd(node, sum(counts.values()), product_profile)
        status: Obj = {}
        for field in ("capacity", "allocatable"):
            current = (node.get("status") or {}).get(field) or {}
            patch: dict[str, str | None] = {
                key: None
                for key in current
                if (key.startswith("nvidia.com/mig-") or key == "nvidia.com/gpu")
                and key not in wanted
            }
            patch.update(wanted)
            status[field] = patch
        self._server.store.patch(
            self._server.store.resolve("nodes"),
            None,
            name,
            {"status": status},
            MERGE_PATCH,
            subresource="status",
        )

    async def _relabel_as_gfd(self, node: Obj, count: int, profile: str) -> None:
        """GFD under ``single``: ``nvidia.com/gpu.count`` counts what ``nvidia.com/gpu`` is now
        and the product names the MIG profile (``internal/lm/mig-strategy.go``)."""
        labels = node["metadata"].get("labels") or {}
        patch = {COUNT_LABEL: str(count)}
        if PRODUCT_LABEL in labels:
            patch[PRODUCT_LABEL] = mig_product(labels[PRODUCT_LABEL], profile or None)
        await self._server.patch(
            "nodes", None, node["metadata"]["name"], {"metadata": {"labels": patch}}
        )
