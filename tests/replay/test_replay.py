"""Replay: breaches, attainment and decisions on constructed recordings; rejections; reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_builders import T0, chat_events, one_node_cluster, policy, write_recording

from controller.offline.accounting.outputs import DECISIONS_FILE, RunResult
from controller.offline.accounting.timeline import Timeline
from controller.offline.replay.replayer import ReplaySettings, replay
from controller.offline.replay.source import read_event_batches
from streams.events import GpuUtilization, Rejection
from streams.recording import read_events

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"
GARBAGE = [
    "not json at all",
    json.dumps({"value": {"type": "gpu.utilization"}}),  # no topic
    json.dumps({"topic": "t", "value": {"type": "inference.latency", "ts": 1, "service": "x"}}),
    json.dumps({"topic": "t", "value": "latency=3ms", "raw": True}),
    json.dumps({"topic": "t", "value": "!!", "raw": "base64"}),
    json.dumps(
        {
            "topic": "t",
            "ts_ms": 0,
            "value": {"type": "inference.latency", "ts": 1e9, "service": "x", "latency_ms": 1},
        }
    ),  # a timestamp far ahead of its Kafka time
    "",
]


def run(tmp_path: Path, seconds: int = 300, burst: tuple[int, int] = (100, 130)) -> RunResult:
    path = write_recording(tmp_path / "r.jsonl", chat_events(seconds, burst=burst))
    return replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")


def test_breach_is_found_where_the_windowed_p99_crosses_the_objective(tmp_path: Path) -> None:
    """A 30 s burst gives one breach from its start until it has left the 10 s window (within
    one 1 s slot), with the peak near the burst's latency."""
    slo = run(tmp_path).summary.to_dict()["slo"]["serving/chat"]
    assert slo["breaches_total"] == 1
    (breach,) = slo["breaches"]
    assert abs(breach["start"] - (T0 + 100)) <= 1.0
    assert abs(breach["end"] - (T0 + 130 + 10)) <= 1.0
    assert breach["peak_ms"] == pytest.approx(390.0, rel=0.02)


def test_attainment_is_the_fraction_of_evaluated_ticks_within_the_objective(
    tmp_path: Path,
) -> None:
    """Ticks 0..299 are all evaluated (20 requests each second, minSamples 10); ticks 100..138
    see a burst request in the window, so attainment is exactly 261/300."""
    summary = run(tmp_path).summary.to_dict()
    slo = summary["slo"]["serving/chat"]
    assert summary["time"]["ticks"] == 300
    assert slo["evaluated_seconds"] == 300.0
    assert slo["breach_seconds"] == 39.0
    assert slo["attainment"] == 261 / 300


def test_decisions_are_what_the_policy_says_and_applied_to_the_cluster(tmp_path: Path) -> None:
    """breachAfter 5s after the burst starts, chat scales 1 → ceil(390/100) = 4 once (cooldown
    60s covers the rest of the breach); the simulated cluster runs the new replicas."""
    result = run(tmp_path)
    lines = (tmp_path / "out" / DECISIONS_FILE).read_text().splitlines()
    decisions = [json.loads(line) for line in lines]
    assert [(d["ts"], d["action"], d["target"], d["from"], d["to"]) for d in decisions] == [
        (T0 + 105, "scale", "serving/chat", 1, 4)
    ]
    assert decisions[0]["rule"] == "slo-breach-scale-up"
    assert decisions[0]["applied"] is True
    assert decisions[0]["outcome"] == "applied"
    summary = result.summary.to_dict()
    assert summary["actions"]["by_type"] == {"evict": 0, "scale": 1, "mig_convert": 0,
                                             "mig_revert": 0}  # fmt: skip
    assert summary["actions"]["by_outcome"] == {"applied": 1}
    inference = result.timeline.series()["use:whole:inference"]
    assert inference[0] == 1.0
    assert inference[-1] == 4.0
    assert summary["pools"]["whole"]["mean_util_pct"] == 50.0


def test_garbage_lines_are_counted_as_rejected_by_code(tmp_path: Path) -> None:
    """Bad lines do not stop a replay: each is counted under the code read_events gives it."""
    path = write_recording(tmp_path / "r.jsonl", chat_events(20, burst=(0, 0)), extra=GARBAGE)
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    events = result.summary.to_dict()["events"]
    expected: dict[str, int] = {}
    for _, item in read_events(path):
        if isinstance(item, Rejection):
            expected[item.code] = expected.get(item.code, 0) + 1
    assert events["rejected_by_code"] == expected
    assert events["rejected"] == 6
    assert events["accepted"] == 20 * 9
    assert events["total"] == 20 * 9 + 6


@pytest.mark.parametrize("batch_bytes", [1, 300, 1 << 20], ids=["line", "few", "all"])
def test_batched_reader_agrees_with_read_events(tmp_path: Path, batch_bytes: int) -> None:
    """The fast reader yields exactly what read_events does, bad lines included, gzip too."""
    for path in (EXAMPLE, write_recording(tmp_path / "g.jsonl", [], extra=GARBAGE)):
        want = [item for _, item in read_events(path)]
        got = [item for b in read_event_batches(path, batch_bytes=batch_bytes) for item in b]
        assert got == want


def test_paced_replay_follows_the_wall_clock(tmp_path: Path) -> None:
    """--speed 100 plays 20 s of event time in about 0.2 s of wall time."""
    path = write_recording(tmp_path / "r.jsonl", chat_events(21, burst=(0, 0)))
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out",
                    settings=ReplaySettings(speed=100.0))  # fmt: skip
    assert 0.19 <= result.wall_s < 2.0


def test_timeline_downsamples_to_bounded_points() -> None:
    """10,000 ticks fit in at most `capacity` buckets; means, maxima and sums survive merging."""
    tl = Timeline(start=0.0, dt=1.0, capacity=8)
    for name, agg in (("m", "mean"), ("x", "max"), ("s", "sum")):
        tl.channel(name, agg)  # type: ignore[arg-type]
    for k in range(10_000):
        b = tl.bucket(k)
        tl.add("m", b, float(k))
        tl.add("x", b, float(k % 100))
        tl.add("s", b, 1.0)
    times, series = tl.times(), tl.series()
    assert 4 <= len(times) <= 8
    assert tl.stride == 2048
    assert series["s"][0] == 2048.0
    assert sum(v or 0 for v in series["s"]) == 10_000
    assert series["m"][0] == pytest.approx(sum(range(2048)) / 2048)
    assert series["x"][0] == 99.0


@pytest.mark.parametrize("ticks", [1, 7, 8, 9, 16, 17, 100, 1000])
def test_a_timeline_told_its_ticks_starts_at_the_stride_it_ends_with(ticks: int) -> None:
    """The stride the doubling ends with is the one a timeline told the run's length starts
    with: the same buckets, sums and means, none merged on the way."""
    merged, told = (
        Timeline(start=0.0, dt=1.0, capacity=8),
        Timeline(start=0.0, dt=1.0, capacity=8, ticks=ticks),
    )
    for tl in (merged, told):
        tl.channel("s", "sum")
        tl.channel("m", "mean")
        for k in range(ticks):
            b = tl.bucket(k)
            tl.add("s", b, 1.0)
            tl.add("m", b, float(k))
    assert told.stride == merged.stride == Timeline.stride_for(ticks, 8)
    assert told.times() == merged.times()
    assert told.series() == merged.series()


def test_readings_for_nodes_the_cluster_lacks_are_counted_in_the_summary(tmp_path: Path) -> None:
    """A recording whose GPU readings also name a node the replayed cluster does not have: the
    first (at T_0, before the first tick's snapshot) is kept until that snapshot prunes it; the
    19 after it are dropped and counted in the summary."""
    events = chat_events(20, burst=(0, 0))
    ghosts = [GpuUtilization(ts=T0 + s, node="ghost", gpu=0, util_pct=50.0) for s in range(20)]
    path = write_recording(tmp_path / "r.jsonl", sorted([*events, *ghosts], key=lambda e: e.time))
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    engine = result.summary.to_dict()["events"]["engine"]
    assert engine["gpu_dropped_unknown_node"] == 19
    assert "device_limit" not in str(engine)
