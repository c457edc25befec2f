"""The replay's short ways through a tick (quiet ticks run in one loop, sample ticks without
``evaluate`` when the engine is idle: ``controller/offline/replay/replayer.py``) account exactly
what the full tick does. A :class:`TickHook` turns them off (every tick runs in full), so a
replay with a hook that changes nothing is the reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from replay_builders import T0, chat_events, one_node_cluster, policy, write_recording

from controller.offline.accounting.outputs import DECISIONS_FILE, RunResult
from controller.offline.replay.replayer import Withheld, replay
from policies.snapshot import Snapshot
from streams.events import Event, Rejection


class PassThrough:
    """A hook that changes nothing: it only makes every tick a full one."""

    def filter(self, batch: list[Event | Rejection]) -> Sequence[Event | Rejection | Withheld]:
        return batch

    def tick(self, now: float, snapshot: Snapshot) -> Sequence[Event]:
        return []


def _run(tmp_path: Path, out: str, *, full: bool) -> tuple[RunResult, bytes]:
    # Sparse: an event every 7 s, so most ticks are quiet; 2,000 ticks, so the timeline's
    # stride doubles (sample ticks change bucket widths) and a burst breaches and recovers.
    events = [e for e in chat_events(2000, burst=(600, 700)) if round(e.time - T0) % 7 == 0]
    path = write_recording(tmp_path / "r.jsonl", events)
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / out,
                    hook=PassThrough() if full else None)  # fmt: skip
    return result, (tmp_path / out / DECISIONS_FILE).read_bytes()


def test_short_ticks_account_what_full_ticks_do(tmp_path: Path) -> None:
    short, short_decisions = _run(tmp_path, "short", full=False)
    full, full_decisions = _run(tmp_path, "full", full=True)
    summary = short.summary.to_dict()
    assert summary["time"]["ticks"] > 1200  # past two halvings of a 600-point timeline
    assert summary["slo"]["serving/chat"]["breaches_total"] >= 1
    assert summary == full.summary.to_dict()
    assert short.timeline.times() == full.timeline.times()
    assert short.timeline.series() == full.timeline.series()
    assert short_decisions == full_decisions
