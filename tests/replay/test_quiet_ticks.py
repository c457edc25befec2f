"""The replay's short ways through a tick (quiet ticks run in one loop, sample ticks without
``evaluate`` when the engine is idle: ``controller/offline/replay/replayer.py``) account exactly
what the full tick does. A :class:`TickHook` turns them off (every tick runs in full), so a
replay with a hook that changes nothing is the reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from msgspec.structs import replace
from replay_builders import POLICY, T0, chat_events, one_node_cluster, policy, write_recording

from controller.offline.accounting.outputs import DECISIONS_FILE, RunResult
from controller.offline.replay.inferred import scan_recording
from controller.offline.replay.replayer import Withheld, replay
from policies.model import Policy
from policies.snapshot import Snapshot
from streams.events import Event, InferenceLatency, Rejection


class PassThrough:
    """A hook that changes nothing: it only makes every tick a full one."""

    def filter(self, batch: list[Event | Rejection]) -> Sequence[Event | Rejection | Withheld]:
        return batch

    def tick(self, now: float, snapshot: Snapshot) -> Sequence[Event]:
        return []


def _policy(services: int) -> Policy:
    """The builders' policy with ``chat`` and ``services - 1`` copies of it (``chat-01``, …)."""
    text = POLICY
    chat = text[
        text.index("    chat:\n") : text.index("  training") if "  training" in text else None
    ]
    copies = "".join(chat.replace("    chat:", f"    chat-{i:02d}:", 1) for i in range(1, services))
    return policy(text.replace(chat, chat + copies))


def _run(
    tmp_path: Path, out: str, *, full: bool, services: int = 1, span: bool = False
) -> tuple[RunResult, bytes]:
    # Sparse: an event every 7 s, so most ticks are quiet; 2,000 ticks, so the timeline's
    # stride doubles (sample ticks change bucket widths) and a burst breaches and recovers.
    # Each copy of the service sees chat's requests.
    events: list[Event] = []
    for e in chat_events(2000, burst=(600, 700)):
        if round(e.time - T0) % 7 == 0:
            events.append(e)
            if isinstance(e, InferenceLatency):
                events += [replace(e, service=f"chat-{i:02d}") for i in range(1, services)]
    path = write_recording(tmp_path / "r.jsonl", events)
    scan = scan_recording(path) if span else None
    result = replay(
        path,
        policy=_policy(services),
        cluster=lambda start: one_node_cluster(start, of=_policy(services)),
        out_dir=tmp_path / out,
        hook=PassThrough() if full else None,
        span=None if scan is None or scan.first is None else (scan.first, scan.last),
    )
    return result, (tmp_path / out / DECISIONS_FILE).read_bytes()


@pytest.mark.parametrize(
    ("services", "span"),
    [(1, False), (20, False), (20, True)],
    ids=["one-service", "plot-in-shares", "span-known"],
)
def test_short_ticks_account_what_full_ticks_do(tmp_path: Path, services: int, span: bool) -> None:
    """With more services than the plot reads a tick (plot ticks within a bucket) and with
    the run's length known up front (its final bucket width from the start) too."""
    short, short_decisions = _run(tmp_path, "short", full=False, services=services, span=span)
    full, full_decisions = _run(tmp_path, "full", full=True, services=services, span=span)
    summary = short.summary.to_dict()
    assert summary["time"]["ticks"] > 1200  # past two halvings of a 600-point timeline
    assert summary["slo"]["serving/chat"]["breaches_total"] >= 1
    assert summary == full.summary.to_dict()
    assert short.timeline.times() == full.timeline.times()
    assert short.timeline.series() == full.timeline.series()
    assert short_decisions == full_decisions


@pytest.mark.parametrize("span", [False, True], ids=["buckets-merge", "span-known"])
def test_the_plot_has_every_service_in_every_bucket(tmp_path: Path, span: bool) -> None:
    """20 services, more than one tick's share of plot reads: each service's windowed
    percentile has a value in every bucket of the report (but the last, which the run may end
    before its share comes), however wide the buckets get. Regression: once a bucket was wider
    than one tick, service ``i`` was read only in the buckets ``b`` with ``b % 2 == i % 2``,
    so the last stretch of every line (the buckets not merged again) was every other bucket
    empty, which a line without connected gaps does not draw at all."""
    result, _ = _run(tmp_path, "out", full=False, services=20, span=span)
    tl = result.timeline
    assert tl.stride == 4  # 2,000 ticks in 600 buckets
    series = tl.series()
    for i in range(20):
        key = "serving/chat" if i == 0 else f"serving/chat-{i:02d}"
        line = series[f"p:{key}"]
        assert len(line) == len(tl.times()) > 300
        assert [b for b, v in enumerate(line[:-1]) if v is None] == [], key


def test_a_known_span_starts_the_buckets_as_wide_as_they_end(tmp_path: Path) -> None:
    """Told the recording's span, the replay's timeline has the buckets it has without
    (the same times, the same sums), from fewer percentile reads for the plot."""
    merged, _ = _run(tmp_path, "merged", full=False, services=20)
    known, _ = _run(tmp_path, "known", full=False, services=20, span=True)
    assert known.timeline.times() == merged.timeline.times()
    a, b = merged.timeline.series(), known.timeline.series()
    actions = [k for k in a if k.startswith("actions:")]
    assert actions
    assert [a[k] for k in actions] == [b[k] for k in actions]
    assert a["util:whole"] == pytest.approx(b["util:whole"])
    assert known.summary.to_dict()["slo"] == merged.summary.to_dict()["slo"]
