"""Prometheus as an event source: PromQL results → events, against a real Prometheus server."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from streams.broker import free_port
from streams.events import GpuUtilization, InferenceLatency, Rejection
from streams.prometheus import (
    PromQuery,
    Translation,
    fetch_events,
    parse_query_option,
    parse_time,
    to_events,
)
from streams.recording import read_events
from support.prom_server import PrometheusServer

NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)


def series(labels: dict[str, str], *values: tuple[float, str]) -> dict[str, Any]:
    return {"metric": labels, "values": [[ts, v] for ts, v in values]}


def test_histogram_buckets_become_histogram_events() -> None:
    """Cumulative bucket series per service are differenced into one histogram per step; a
    step without traffic gives no event; seconds become milliseconds."""
    svc = {"service": "chat", "namespace": "prod"}
    result = [
        series(svc | {"le": "0.1"}, (10, "8"), (20, "0")),
        series(svc | {"le": "0.5"}, (10, "9.6"), (20, "0")),
        series(svc | {"le": "+Inf"}, (10, "10"), (20, "0")),
    ]
    out = Translation()
    to_events(PromQuery("latency", "x"), result, out)
    (event,) = out.events
    assert isinstance(event, InferenceLatency)
    assert event.histogram is not None
    assert (event.time, event.key) == (10.0, "prod/chat")
    assert event.histogram.bounds_ms == [100.0, 500.0]
    assert event.histogram.counts == [8, 2, 0]


MIG_LABELS = {
    "instance": "n2:9400",
    "gpu": "0",
    "GPU_I_PROFILE": "1g.10gb",
    "GPU_I_ID": "5",
    "namespace": "ml",
    "pod": "p",
}


@pytest.mark.parametrize(
    ("query", "result", "want", "skipped"),
    [
        pytest.param(
            PromQuery("latency", "q", unit_ms=1.0),
            [series({"service": "a"}, (1, "12.5"), (2, "NaN"))],
            [("default/a", 12.5)],
            {},
            id="quantile-in-ms-nan-skipped",
        ),
        pytest.param(
            PromQuery("latency", "q"),
            [series({"pod": "x"}, (1, "0.2"))],
            [],
            {"latency series without a service label": 1},
            id="no-service-label",
        ),
        pytest.param(
            PromQuery("gpu", "DCGM_FI_DEV_GPU_UTIL"),
            [series({"Hostname": "n1", "gpu": "3"}, (1, "42"), (2, "101"))],
            [("n1", 42.0), ("n1", 100.0)],
            {},
            id="dcgm-clamped",
        ),
        pytest.param(
            PromQuery("gpu", "g"),
            [
                series(
                    {
                        "instance": "n2:9400",
                        "gpu": "0",
                        "GPU_I_PROFILE": "1g.10gb",
                        "GPU_I_ID": "5",
                        "namespace": "ml",
                        "pod": "p",
                    },
                    (1, "7"),
                )
            ],
            [("n2", 7.0)],
            {},
            id="mig-instance-and-pod",
        ),
        pytest.param(
            PromQuery("gpu", "g"),
            [series({"gpu": "0"}, (1, "7"))],
            [],
            {"gpu series without node or gpu labels": 1},
            id="gpu-without-node",
        ),
    ],
)
def test_series_translation(
    query: PromQuery,
    result: list[dict[str, Any]],
    want: list[tuple[str, float]],
    skipped: dict[str, int],
) -> None:
    """Each kind of series maps to the right events, and unusable ones are counted."""
    out = Translation()
    to_events(query, result, out)
    got = [
        (e.key, e.latency_ms if isinstance(e, InferenceLatency) else e.util_pct) for e in out.events
    ]
    assert got == want
    assert dict(out.skipped) == skipped
    for event in out.events:
        if isinstance(event, GpuUtilization) and event.mig_profile:
            assert (event.mig_instance, event.pod) == (5, "ml/p")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("now", NOW),
        ("now-90m", datetime(2026, 12, 2, 14, 30, tzinfo=UTC)),
        ("1764691200", datetime(2025, 12, 2, 16, 0, tzinfo=UTC)),
        ("2026-12-01T00:00:00Z", datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_time_options(text: str, want: datetime) -> None:
    """Relative, epoch and RFC 3339 times are read; all come out aware and in UTC."""
    assert parse_time(text, now=NOW) == want


@pytest.mark.parametrize("text", ["yesterday", "now-5x", "now+1h"])
def test_bad_time_options(text: str) -> None:
    """An unreadable time says what forms are accepted."""
    with pytest.raises(ValueError, match="use now, now-30m, RFC 3339 or epoch seconds"):
        parse_time(text, now=NOW)


@pytest.mark.parametrize("text", ["latency", "cpu=x", "gpu="])
def test_bad_query_options(text: str) -> None:
    """A --query that is not KIND=PROMQL is refused with the accepted forms."""
    with pytest.raises(ValueError, match="expected latency=PROMQL"):
        parse_query_option(text)


@pytest.fixture
def exporter() -> Any:
    """A metrics endpoint with a latency histogram and DCGM-style GPU gauges."""
    registry = CollectorRegistry()
    latency = Histogram(
        "inference_latency_seconds",
        "request latency",
        ["service", "namespace"],
        buckets=[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0],
        registry=registry,
    )
    util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization", ["Hostname", "gpu"], registry=registry)
    util.labels("gpu-node-1", "0").set(37.5)
    util.labels("gpu-node-1", "1").set(80)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{port}", latency.labels("chat", "prod")
    server.shutdown()
    server.server_close()
    thread.join(5)


LATENCY_QUERY = "sum by (le, service, namespace) (increase(inference_latency_seconds_bucket[3s]))"


@pytest.mark.slow
async def test_record_from_a_real_prometheus(exporter: Any, tmp_path: Path) -> None:
    """Prometheus scrapes a live exporter; the recording made from its history has histogram
    events in the right buckets and the exact GPU utilization, and replays with no rejection."""
    target, chat = exporter
    with PrometheusServer(tmp_path, [target]) as prometheus:
        start = time.time()
        # 90% fast (20 ms), 10% slow (300 ms), until Prometheus holds enough scrapes of it.
        while prometheus.samples("inference_latency_seconds_count", "1m") < 6:
            assert time.time() - start < 40, "Prometheus did not scrape the exporter"
            for _ in range(20):
                for _ in range(9):
                    chat.observe(0.02)
                chat.observe(0.3)
                await asyncio.sleep(0.05)
        queries = [PromQuery("latency", LATENCY_QUERY), PromQuery("gpu", "DCGM_FI_DEV_GPU_UTIL")]
        window = {
            "start": datetime.fromtimestamp(start, UTC),
            "end": datetime.now(UTC),
        }
        result = await fetch_events(prometheus.url, queries, step="1s", **window)

        per_bucket: Counter[float] = Counter()
        gpu: dict[object, set[float]] = {}
        for event in result.events:
            if isinstance(event, InferenceLatency):
                assert event.key == "prod/chat"
                assert event.histogram is not None
                bounds = [*event.histogram.bounds_ms, math.inf]
                for bound, count in zip(bounds, event.histogram.counts, strict=True):
                    per_bucket[bound] += count
            else:
                assert isinstance(event, GpuUtilization)
                gpu.setdefault(event.gpu, set()).add(event.util_pct)
        total = sum(per_bucket.values())
        assert total > 100
        assert 0.85 <= per_bucket[25.0] / total <= 0.95
        assert 0.05 <= per_bucket[500.0] / total <= 0.15
        assert gpu == {0: {37.5}, 1: {80.0}}

        out = tmp_path / "prom.jsonl"
        cli = subprocess.run(  # noqa: ASYNC221 - the CLI under test, as a user runs it
            [sys.executable, "-m", "controller", "record", "--from-prometheus", prometheus.url,
             "--query", f"latency={LATENCY_QUERY}", "--query", "gpu=DCGM_FI_DEV_GPU_UTIL",
             "--start", str(start), "--end", "now", "--step", "1s", "--out", str(out)],
            capture_output=True, text=True, timeout=60, env=os.environ,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        decoded = [result for _, result in read_events(out)]
        assert not [r for r in decoded if isinstance(r, Rejection)]
        assert {type(r).__name__ for r in decoded} == {"InferenceLatency", "GpuUtilization"}
        assert f"recorded {len(decoded)} messages" in cli.stdout


def test_unreachable_prometheus_is_one_clear_error(tmp_path: Path) -> None:
    """`record --from-prometheus` at a closed port fails with one line, no traceback."""
    cli = subprocess.run(
        [sys.executable, "-m", "controller", "record", "--from-prometheus",
         f"http://127.0.0.1:{free_port()}", "--query", "gpu=x", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 1
    assert "Error: cannot reach Prometheus" in cli.stderr
    assert "Traceback" not in cli.stderr
