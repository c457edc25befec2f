"""MIG strategies in the pure core (NVIDIA/k8s-device-plugin ``internal/lm/mig-strategy.go``,
``internal/rm``): what the device plugin advertises for a layout under ``single`` and ``mixed``,
the layouts ``single`` cannot serve, physical GPUs from GFD's labels (its count is instances on a
``single`` MIG node), the product GFD writes, and the engine keeping to layouts the node's
strategy can serve."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from policy_fixtures import WHOLE, make_policy
from test_mig_and_budgets import idle_run
from test_mig_layout import CONFIGS, HALVES, MIXED, SMALL, mig_spec

from policies.decisions import MigConvert
from policies.engine import Engine
from policies.miglayout import (
    MigLayout,
    MigStrategy,
    cards_of,
    expected_resources,
    layout_of,
    mig_product,
    product_mig_profile,
    strategy_of,
    unservable,
)
from policies.snapshot import SnapshotBuilder

A100 = "NVIDIA-A100-SXM4-80GB"
DISABLED = layout_of("all-disabled")


@pytest.mark.parametrize(
    ("layout", "strategy", "want"),
    [
        pytest.param(SMALL, "mixed", {"nvidia.com/mig-1g.10gb": 56}, id="mixed-1g"),
        pytest.param(SMALL, "single", {"nvidia.com/gpu": 56}, id="single-1g"),
        pytest.param(HALVES, "single", {"nvidia.com/gpu": 16}, id="single-3g"),
        pytest.param(DISABLED, "mixed", {"nvidia.com/gpu": 8}, id="mixed-disabled"),
        pytest.param(DISABLED, "single", {"nvidia.com/gpu": 8}, id="single-disabled"),
        pytest.param(
            MIXED,
            "mixed",
            {
                "nvidia.com/mig-1g.10gb": 16,
                "nvidia.com/mig-2g.20gb": 8,
                "nvidia.com/mig-3g.40gb": 8,
            },
            id="mixed-balanced",
        ),
    ],
)
def test_expected_resources_by_strategy(
    layout: MigLayout, strategy: MigStrategy, want: Mapping[str, int]
) -> None:
    """8 A100-80GB: single advertises instances as nvidia.com/gpu, mixed as mig-<profile>."""
    assert expected_resources(layout, 8, strategy=strategy) == want


def test_single_cannot_serve_a_layout_of_several_profiles() -> None:
    """all-balanced under single is refused with the reason; mixed serves it."""
    assert unservable(MIXED, "mixed") is None
    assert unservable(SMALL, "single") is None
    assert unservable(DISABLED, "single") is None
    why = unservable(MIXED, "single") or ""
    assert "mig.strategy=single" in why
    assert "all-balanced" in why
    with pytest.raises(ValueError, match="mixes profiles"):
        expected_resources(MIXED, 8, strategy="single")


def labels(strategy: str | None, product: str, count: int, config: str) -> dict[str, str]:
    out = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/mig.config": config,
    }
    if strategy is not None:
        out["nvidia.com/mig.strategy"] = strategy
    return out


@pytest.mark.parametrize(
    ("node_labels", "configs", "cards"),
    [
        pytest.param(
            labels("single", f"{A100}-MIG-1g.10gb", 56, "all-1g.10gb"), None, 8, id="single-1g"
        ),
        pytest.param(
            labels("single", f"{A100}-MIG-3g.40gb", 16, "all-3g.40gb"), None, 8, id="single-3g"
        ),
        pytest.param(labels("single", A100, 8, "all-disabled"), None, 8, id="single-whole"),
        pytest.param(labels("mixed", A100, 8, "all-1g.10gb"), None, 8, id="mixed"),
        pytest.param(labels(None, A100, 4, "all-disabled"), None, 4, id="unlabelled"),
        pytest.param(
            labels("single", f"{A100}-MIG-1g.10gb", 24, "three-small"),
            {"three-small": {"1g.10gb": 3}},
            8,
            id="single-named-config-fewer-per-gpu",
        ),
        pytest.param(
            labels("single", f"{A100}-MIG-1g.10gb", 56, "all-disabled"),
            None,
            8,
            id="single-reverting-stale-labels",
        ),
        pytest.param(
            labels("single", f"{A100}-MIG-INVALID", 0, "all-balanced"), None, 0, id="invalid"
        ),
    ],
)
def test_cards_of(
    node_labels: Mapping[str, str], configs: Mapping[str, Mapping[str, int]] | None, cards: int
) -> None:
    """Physical GPUs from GFD's labels: its count is instances on a single-strategy MIG node."""
    assert cards_of(node_labels, configs) == cards


@pytest.mark.parametrize(
    ("product", "profile", "want"),
    [
        pytest.param(A100, "1g.10gb", f"{A100}-MIG-1g.10gb", id="to-mig"),
        pytest.param(f"{A100}-MIG-1g.10gb", None, A100, id="back-to-whole"),
        pytest.param(f"{A100}-MIG-1g.10gb", "3g.40gb", f"{A100}-MIG-3g.40gb", id="mig-to-mig"),
    ],
)
def test_mig_product(product: str, profile: str | None, want: str) -> None:
    """GFD's product under single: the card's, with -MIG-<profile> on a MIG node."""
    assert mig_product(product, profile) == want
    assert product_mig_profile(want) == profile


def test_strategy_of_defaults_to_mixed() -> None:
    """Only GFD's "single" means single; no label (what Ebbtide assumed before) is mixed."""
    assert [
        strategy_of(x)
        for x in ({"nvidia.com/mig.strategy": "single"}, {}, {"nvidia.com/mig.strategy": "mixed"})
    ] == ["single", "mixed", "mixed"]


@pytest.mark.parametrize(
    ("strategy", "want"), [("mixed", "all-balanced"), ("single", "all-3g.40gb")]
)
def test_engine_converts_a_single_node_only_to_a_one_profile_layout(
    strategy: str, want: str
) -> None:
    """3g demand with all-balanced listed first: mixed nodes take it, single nodes the next
    listed one-profile layout their device plugin can advertise."""
    policy = make_policy(
        mig=mig_spec(
            profiles={"A100-80GB": ["all-balanced", "all-3g.40gb", "all-1g.10gb"]}, configs=CONFIGS
        )
    )
    b = SnapshotBuilder()
    for i in range(2):
        b.node(f"w{i}", gpus=2, labels={**WHOLE, "nvidia.com/mig.strategy": strategy})
    b.pod("ml", "wants-3g", phase="Pending", mig={"3g.40gb": 1})
    got = idle_run(Engine(policy), b.build(), seconds=600)
    converts = [d for _, d in got if isinstance(d, MigConvert)]
    assert converts, "no conversion planned"
    assert {d.profile for d in converts} == {want}


def test_engine_converts_no_single_node_when_only_mixed_layouts_are_listed() -> None:
    """A single node with only all-balanced listed is never converted: the flow would fail it."""
    policy = make_policy(mig=mig_spec(profiles={"A100-80GB": "all-balanced"}, configs=CONFIGS))
    b = SnapshotBuilder()
    for i in range(2):
        b.node(f"w{i}", gpus=2, labels={**WHOLE, "nvidia.com/mig.strategy": "single"})
    got = idle_run(Engine(policy), b.build(), seconds=600)
    assert [d for _, d in got if isinstance(d, MigConvert)] == []
