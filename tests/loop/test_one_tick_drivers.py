"""One tick for every driver: the shipped incident fed through the live controller over the
simulated cluster (``ebbtide run --cluster sim:``, without Kafka: events handed to
:meth:`Controller.observe` as the consumer would, ticks on a fake clock) and through
``ebbtide replay`` gives the same decisions *and* the same outcomes, acting and in dry-run.

Before the one tick, replay applied decisions to an ungated simulated cluster and the live
loop alone refused a scale-up whose GPUs were not freed; the outcomes could differ."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from controller.loop.gate import SafetyGate
from controller.loop.port import ActionResult
from controller.offline.accounting.outputs import DECISIONS_FILE, decision_line
from controller.offline.replay.replayer import ReplaySettings, replay
from controller.process.app import Controller
from controller.process.settings import load_settings
from controller.simcluster import SimCluster, load_scenario
from controller.simcluster.sim_runtime import SimRuntime
from policies.decisions import Decision
from policies.loader import load_policy_text
from policies.model import Policy
from streams.consumer import Batch
from streams.events import Event, Rejection
from streams.recording import read_events

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "examples" / "incident.jsonl.gz"
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
POLICY = ROOT / "policies" / "library" / "balanced.yaml"
DT = 1.0


def _policy(path: Path, *, dry_run: bool) -> Policy:
    text = path.read_text()
    if dry_run:
        text = text.replace("dryRun: false", "dryRun: true", 1)
    policy = load_policy_text(text, str(path))
    assert policy.spec.dry_run is dry_run
    return policy


def _events() -> list[Event]:
    return [e for _, e in read_events(RECORDING) if not isinstance(e, Rejection)]


async def _live(
    policy: Policy,
    policy_file: Path,
    events: list[Event],
    watch: Callable[[Controller], None] = lambda _: None,
) -> list[dict[str, object]]:
    """The live controller on the simulated cluster, ticked every ``DT`` of event time as the
    replay ticks, each tick's events handed over before it (what the consumer does); ``watch``
    sees the controller first."""
    t0 = math.ceil(events[0].time / DT) * DT
    now = [t0]
    sim = SimCluster.from_scenario(load_scenario(SCENARIO), start=t0, policy=policy)
    settings = load_settings(policies=[policy_file], cluster=f"sim:{SCENARIO}")
    runtime = SimRuntime(sim, SafetyGate(policy, clock=lambda: sim.now))
    controller = Controller(settings, runtime, policy, clock=lambda: now[0])
    watch(controller)
    lines: list[dict[str, object]] = []
    pending: list[Event] = []
    next_tick = t0

    async def tick() -> None:
        nonlocal next_tick
        if pending:
            await controller.observe(Batch(events=list(pending), positions={}, fetched_at=0.0))
            pending.clear()
        now[0] = next_tick
        lines.extend(decision_line(r) for r in await controller.evaluate_once())
        next_tick += DT
        now[0] = next_tick  # events up to the next tick are on time

    for e in events:
        while e.time > next_tick:
            await tick()
        pending.append(e)
    await tick()
    return lines


def _replayed(policy: Policy, out: Path) -> list[dict[str, object]]:
    def make(start: float) -> SimCluster:
        return SimCluster.from_scenario(load_scenario(SCENARIO), start=start, policy=policy)

    replay(RECORDING, policy=policy, cluster=make, out_dir=out, settings=ReplaySettings(DT))
    return [json.loads(line) for line in (out / DECISIONS_FILE).read_text().splitlines()]


@pytest.mark.parametrize("dry_run", [False, True], ids=["acting", "dry-run"])
async def test_run_on_the_simulated_cluster_and_replay_decide_and_act_alike(
    tmp_path: Path, dry_run: bool
) -> None:
    policy = _policy(POLICY, dry_run=dry_run)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY.read_text())
    events = _events()
    live = await _live(policy, policy_file, events)
    replayed = _replayed(policy, tmp_path / "replay")
    assert replayed, "the incident decides nothing: the comparison would prove nothing"
    assert [json.loads(json.dumps(line, default=str)) for line in live] == replayed
    outcomes = {line["outcome"] for line in replayed}
    assert outcomes == ({"dry_run"} if dry_run else outcomes - {"dry_run"})


async def test_ingest_is_held_while_a_tick_carries_out_its_decisions(tmp_path: Path) -> None:
    """Issue 27: every API call of the live loop is made with ingest held (streams.hold), so
    the consumer does not hand over background events between a decision's round trips."""
    policy = _policy(POLICY, dry_run=False)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY.read_text())
    held: list[bool] = []

    def watch(controller: Controller) -> None:
        cluster = controller.runtime.cluster
        apply = cluster.apply

        async def watched(decisions: Sequence[Decision]) -> list[ActionResult]:
            if decisions:
                held.append(controller.ingest_hold.holding)
            return await apply(decisions)

        cluster.apply = watched  # type: ignore[method-assign]

    await _live(policy, policy_file, _events(), watch)
    assert held
    assert all(held)
