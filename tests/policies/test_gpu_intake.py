"""GPU readings the engine keeps: windows only for nodes the cluster snapshot lists and at most
MAX_DEVICES_PER_NODE per node; every other reading is dropped and counted by reason."""

from __future__ import annotations

from policy_fixtures import T0, WHOLE, make_policy, util
from prometheus_client import generate_latest

from controller.process.metrics import Metrics, StateSources
from policies.engine import MAX_DEVICES_PER_NODE, Engine
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.events import GpuUtilization
from support.engine_probes import gpu_utilization


def _snapshot(*nodes: str) -> Snapshot:
    b = SnapshotBuilder()
    for name in nodes:
        b.node(name, gpus=8, labels=WHOLE)
    return b.build()


def _engine(*nodes: str) -> Engine:
    engine = Engine(make_policy(mig=None))
    engine.evaluate(T0, _snapshot(*nodes))
    return engine


def test_readings_for_unknown_nodes_make_no_windows_and_are_counted() -> None:
    """Regression: 50,000 readings each naming a node the snapshot does not list used to make
    50,000 windows (+99 MiB on every replica, kept until the snapshot changed); now none, and
    each is counted as unknown_node."""
    engine = _engine("w0")
    assert engine.observe(util(T0, "w0", 0, 50.0))
    for i in range(50_000):
        assert not engine.observe(util(T0, f"ghost-{i}", 0, 50.0))
    assert list(gpu_utilization(engine, T0)) == ["w0/0"]
    assert engine.dropped == {"unknown_node": 50_000}
    assert engine.observed == 1


def test_devices_per_node_are_bounded() -> None:
    """Regression: a known node reporting 1,000 distinct GPUs (a bad exporter) keeps only
    MAX_DEVICES_PER_NODE windows; the readings past it are counted as device_limit, and the
    devices it already has keep being read."""
    engine = _engine("w0")
    for gpu in range(1_000):
        engine.observe(util(T0, "w0", gpu, 10.0))
    assert len(gpu_utilization(engine, T0)) == MAX_DEVICES_PER_NODE
    assert engine.dropped == {"device_limit": 1_000 - MAX_DEVICES_PER_NODE}
    assert engine.observe(util(T0 + 1, "w0", 0, 10.0))
    mig = GpuUtilization(
        ts=T0 + 1, node="w0", gpu=999, util_pct=1.0, mig_profile="1g.10gb", mig_instance=3
    )
    assert not engine.observe(mig)
    assert engine.dropped == {"device_limit": 1_000 - MAX_DEVICES_PER_NODE + 1}


def test_a_node_that_changes_its_mig_layout_again_and_again_is_still_read() -> None:
    """Regression: every layout names new MIG instances, and the cap counted every device ever
    seen, so a node cycled through layouts dropped its new instances' readings for good. Once
    the old layout's windows hold no reading, they make room."""
    engine = _engine("w0")
    window_s = 300.0  # the policy's utilization window (make_policy: no mig.convertAfter)

    def instance(ts: float, gpu: int, i: int, profile: str) -> GpuUtilization:
        return GpuUtilization(
            ts=ts, node="w0", gpu=gpu, util_pct=5.0, mig_profile=profile, mig_instance=i
        )

    for gpu in range(16):
        for i in range(8):
            engine.observe(instance(T0, gpu, i, "1g.10gb"))
    assert len(gpu_utilization(engine, T0)) == MAX_DEVICES_PER_NODE
    later = T0 + window_s + 30
    assert engine.observe(instance(later, 0, 9, "3g.40gb"))
    assert engine.observe(instance(later, 1, 9, "3g.40gb"))
    assert list(gpu_utilization(engine, later)) == ["w0/0/9", "w0/1/9"]
    assert engine.dropped == {}


def test_merged_partials_for_unknown_nodes_are_dropped_and_counted() -> None:
    """The decider's path (aggregated partials) drops unknown nodes the same way, counting the
    readings each partial summed, and ignores their idle marks."""
    engine = _engine("w0")
    slot = int(T0 // (300.0 / 30))
    readings: dict[tuple[str, int | str, int | None], tuple[float, int, float]] = {
        ("w0", 0, None): (100.0, 2, 60.0),
        ("ghost", 0, None): (150.0, 3, 50.0),
    }
    assert engine.put_utilization(slot, interval_s=10.0, readings=readings) == 1
    engine.merge_idle("ghost", "0", first=T0, last=T0, busy=None)
    assert list(gpu_utilization(engine, T0)) == ["w0/0"]
    assert engine.dropped == {"unknown_node": 3}


def test_readings_before_the_first_snapshot_are_kept_until_it_prunes_them() -> None:
    """A restart's rewind arrives before the cluster cache syncs: those readings are kept (no
    node is known yet); the first snapshot keeps the nodes it lists. A node that joins later is
    read from the first snapshot that lists it (docs/events.md)."""
    engine = Engine(make_policy(mig=None))
    assert engine.observe(util(T0, "w0", 0, 40.0))
    assert engine.observe(util(T0, "gone", 0, 40.0))
    engine.evaluate(T0 + 1, _snapshot("w0"))
    assert list(gpu_utilization(engine, T0 + 1)) == ["w0/0"]
    assert not engine.observe(util(T0 + 2, "late", 0, 40.0))  # watch lag: not listed yet
    engine.evaluate(T0 + 3, _snapshot("w0", "late"))
    assert engine.observe(util(T0 + 4, "late", 0, 40.0))
    assert sorted(gpu_utilization(engine, T0 + 4)) == ["late/0", "w0/0"]
    assert engine.dropped == {"unknown_node": 1}


def test_dropped_readings_are_scraped_by_reason() -> None:
    """What the engine dropped shows in ebbtide_gpu_readings_dropped_total{reason}."""
    engine = _engine("w0")
    engine.observe(util(T0, "ghost", 0, 50.0))
    sources = StateSources(
        engine=lambda: engine, consumer=lambda: None, is_leader=lambda: True, clock=lambda: T0
    )
    text = generate_latest(Metrics(sources).registry).decode()
    assert 'ebbtide_gpu_readings_dropped_total{reason="unknown_node"} 1.0' in text
