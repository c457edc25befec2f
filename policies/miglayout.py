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

**MIG strategies.** How the instances reach Kubernetes depends on the device plugin's and GPU
feature discovery's ``migStrategy`` (the GPU operator's ``mig.strategy``), which GFD writes on
every GPU node as ``nvidia.com/mig.strategy`` (NVIDIA/k8s-device-plugin ``internal/lm/
mig-strategy.go``):

* ``mixed``: each profile is its own resource, ``nvidia.com/mig-<profile>``; a node may mix
  profiles (``all-balanced``) and whole cards.
* ``single`` (the GPU operator's MIG guide installs with it): the instances are advertised as
  ``nvidia.com/gpu`` — 8 A100-80GB at ``all-1g.10gb`` advertise ``nvidia.com/gpu: 56`` — and
  GFD relabels the node: ``nvidia.com/gpu.product`` gets ``-MIG-<profile>`` appended and
  ``nvidia.com/gpu.count`` counts *instances*. Every GPU of the node must carry the same single
  profile; any other layout makes GFD label the product ``…-MIG-INVALID`` with count 0, so a
  layout with several profiles cannot be used on such a node (:func:`unservable`).

A node without the label is taken as ``mixed``: it is what Ebbtide assumed before it read the
label, and GFD writes the label whenever a strategy other than ``none`` is configured, so an
unlabelled node has no MIG instances to advertise either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from policies.snapshot import MIG_DISABLED

__all__ = [
    "CONFIG_LABEL",
    "COUNT_LABEL",
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "PRODUCT_LABEL",
    "STRATEGY_LABEL",
    "MigLayout",
    "MigStrategy",
    "cards_of",
    "choose_layout",
    "expected_resources",
    "gfd_labels",
    "layout_of",
    "mig_product",
    "product_mig_profile",
    "single_mig_profile",
    "single_profile",
    "slices_per_gpu",
    "strategy_of",
    "unservable",
]

GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
#: The MIG manager's layout label.
CONFIG_LABEL: Final = "nvidia.com/mig.config"
#: GPU feature discovery's labels (NVIDIA/k8s-device-plugin ``internal/lm``).
STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
COUNT_LABEL: Final = "nvidia.com/gpu.count"
#: What GFD appends to the product of a ``single``-strategy MIG node, before the profile.
_MIG_PRODUCT_INFIX: Final = "-MIG-"

MigStrategy = Literal["single", "mixed"]
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


def strategy_of(labels: Mapping[str, str]) -> MigStrategy:
    """The node's MIG strategy by GFD's ``nvidia.com/mig.strategy``; ``mixed`` without it."""
    return "single" if labels.get(STRATEGY_LABEL) == "single" else "mixed"


def single_profile(layout: MigLayout) -> str | None:
    """The one profile every GPU gets under ``layout``; ``None`` when disabled or mixed."""
    return next(iter(layout.per_gpu)) if len(layout.per_gpu) == 1 else None


def unservable(layout: MigLayout, strategy: MigStrategy) -> str | None:
    """Why the device plugin cannot advertise ``layout`` under ``strategy``, or ``None``: under
    ``single`` a layout of several profiles is ``…-MIG-INVALID`` with no instance to use."""
    if strategy == "single" and not layout.disabled and single_profile(layout) is None:
        profiles = "+".join(sorted(layout.per_gpu))
        return (
            f"MIG config {layout.name!r} mixes profiles ({profiles}): under "
            "mig.strategy=single the device plugin advertises one profile per node"
        )
    return None


def expected_resources(
    layout: MigLayout, gpus: int, *, strategy: MigStrategy = "mixed"
) -> dict[str, int]:
    """What the device plugin advertises on a node of ``gpus`` GPUs under ``layout``: under
    ``mixed`` ``nvidia.com/mig-<profile>`` counts, under ``single`` the instances as
    ``nvidia.com/gpu``; whole cards as ``nvidia.com/gpu`` when disabled. ``ValueError`` for a
    layout the strategy cannot advertise (:func:`unservable`)."""
    if (why := unservable(layout, strategy)) is not None:
        raise ValueError(why)
    if layout.disabled:
        return {GPU_RESOURCE: gpus}
    if strategy == "single":
        return {GPU_RESOURCE: sum(layout.per_gpu.values()) * gpus}
    return {f"{MIG_RESOURCE_PREFIX}{p}": n * gpus for p, n in sorted(layout.per_gpu.items())}


def mig_product(product: str, profile: str | None) -> str:
    """``nvidia.com/gpu.product`` as GFD writes it under ``single``: the card's product with
    ``-MIG-<profile>`` for a MIG node (``None``: whole cards), whatever ``product`` had before."""
    base = product.split(_MIG_PRODUCT_INFIX, 1)[0]
    return base if profile is None else f"{base}{_MIG_PRODUCT_INFIX}{profile}"


def gfd_labels(labels: Mapping[str, str], layout: MigLayout, cards: int) -> dict[str, str]:
    """The node's labels once GPU feature discovery has relabelled it at ``layout`` on ``cards``
    GPUs: under ``single`` the product names the profile and the count is the instances (the
    card's product and the cards at whole cards); under ``mixed`` those stay the card's. Only
    labels the node carries are rewritten; a layout ``single`` cannot serve is left alone (the
    flow and the simulator never apply one)."""
    out = dict(labels)
    if strategy_of(labels) != "single" or unservable(layout, "single") is not None:
        return out
    if PRODUCT_LABEL in out:
        out[PRODUCT_LABEL] = mig_product(out[PRODUCT_LABEL], single_profile(layout))
    if COUNT_LABEL in out:
        out[COUNT_LABEL] = str(sum(layout.per_gpu.values()) * cards if layout.per_gpu else cards)
    return out


def product_mig_profile(product: str | None) -> str | None:
    """The MIG profile GFD appends to the product under ``single`` (``…-MIG-1g.10gb``), else
    ``None`` (a whole card's product, ``…-MIG-INVALID``). Only a ``single``-strategy MIG node
    carries such a product, so a pod selecting one asks for that profile's instances."""
    head, infix, profile = (product or "").partition(_MIG_PRODUCT_INFIX)
    return profile if head and infix and _PROFILE_RE.match(profile) else None


def single_mig_profile(labels: Mapping[str, str]) -> str | None:
    """The profile of a ``single``-strategy MIG node, by its product label; ``None`` for any
    other node (whole cards, ``mixed``, ``…-MIG-INVALID``)."""
    if strategy_of(labels) != "single":
        return None
    return product_mig_profile(labels.get(PRODUCT_LABEL))


def cards_of(
    labels: Mapping[str, str], configs: Mapping[str, Mapping[str, int]] | None = None
) -> int:
    """Physical GPUs by GFD's labels (0: unknown). ``nvidia.com/gpu.count`` counts cards,
    except on a ``single``-strategy MIG node, where it counts instances (GFD's count is that of
    the resource, ``nvidia.com/gpu``): then it is divided by the instances per GPU of the
    product's profile, taken from the node's ``nvidia.com/mig.config`` layout when that layout
    gives it (a named config may hold fewer than a whole GPU's worth), else a full GPU's worth."""
    try:
        count = int(labels.get(COUNT_LABEL) or 0)
    except ValueError:
        return 0
    profile = single_mig_profile(labels)
    if profile is None or count <= 0:
        return max(0, count)
    per_gpu = slices_per_gpu(profile)
    try:
        layout = layout_of(labels.get(CONFIG_LABEL) or MIG_DISABLED, configs)
    except ValueError:
        layout = None
    if layout is not None and single_profile(layout) == profile:
        per_gpu = layout.per_gpu[profile]
    return math.ceil(count / max(1, per_gpu))


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
