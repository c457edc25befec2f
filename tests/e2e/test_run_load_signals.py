"""`ebbtide run` consumes ``inference.load`` (the agent scraper's topic) and scales on a load
signal: chat's requests are fast, but its servers report a queue, and the queue-depth signal
scales it up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from support.e2e import HERE, World, eventually, ready

pytestmark = pytest.mark.slow


def signals_policy(tmp: Path) -> Path:
    """The end-to-end policy with chat scaling on its queue depth (2 waiting a replica)."""
    yaml = YAML()
    policy = yaml.load((HERE / "policy.yaml").read_text())
    policy["spec"]["services"]["chat"]["scale"]["signals"] = {"waiting": 2, "staleAfter": "10s"}
    path = tmp / "signals.yaml"
    with path.open("w") as out:
        yaml.dump(policy, out)
    return path


async def test_queue_depth_on_the_load_topic_scales_chat_up(world: World) -> None:
    controller = world.start(policy=signals_policy(world.tmp))
    await ready(controller)

    def feed() -> None:
        world.latency(40)  # well within the 300ms objective: no breach
        now = time.time()
        world.produce(
            "ebbtide.inference.load",
            [
                {
                    "type": "inference.load",
                    "version": 1,
                    "ts": now,
                    "service": "chat",
                    "namespace": "serving",
                    "pod": f"chat-{i}",
                    "waiting": 5.0,
                }
                for i in range(2)
            ],
            "serving/chat",
        )

    await eventually(lambda: world.replicas("serving", "chat") > 2, 30, feed)
    ups = [d for d in controller.decisions() if d["rule"] == "signal-scale-up"]
    assert ups
    assert ups[0]["target"] == "serving/chat"
    assert ups[0]["inputs"]["waiting_replicas"] == 5  # ceil(10 waiting / 2 a replica)...
    assert ups[0]["to"] == 4  # ...a step of at most maxStep (2)
    assert controller.stop() == 0
