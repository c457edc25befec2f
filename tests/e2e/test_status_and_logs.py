"""`ebbtide run` as an SRE follows it: `ebbtide status` against the leader and a follower, and
the log's state-change events, over Kafka and the Kubernetes-API test server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.e2e import ControllerProcess, World, eventually, ready

pytestmark = pytest.mark.slow


def _events(controller: ControllerProcess, name: str) -> list[dict[str, Any]]:
    out = []
    for line in controller.log.read_text().splitlines():
        if line.startswith("{") and (record := json.loads(line)).get("event") == name:
            out.append(record)
    return out


async def test_status_on_leader_and_follower_and_the_events_behind_them(world: World) -> None:
    """A breach scales chat: the leader's status shows it breaching with that scale as its last
    decision; the follower's says it follows and shows the same decision, read from the
    decisions log. Each log has the ok→breaching transition once, and leadership events that
    alternate, gained first. (Which replica leads is the Lease's business, and with the tests'
    2s leases a loaded machine can let a renewal lapse for a moment: roles are read from one
    look at both replicas, never assumed.)"""
    replicas = [world.start(identity="a"), world.start(identity="b")]
    for replica in replicas:
        await ready(replica)
    before = world.replicas("serving", "chat")
    await eventually(
        lambda: world.replicas("serving", "chat") > before, 30, lambda: world.latency(900)
    )

    def chat(data: dict[str, Any]) -> dict[str, Any]:
        (service,) = data["services"]
        assert service["service"] == "serving/chat"
        return service

    seen: list[dict[str, Any]] = []

    def one_leads() -> bool:
        """Both replicas' status at one moment, one leading (the Lease's holder)."""
        seen[:] = [r.status() for r in replicas]
        return sorted(d["role"] for d in seen) == ["follower", "leader"]

    await eventually(one_leads, 20, lambda: None)
    lead, follow = seen if seen[0]["role"] == "leader" else seen[::-1]
    leader, follower = replicas if seen[0]["role"] == "leader" else replicas[::-1]
    assert any(b.startswith("not the leader") for b in follow["blockedBy"])
    assert not any(b.startswith("not the leader") for b in lead["blockedBy"])
    assert chat(lead)["state"] == "breaching"
    assert chat(follow)["state"] == "breaching"  # its engine is fed the same events
    decision = chat(lead)["lastDecision"]
    assert (decision["action"], decision["target"]) == ("scale", "serving/chat")
    assert chat(lead)["replicas"]["desired"] == decision["to"]

    def cache_caught_up() -> bool:  # the watch event of the scale reaches its cache
        current = chat(leader.status())["replicas"]["current"]
        return bool(current == world.replicas("serving", "chat"))

    await eventually(cache_caught_up, 10, lambda: None)

    def follower_saw_it() -> bool:
        last, theirs = (
            chat(follower.status())["lastDecision"],
            chat(leader.status())["lastDecision"],
        )
        return last is not None and theirs is not None and last["id"] == theirs["id"]

    await eventually(follower_saw_it, 20, lambda: None)
    shown = follower.status_cli("serving/chat")  # the CLI, as a user runs it
    last = chat(shown)["lastDecision"]
    assert (last["action"], last["target"]) == ("scale", "serving/chat")

    for replica in replicas:
        changes = [e["event"] for e in _events(replica, "leadership.gained")]
        changes += [e["event"] for e in _events(replica, "leadership.lost")]
        ordered = [
            json.loads(line)["event"]
            for line in replica.log.read_text().splitlines()
            if line.startswith("{") and '"leadership.' in line
        ]
        assert sorted(ordered) == sorted(changes)
        assert ordered == ["leadership.gained", "leadership.lost"] * (len(ordered) // 2) + (
            ["leadership.gained"] if len(ordered) % 2 else []
        ), ordered
        breaches = [e for e in _events(replica, "slo.state_changed") if e["to"] == "breaching"]
        assert [(e["service"], e["from"]) for e in breaches] == [("serving/chat", "ok")]
    assert any(_events(r, "leadership.gained") for r in replicas)
    for replica in replicas:
        assert replica.stop() == 0
