"""MIG layouts: what a ``nvidia.com/mig.config`` name gives each GPU, and which one to pick.

The NVIDIA MIG manager applies *named* mig-parted configurations (the ``mig-configs:`` map of
its config file, e.g. ``all-1g.10gb``, ``all-balanced``); the node label
``nvidia.com/mig.config`` names one. A name says nothing by itself about the slices it makes,
so the policy lists the named configs it may use with their instances per GPU
(``MigSpec.configs``); the ``all-<profile>`` family of mig-parted's default config file needs no
entry, since it is "as many ``<profile>`` instances as one GPU holds".

This module is the one place that turns a config name into per-GPU instances: the Kubernetes MIG
flow (the resources it waits for the device plugin to advertise), the simulator (the GPUs a
converted node gets) and the engine (which layout covers the pending MIG demand best) all use it.
Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from policies.snapshot import MIG_DISABLED

__all__ = [
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "MigLayout",
    "choose_layout",
    "expected_resources",
    "layout_of",
    "slices_per_gpu",
]

GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
#: Instances of a profile one GPU holds (A100/H100/H200 families; mig-parted's ``all-*``).
_SLICES: Final = {
    "1g.5gb": 7,
    "1g.5gb+me": 7,
    "2g.10gb": 3,
    "3g.20gb": 2,
    "4g.20gb": 1,
    "7g.40gb": 1,
    "1g.10gb": 7,
    "1g.10gb+me": 7,
    "1g.20gb": 4,
    "2g.20gb": 3,
    "3g.40gb": 2,
    "4g.40gb": 1,
    "7g.80gb": 1,
    "1g.12gb": 7,
    "1g.24gb": 4,
    "2g.24gb": 3,
    "3g.48gb": 2,
    "4g.48gb": 1,
    "7g.96gb": 1,
    "1g.18gb": 7,
    "1g.35gb": 4,
    "2g.35gb": 3,
    "3g.71gb": 2,
    "4g.71gb": 1,
    "7g.141gb": 1,
}
_SLICES_BY_SIZE: Final = {"1g": 7, "2g": 3, "3g": 2, "4g": 1, "7g": 1}
_PROFILE_RE: Final = re.compile(r"^[1-9]g\.[0-9]+gb(\+me)?$")


def slices_per_gpu(profile: str) -> int:
    """Instances of ``profile`` (``1g.10gb``) one GPU holds when it holds nothing else."""
    if profile in _SLICES:
        return _SLICES[profile]
    return _SLICES_BY_SIZE.get(profile.split(".", 1)[0], 1)


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A named MIG config and the instances it makes on each GPU (empty: MIG disabled)."""

    name: str
    per_gpu: Mapping[str, int]

    @property
    def disabled(self) -> bool:
        return not self.per_gpu


def layout_of(name: str, configs: Mapping[str, Mapping[str, int]] | None = None) -> MigLayout:
    """The layout ``name`` stands for: a named config of ``configs``, ``all-disabled``, or
    ``all-<profile>``. ``ValueError`` for any other name (the MIG manager would fail it too)."""
    if configs and name in configs:
        return MigLayout(name, dict(configs[name]))
    if name == MIG_DISABLED:
        return MigLayout(name, {})
    profile = name.removeprefix("all-")
    if profile != name and _PROFILE_RE.match(profile):
        return MigLayout(name, {profile: slices_per_gpu(profile)})
    raise ValueError(
        f"unknown MIG config {name!r}: neither all-<profile> (e.g. all-1g.10gb) "
        "nor one of the policy's mig.configs"
    )


def expected_resources(layout: MigLayout, gpus: int) -> dict[str, int]:
    """What the device plugin advertises on a node of ``gpus`` GPUs under ``layout``
    (mixed strategy): ``nvidia.com/mig-<profile>`` counts, or ``nvidia.com/gpu`` when disabled."""
    if layout.disabled:
        return {GPU_RESOURCE: gpus}
    return {f"{MIG_RESOURCE_PREFIX}{p}": n * gpus for p, n in sorted(layout.per_gpu.items())}


def _compute_slices(profile: str) -> int:
    """The ``N`` of ``Ng.*``: the share of a GPU's compute an instance gets (in sevenths)."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


def choose_layout(
    candidates: Sequence[MigLayout], demand: Mapping[str, int], gpus: int
) -> MigLayout:
    """The candidate whose instances on ``gpus`` GPUs cover most of the pending MIG ``demand``
    (instances by profile), weighing each covered instance by its compute slices, so seven
    ``1g`` pods do not outweigh one ``7g`` pod. Ties, and no demand at all, go to the earlier
    candidate: the policy lists them in order of preference."""
    if not candidates:
        raise ValueError("choose_layout needs at least one candidate")

    def covered(layout: MigLayout) -> int:
        return sum(
            min(want, layout.per_gpu.get(p, 0) * gpus) * _compute_slices(p)
            for p, want in demand.items()
        )

    best = candidates[0]
    best_score = covered(best)
    for layout in candidates[1:]:
        score = covered(layout)
        if score > best_score:
            best, best_score = layout, score
    return best
