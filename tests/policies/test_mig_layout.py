"""MIG layouts: config names to per-GPU instances, the layout that covers the pending MIG demand,
the policy's ``configs``/``profiles`` validation, and the engine converting to the chosen one."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from policy_fixtures import WHOLE, make_policy, policy_dict
from test_mig_and_budgets import idle_run

from policies.decisions import MigConvert
from policies.engine import Engine
from policies.loader import PolicyLoadError
from policies.miglayout import MigLayout, choose_layout, expected_resources, layout_of
from policies.snapshot import SnapshotBuilder

BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
CONFIGS = {"all-balanced": BALANCED}
SMALL = MigLayout("all-1g.10gb", {"1g.10gb": 7})
MIXED = MigLayout("all-balanced", BALANCED)
HALVES = MigLayout("all-3g.40gb", {"3g.40gb": 2})


@pytest.mark.parametrize(
    ("name", "want"),
    [
        pytest.param("all-1g.10gb", {"1g.10gb": 7}, id="all-profile"),
        pytest.param("all-3g.40gb", {"3g.40gb": 2}, id="all-bigger-profile"),
        pytest.param("all-1g.20gb", {"1g.20gb": 4}, id="1g-with-more-memory"),
        pytest.param("all-disabled", {}, id="disabled"),
        pytest.param("all-balanced", BALANCED, id="named-mixed"),
    ],
)
def test_layout_of_names(name: str, want: Mapping[str, int]) -> None:
    """Named configs come from the policy's configs; all-<profile> needs no entry."""
    assert dict(layout_of(name, CONFIGS).per_gpu) == want


@pytest.mark.parametrize("name", ["all-balanced", "custom", "all-", "all-1g"])
def test_layout_of_unknown_names_fail_clearly(name: str) -> None:
    """A name that is not all-<profile> nor a listed config is refused with its name."""
    with pytest.raises(ValueError, match=f"unknown MIG config '{name}'"):
        layout_of(name)


@pytest.mark.parametrize(
    ("layout", "gpus", "want"),
    [
        pytest.param(SMALL, 8, {"nvidia.com/mig-1g.10gb": 56}, id="single"),
        pytest.param(
            MIXED,
            8,
            {
                "nvidia.com/mig-1g.10gb": 16,
                "nvidia.com/mig-2g.20gb": 8,
                "nvidia.com/mig-3g.40gb": 8,
            },
            id="mixed",
        ),
        pytest.param(layout_of("all-disabled"), 4, {"nvidia.com/gpu": 4}, id="disabled"),
    ],
)
def test_expected_resources(layout: MigLayout, gpus: int, want: dict[str, int]) -> None:
    """What the device plugin (mixed strategy) advertises for the layout on ``gpus`` GPUs."""
    assert expected_resources(layout, gpus) == want


@pytest.mark.parametrize(
    ("candidates", "demand", "want"),
    [
        pytest.param([SMALL, MIXED], {}, "all-1g.10gb", id="no-demand-first-listed"),
        pytest.param([SMALL, MIXED], {"1g.10gb": 9}, "all-1g.10gb", id="small-demand-small"),
        pytest.param([SMALL, MIXED], {"3g.40gb": 1}, "all-balanced", id="3g-demand-mixed"),
        pytest.param(
            [SMALL, MIXED], {"1g.10gb": 2, "3g.40gb": 1}, "all-balanced", id="both-fit-mixed"
        ),
        pytest.param([SMALL, MIXED, HALVES], {"3g.40gb": 4}, "all-3g.40gb", id="most-3g-wins"),
        pytest.param([MIXED, SMALL], {"1g.10gb": 1}, "all-balanced", id="tie-first-listed"),
        pytest.param(
            [SMALL, HALVES], {"1g.10gb": 5, "3g.40gb": 2}, "all-3g.40gb", id="compute-weighted"
        ),
        pytest.param([SMALL, MIXED], {"7g.80gb": 3}, "all-1g.10gb", id="uncoverable-first"),
    ],
)
def test_choose_layout(candidates: list[MigLayout], demand: dict[str, int], want: str) -> None:
    """The layout covering the most demanded compute slices on one GPU wins; ties and no
    demand go to the policy's first choice. The inputs are not mutated."""
    before = (copy.deepcopy(candidates), dict(demand))
    assert choose_layout(candidates, demand, 1).name == want
    assert (candidates, demand) == before


def mig_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = policy_dict()["spec"]["mig"]
    return spec | overrides


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        pytest.param(
            {"profiles": {"A100-80GB": ["all-1g.10gb", "all-balanced"]}},
            "'all-balanced' is neither all-<profile> nor in configs",
            id="unlisted-named-config",
        ),
        pytest.param(
            {"configs": {"too-big": {"3g.40gb": 2, "2g.20gb": 1}}},
            "configs.too-big: uses 8 of a GPU's 7 compute slices",
            id="over-seven-slices",
        ),
        pytest.param(
            {"configs": {"odd": {"big": 1}}}, "String should match pattern", id="bad-profile"
        ),
        pytest.param(
            {"profiles": {"A100-80GB": "all-disabled"}},
            "neither all-<profile> nor in configs",
            id="disabled-is-no-target",
        ),
    ],
)
def test_policy_rejects_bad_configs(overrides: dict[str, Any], error: str) -> None:
    """Bad layouts are refused when the policy loads, saying where and why."""
    with pytest.raises(PolicyLoadError, match="mig") as exc:
        make_policy(mig=mig_spec(**overrides))
    assert error in str(exc.value)


@pytest.mark.parametrize(
    ("pending", "want"),
    [
        pytest.param({}, "all-1g.10gb", id="no-mig-demand"),
        pytest.param({"3g.40gb": 1}, "all-balanced", id="3g-demand"),
    ],
)
def test_engine_converts_to_the_layout_the_demand_needs(pending: dict[str, int], want: str) -> None:
    """With two configs listed for the model, the conversion takes the one pending MIG pods
    can use, and says how much MIG demand it saw."""
    policy = make_policy(
        mig=mig_spec(profiles={"A100-80GB": ["all-1g.10gb", "all-balanced"]}, configs=CONFIGS)
    )
    engine = Engine(policy)
    b = SnapshotBuilder()
    for i in range(2):
        b.node(f"w{i}", gpus=2, labels=WHOLE)
    if pending:
        b.pod("ml", "wants-3g", phase="Pending", mig=pending)
    got = idle_run(engine, b.build(), seconds=600)
    [first] = [d for _, d in got if isinstance(d, MigConvert)][:1]
    assert first.profile == want
    assert first.explanation.inputs["pending_mig_instances"] == sum(pending.values())
