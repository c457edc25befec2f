"""Pool utilization across MIG conversions and reverts: a node's previous layout stops counting
(one meter, controller/offline/accounting/poolmeter.py, for replay and simulate)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_builders import T0, one_node_cluster, policy, write_recording

from controller.offline.accounting.poolmeter import PoolMeter
from controller.offline.models import telemetry
from controller.offline.replay.replayer import replay
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import Event, GpuUtilization, InferenceLatency

POOL = {"ebbtide.io/pool": "gpu"}


def _cluster(*, b_mig: str | None) -> Snapshot:
    """Nodes a and b, 8 GPUs each, one pool; b partitioned when ``b_mig`` names a layout."""
    builder = SnapshotBuilder().node("a", labels=POOL)
    return builder.node("b", labels=POOL, mig_config=b_mig).build()


def _whole(node: str, util: float) -> list[GpuUtilization]:
    return [GpuUtilization(ts=T0, node=node, gpu=g, util_pct=util) for g in range(8)]


def _instances(node: str, util: float) -> list[GpuUtilization]:
    return [
        GpuUtilization(
            ts=T0, node=node, gpu=g, util_pct=util, mig_profile="1g.10gb", mig_instance=i
        )
        for g in range(8)
        for i in range(7)
    ]


def _fed(meter: PoolMeter, readings: list[GpuUtilization]) -> None:
    for ev in readings:
        meter.report(ev)


@pytest.mark.parametrize("told_by", ["snapshot", "readings"])
def test_a_conversion_replaces_the_nodes_whole_gpus_with_its_instances(told_by: str) -> None:
    """b idles at 10 % as whole cards, is converted, and its 56 instances then read 95 % like
    a: the pool reads 95 % over 64 devices, whether the snapshot or the readings say so first."""
    meter = PoolMeter([("gpu", POOL)])
    meter.refresh(_cluster(b_mig=None))
    _fed(meter, _whole("a", 95.0) + _whole("b", 10.0))
    assert (meter.pool_util(0), meter.devices(0)) == (pytest.approx(52.5), 16)
    if told_by == "snapshot":
        meter.refresh(_cluster(b_mig="all-1g.10gb"))
        assert (meter.pool_util(0), meter.devices(0)) == (pytest.approx(95.0), 8)
    _fed(meter, _instances("b", 95.0) + _whole("a", 95.0))
    assert (meter.pool_util(0), meter.devices(0)) == (pytest.approx(95.0), 64)
    meter.refresh(_cluster(b_mig="all-1g.10gb"))
    assert (meter.pool_util(0), meter.devices(0)) == (pytest.approx(95.0), 64)


def test_a_revert_replaces_the_instances_with_whole_gpus() -> None:
    """Back from MIG to whole cards: the 56 instances go, the 8 cards count once each."""
    meter = PoolMeter([("gpu", POOL)])
    meter.refresh(_cluster(b_mig="all-1g.10gb"))
    _fed(meter, _whole("a", 95.0) + _instances("b", 0.0))
    meter.refresh(_cluster(b_mig=None))
    _fed(meter, _whole("b", 95.0))
    assert (meter.pool_util(0), meter.devices(0)) == (pytest.approx(95.0), 16)


def test_simulate_accounts_with_the_same_meter() -> None:
    """simulate has no copy of its own: its telemetry's meter is replay's."""
    assert telemetry.PoolMeter is PoolMeter


def test_replay_of_a_recorded_conversion_keeps_the_pool_utilization_right(
    tmp_path: Path,
) -> None:
    """Replay: node n0's GPUs read 10 % whole for a minute, then (converted where it was
    recorded) 95 % as 56 instances for two: the pool's mean over the run is 10 % for a third
    of it and 95 % for the rest, not dragged down by the whole cards' last readings."""
    events: list[Event] = []
    for s in range(180):
        ts = T0 + s
        events.append(
            InferenceLatency(ts=ts, service="chat", namespace="serving", samples_ms=[50.0] * 20)
        )
        if s < 60:
            events += [GpuUtilization(ts=ts, node="n0", gpu=g, util_pct=10.0) for g in range(8)]
        else:
            events += [
                GpuUtilization(
                    ts=ts, node="n0", gpu=g, util_pct=95.0, mig_profile="1g.10gb", mig_instance=i
                )
                for g in range(8)
                for i in range(7)
            ]
    path = write_recording(tmp_path / "r.jsonl", events)
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    mean = result.summary.to_dict()["pools"]["whole"]["mean_util_pct"]
    assert mean == pytest.approx((60 * 10.0 + 120 * 95.0) / 180, abs=1.0)
