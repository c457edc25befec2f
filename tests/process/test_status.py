"""`/status` and `ebbtide status`: a live controller over the simulated cluster breaches, scales,
and its status says so (state, percentile against objective, replicas, last decision, what
blocks it now); a follower answers too, from the decisions log, saying it follows."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from controller.cli.status_command import render_table, select, status
from controller.kube.migannotation import FLOW_ANNOTATION, FlowRecord
from controller.process.app import Controller, load_policy_files
from controller.process.settings import load_settings
from controller.process.status import StatusBoard, StatusSources
from controller.simcluster.sim_runtime import SimRuntime
from policies.engine import Engine
from policies.snapshot import Snapshot, SnapshotBuilder
from streams.consumer import Batch
from streams.events import InferenceLatency

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
POLICY = ROOT / "policies" / "library" / "balanced.yaml"


class Follower(SimRuntime):
    """The simulated cluster, as a replica that does not hold the lease sees it."""

    def is_leader(self) -> bool:
        return False


def _controller(now: list[float], runtime_class: type[SimRuntime] = SimRuntime) -> Controller:
    settings = load_settings(
        policies=[POLICY], cluster=f"sim:{SCENARIO}", http={"address": "127.0.0.1:0"}
    )
    policy = load_policy_files(settings)
    runtime = runtime_class.from_file(SCENARIO, policy, dry_run=settings.dry_run_for(policy))
    return Controller(settings, runtime, policy, clock=lambda: now[0])


def _latency(start: float, seconds: int, ms: float) -> Batch:
    """10 requests/s at ``ms``: what chat's 4 replicas serve at balanced's starting 2.5 a
    replica, so the request rate alone asks for nothing."""
    events = [
        InferenceLatency(ts=start + i / 10, service="chat", namespace="serving", latency_ms=ms)
        for i in range(seconds * 10)
    ]
    return Batch(events=events, positions={}, fetched_at=start + seconds)


async def _cli(port: int, *args: str) -> Result:
    """``ebbtide status`` in a thread: the server answers on this test's event loop."""
    url = f"http://127.0.0.1:{port}"
    return await asyncio.to_thread(CliRunner().invoke, status, ["--url", url, *args])


async def test_status_follows_a_breach_and_its_scale_up() -> None:
    """Before the breach: chat ok, breachAfter running while it is above its objective. After
    the scale-up: breaching, the decision as the last one with desired replicas, a cooldown
    blocking the next; the table and -o json/yaml say the same; one service or one pool can
    be asked for."""
    now = [time.time()]
    leader = _controller(now)
    await leader.http.start()
    try:
        start = now[0]
        await leader.observe(_latency(start - 60, 60, 40.0))  # a quiet minute: ok
        await leader.evaluate_once()
        await leader.observe(_latency(start, 10, 900.0))
        now[0] = start + 10
        await leader.evaluate_once()
        early = json.loads((await _cli(leader.http.port, "-o", "json", "serving/chat")).stdout)
        (chat,) = early["services"]
        assert chat["state"] == "ok"
        assert any(b.startswith("breachAfter running") for b in chat["blockedBy"]), chat
        assert chat["objectives"][0]["currentMs"] > 300

        scaled = []
        for step in range(1, 9):
            await leader.observe(_latency(start + 5 * step + 5, 5, 900.0))
            now[0] = start + 5 * step + 10
            scaled += [
                r for r in await leader.evaluate_once() if r.decision.target == "serving/chat"
            ]
        assert scaled, "the breach was not acted on"
        decision = scaled[0].decision
        result = await _cli(leader.http.port, "-o", "json")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["role"] == "leader"
        (chat,) = [s for s in data["services"] if s["service"] == "serving/chat"]
        assert chat["state"] == "breaching"
        last = chat["lastDecision"]
        assert (last["action"], last["id"]) == ("scale", decision.id)
        assert last["outcome"] == scaled[0].outcome.value
        assert chat["replicas"]["desired"] == last["to"]
        assert chat["replicas"]["current"] == last["to"]  # the simulator applied it
        assert (chat["replicas"]["min"], chat["replicas"]["max"]) == (2, 16)
        assert any(b.startswith("cooldown: ") for b in chat["blockedBy"]), chat["blockedBy"]
        assert {p["name"] for p in data["pools"]} == {"whole", "mig"}

        table = await _cli(leader.http.port)
        assert table.exit_code == 0, table.output
        (row,) = [ln for ln in table.stdout.splitlines() if ln.startswith("serving/chat ")]
        assert "breaching" in row
        assert f"scale {last['from']}→{last['to']} {last['outcome']}" in row
        assert "cooldown: " in row
        assert table.stdout.splitlines()[0].startswith(f"replica {data['replica']} (leader)")
        assert "POOL" in table.stdout

        pool = await _cli(leader.http.port, "-o", "yaml", "pool/whole")
        assert pool.exit_code == 0, pool.output
        assert "name: whole" in pool.stdout
        assert "serving/chat" not in pool.stdout
    finally:
        await leader.http.close()


async def test_a_follower_answers_from_the_decisions_log() -> None:
    """A follower's status says it follows and that this blocks it; the leader's decision,
    read from the decisions log, is its last decision for the service."""
    now = [time.time()]
    follower = _controller(now, Follower)
    await follower.http.start()
    try:
        record = {
            "id": "d-1", "ts": now[0] - 30, "action": "scale", "target": "serving/chat",
            "cause": "serving/chat", "rule": "slo-breach-scale-up", "reason": "P99 900ms",
            "from": 4, "to": 7, "kind": "Deployment", "role": "inference", "dry_run": False,
        }  # fmt: skip
        follower.journal._on_record(json.dumps(record | {"outcome": "intent"}).encode())
        follower.journal._on_record(json.dumps(record | {"outcome": "applied"}).encode())
        follower.journal._on_record(b"not json")  # the log reader reports it; status ignores it
        await follower.evaluate_once()
        result = await _cli(follower.http.port, "-o", "json", "serving/chat")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["role"] == "follower"
        assert any(b.startswith("not the leader") for b in data["blockedBy"])
        (chat,) = data["services"]
        assert chat["lastDecision"]["outcome"] == "applied"
        assert (chat["lastDecision"]["to"], chat["replicas"]["desired"]) == (7, 7)
    finally:
        await follower.http.close()


async def test_unknown_object_and_unreachable_controller() -> None:
    """Asking for a service that is not there, or a port nobody serves, is one clear line."""
    data = {"services": [{"service": "serving/chat"}], "pools": [{"name": "whole"}]}
    with pytest.raises(Exception, match="no 'serving/nope' in the status; known: serving/chat"):
        select(data, "serving/nope")
    result = await asyncio.to_thread(
        CliRunner().invoke, status, ["--url", "http://127.0.0.1:9", "--timeout", "2"]
    )
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:9/status" in result.output


class _Cluster:
    """The cluster port's read side over one snapshot (what the Kubernetes adapter's cache
    gives: nodes with their annotations)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.synced = True
        self._snapshot = snapshot

    def snapshot(self) -> Snapshot:
        return self._snapshot


def test_pools_show_mig_flows_with_their_phase() -> None:
    """A node carrying a MIG flow record is listed under its pool with direction and phase;
    an unreadable record is shown as such, not fatal."""
    policy = load_policy_files(load_settings(policies=[POLICY], cluster=f"sim:{SCENARIO}"))
    flow = FlowRecord(
        direction="convert", phase="draining", target="all-1g.10gb", previous=None,
        pool={"ebbtide.io/pool": "mig"}, previous_pool={"ebbtide.io/pool": "whole"},
        was_cordoned=False, started=100.0, deadline=700.0, profile="all-1g.10gb",
        rule="mig-convert", reason="idle",
    )  # fmt: skip
    b = SnapshotBuilder()
    b.node("w0", labels={"ebbtide.io/pool": "whole"}, annotations={FLOW_ANNOTATION: flow.to_json()})
    b.node("w1", labels={"ebbtide.io/pool": "whole"}, annotations={FLOW_ANNOTATION: "{oops"})
    b.node("w2", labels={"ebbtide.io/pool": "whole"})
    cluster = _Cluster(b.build())
    engine = Engine(policy)
    board = StatusBoard(
        StatusSources(
            engine=lambda: engine, cluster=lambda: cluster, is_leader=lambda: True,
            unrestored=lambda: None, dry_run=lambda: False, identity="r0", clock=lambda: 200.0,
        )
    )  # fmt: skip
    (whole,) = [p for p in board.status()["pools"] if p["name"] == "whole"]
    good, bad = whole["migFlows"]
    assert (good["node"], good["direction"], good["phase"]) == ("w0", "convert", "draining")
    assert good["deadline"] == 700.0
    assert bad["node"] == "w1"
    assert bad["error"].startswith("unreadable ebbtide.io/mig-flow: ")


async def test_a_paused_workload_is_not_acted_on_and_says_so(tmp_path: Path) -> None:
    """chat's Deployment annotated ebbtide.io/paused: "true": its breach is decided but refused
    as paused (nothing changes in the cluster), and its status shows the pause as what blocks
    it."""
    scenario = tmp_path / "paused.yaml"
    scenario.write_text(
        SCENARIO.read_text().replace(
            "      name: chat\n",
            '      name: chat\n      annotations: {ebbtide.io/paused: "true"}\n',
            1,
        )
    )
    now = [time.time()]
    settings = load_settings(
        policies=[POLICY], cluster=f"sim:{scenario}", http={"address": "127.0.0.1:0"}
    )
    policy = load_policy_files(settings)
    controller = Controller(
        settings,
        SimRuntime.from_file(scenario, policy, dry_run=settings.dry_run_for(policy)),
        policy,
        clock=lambda: now[0],
    )
    start = now[0]
    results = []
    for step in range(9):
        await controller.observe(_latency(start + 5 * step, 5, 900.0))
        now[0] = start + 5 * step + 5
        results += await controller.evaluate_once()
    chat = [r for r in results if r.decision.cause == "serving/chat"]
    assert chat, "the breach was not decided"
    assert {r.outcome.value for r in chat} == {"refused"}
    assert chat[0].detail == "paused: serving/chat carries ebbtide.io/paused=true"
    (replicas,) = [
        w.replicas
        for w in controller.runtime.cluster.snapshot().workloads
        if w.key == "serving/chat"
    ]
    assert replicas == 4
    (service,) = [
        s for s in controller.status.status()["services"] if s["service"] == "serving/chat"
    ]
    assert service["paused"] is True
    assert service["blockedBy"][0] == "paused: serving/chat carries ebbtide.io/paused=true"
    assert service["state"] == "breaching"


def test_the_table_lists_the_objectives_and_who_joined() -> None:
    """With ServiceObjectives watched, the table lists each with READY and why; narrowing to
    pools drops them, and `services` keeps them."""
    data = {
        "replica": "r0", "role": "leader", "at": "2026-12-04T10:00:00+00:00",
        "policy": {"name": "p", "digest": "d"}, "blockedBy": [], "budgets": [], "services": [],
        "objectives": [
            {"object": "team-a/chat", "accepted": False, "reason": "NameTaken",
             "message": "service 'chat' is already defined by the policy file"},
            {"object": "team-a/search", "accepted": True, "reason": "Accepted",
             "message": "service team-a/search is in the policy"},
        ],
        "pools": [],
    }  # fmt: skip
    lines = render_table(data).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("SERVICEOBJECTIVE"))
    assert lines[at].split() == ["SERVICEOBJECTIVE", "READY", "REASON", "MESSAGE"]
    assert lines[at + 1].split()[:3] == ["team-a/chat", "False", "NameTaken"]
    assert lines[at + 2].split()[:3] == ["team-a/search", "True", "Accepted"]
    assert "objectives" not in select(data, "pools")
    assert "objectives" in select(data, "services")
