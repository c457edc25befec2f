"""End to end with a real model server: KServe's Python model server serves a tiny model whose
requests take 0.6 s; `ebbtide scrape` reads its real /metrics over HTTP and publishes histogram
deltas through the embedded broker; `ebbtide run --cluster sim:` consumes them and scales the
service up, its P99 (in KServe's 0.5 to 0.75 s bucket) being over the 300 ms objective."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deploy.test_compose import decisions, short_policy
from streams.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)


def predict(port: int) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models/tiny:predict",
        data=json.dumps({"instances": [[1, 2]]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert json.loads(resp.read()) == {"predictions": [3]}


def test_kserve_metrics_scraped_into_a_scale_up(tmp_path: Path) -> None:
    pytest.importorskip("kserve", reason="kserve (a dev dependency) is not installed")
    env = os.environ | {"EBBTIDE_LOG_FORMAT": "json", "EBBTIDE_EVALUATE_EVERY_S": "0.2"}
    model_port, metrics_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = {name: tmp_path / f"{name}.log" for name in ("kserve", "controller", "scrape")}

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with logs[name].open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        try:
            kserve = start("kserve", [sys.executable, str(HERE / "kserve_tiny.py"),
                                      str(model_port), "0.6"])  # fmt: skip
            controller = start("controller", [
                sys.executable, "-m", "controller", "run",
                f"--cluster=sim:{ROOT / 'examples' / 'scenario-small.yaml'}",
                "--policy", str(short_policy(tmp_path)), "--bootstrap", broker.bootstrap,
                "--metrics-address", f"127.0.0.1:{metrics_port}", "--identity", "kserve-e2e",
            ])  # fmt: skip
            wait_http(f"http://127.0.0.1:{model_port}/v2/health/ready", kserve, logs["kserve"])
            wait_http(f"http://127.0.0.1:{metrics_port}/readyz", controller, logs["controller"])
            start("scrape", [
                sys.executable, "-m", "controller", "scrape", "--bootstrap", broker.bootstrap,
                "--target", f"kserve:serving/chat=http://127.0.0.1:{model_port}/metrics",
                "--scrape-interval", "1s",
            ])  # fmt: skip
            deadline = time.monotonic() + 90
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                while time.monotonic() < deadline:
                    list(pool.map(lambda _: predict(model_port), range(8)))
                    ups = [d for d in decisions(logs["controller"])
                           if d.get("target") == "serving/chat" and d.get("action") == "scale"
                           and d.get("to", 0) > d.get("from", 0)]  # fmt: skip
                    if ups:
                        break
            assert ups, logs["controller"].read_text()[-3000:] + logs["scrape"].read_text()[-2000:]
            assert ups[0]["from"] == 4
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
