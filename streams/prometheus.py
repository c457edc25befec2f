"""Prometheus as a source of events: history for recordings, recent data for warm starts.

Users already keep latency histograms and DCGM GPU utilization in Prometheus. A PromQL result
becomes the same typed events Kafka carries, so recordings made from it replay through the same
engine, and a restarted controller can fill its windows instead of acting on empty ones.

Mapping, per series and per step:

* ``latency`` queries returning **histogram buckets** (series with an ``le`` label, typically
  ``sum by (le, service, namespace) (increase(x_bucket[STEP]))``) become one ``histogram``
  event per service and step: the cumulative bucket counts are differenced into per-bucket
  counts (rounded: ``increase`` extrapolates), ``+Inf`` is the overflow bucket. Bucket bounds
  are in seconds by Prometheus convention (``unit_ms=1000``).
* ``latency`` queries returning **one value** per series (e.g. a ``histogram_quantile``)
  become ``latency_ms`` events: a single sample standing for the quantile. Coarser: use buckets
  when you have them.
* ``gpu`` queries (e.g. ``DCGM_FI_DEV_GPU_UTIL``) become ``gpu.utilization`` events; the node is
  read from ``Hostname`` (dcgm-exporter), ``node`` or ``instance``; MIG instances from
  ``GPU_I_PROFILE``/``GPU_I_ID``; the pod from ``namespace``/``pod``.

NaN values (a quantile over no traffic) and series without the labels needed are skipped and
counted, never raised. The client (prometheus-api-client) is synchronous; calls run in a thread.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from streams.events import (
    DEFAULT_TOPICS,
    Event,
    GpuUtilization,
    InferenceLatency,
    LatencyHistogram,
    encode_event,
    event_key,
    event_type,
)
from streams.producer import RawMessage
from streams.recording import RecordingWriter
from streams.stream_errors import PrometheusRejected, PrometheusUnavailable

__all__ = [
    "PromQuery",
    "Translation",
    "fetch_events",
    "parse_query_option",
    "parse_time",
    "to_events",
    "write_events",
]

Kind = Literal["latency", "gpu"]
Series = Mapping[str, Any]  # {"metric": {label: value}, "values": [[ts, "v"], ...]}

_NODE_LABELS = ("Hostname", "node", "kubernetes_node", "instance")
_SERVICE_LABELS = ("service", "app", "job")


@dataclass(frozen=True, slots=True)
class PromQuery:
    """One PromQL expression and what its series mean."""

    kind: Kind
    expr: str
    unit_ms: float = 1000.0
    """Milliseconds per unit of the latency values and bucket bounds (seconds: 1000)."""


def parse_query_option(text: str) -> PromQuery:
    """``latency=EXPR``, ``latency[ms]=EXPR`` or ``gpu=EXPR`` (the CLI's ``--query``)."""
    name, sep, expr = text.partition("=")
    units = {"latency": 1000.0, "latency[s]": 1000.0, "latency[ms]": 1.0, "gpu": 1.0}
    if not sep or name.strip() not in units or not expr.strip():
        raise ValueError(
            f"--query {text!r}: expected latency=PROMQL, latency[ms]=PROMQL or gpu=PROMQL"
        )
    name = name.strip()
    kind: Kind = "gpu" if name == "gpu" else "latency"
    return PromQuery(kind, expr.strip(), units[name])


@dataclass(slots=True)
class Translation:
    """Events made from a query result, and what could not be used."""

    events: list[Event] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((labels[n] for n in names if labels.get(n)), None)


def to_events(query: PromQuery, result: Iterable[Series], out: Translation) -> None:
    """Translate a range-query ``result`` into events appended to ``out`` (pure)."""
    if query.kind == "gpu":
        _gpu_events(result, out)
        return
    series = list(result)
    if any("le" in s["metric"] for s in series):
        _histogram_events(series, query.unit_ms, out)
    else:
        _quantile_events(series, query.unit_ms, out)


def _values(series: Series) -> Iterable[tuple[float, float]]:
    for ts, text in series["values"]:
        value = float(text)
        if math.isfinite(value):
            yield float(ts), value


def _service(labels: Mapping[str, str], out: Translation) -> tuple[str, str] | None:
    service = _first(labels, _SERVICE_LABELS)
    if service is None:
        out.skipped["latency series without a service label"] += 1
        return None
    return labels.get("namespace") or "default", service


def _quantile_events(series: Iterable[Series], unit_ms: float, out: Translation) -> None:
    for s in series:
        if (who := _service(s["metric"], out)) is None:
            continue
        for ts, value in _values(s):
            out.events.append(
                InferenceLatency(
                    ts=ts, service=who[1], namespace=who[0], latency_ms=max(0.0, value * unit_ms)
                )
            )


def _histogram_events(series: Iterable[Series], unit_ms: float, out: Translation) -> None:
    # (namespace, service) -> ts -> {le: cumulative count}
    grid: dict[tuple[str, str], dict[float, dict[float, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for s in series:
        labels = s["metric"]
        if (who := _service(labels, out)) is None:
            continue
        le = float(labels["le"])
        for ts, value in _values(s):
            grid[who][ts][le] = value
    for (namespace, service), steps in sorted(grid.items()):
        for ts, cumulative in sorted(steps.items()):
            bounds = sorted(b for b in cumulative if math.isfinite(b))
            total = cumulative.get(math.inf, cumulative[bounds[-1]] if bounds else 0.0)
            counts, below = [], 0.0
            for b in bounds:
                counts.append(max(0, round(cumulative[b] - below)))
                below = max(below, cumulative[b])
            counts.append(max(0, round(total - below)))
            if not bounds or sum(counts) == 0:
                continue  # no traffic in this step: nothing observed
            histogram = LatencyHistogram(bounds_ms=[b * unit_ms for b in bounds], counts=counts)
            out.events.append(
                InferenceLatency(ts=ts, service=service, namespace=namespace, histogram=histogram)
            )


def _gpu_events(series: Iterable[Series], out: Translation) -> None:
    for s in series:
        labels = s["metric"]
        node, gpu = _first(labels, _NODE_LABELS), labels.get("gpu") or labels.get("UUID")
        if node is None or gpu is None:
            out.skipped["gpu series without node or gpu labels"] += 1
            continue
        profile = labels.get("GPU_I_PROFILE") or None
        instance = labels.get("GPU_I_ID")
        pod = f"{labels['namespace']}/{labels['pod']}" if labels.get("pod") else None
        for ts, value in _values(s):
            out.events.append(
                GpuUtilization(
                    ts=ts,
                    node=node.split(":")[0],
                    gpu=int(gpu) if gpu.isdigit() else gpu,
                    util_pct=min(100.0, max(0.0, value)),
                    mig_profile=profile,
                    mig_instance=int(instance) if profile and instance is not None else None,
                    pod=pod if pod and "namespace" in labels else None,
                )
            )


async def fetch_events(
    url: str,
    queries: Sequence[PromQuery],
    *,
    start: datetime,
    end: datetime,
    step: str,
    timeout_s: float = 60.0,
) -> Translation:
    """Run every query over ``[start, end]`` and return their events sorted by time."""
    prom = PrometheusConnect(url=url, disable_ssl=True, timeout=int(timeout_s))
    out = Translation()
    for query in queries:
        try:
            result = await asyncio.to_thread(
                prom.custom_query_range, query.expr, start_time=start, end_time=end, step=step
            )
        except PrometheusApiClientException as exc:
            raise PrometheusRejected(f"Prometheus rejected {query.expr!r}: {exc}") from exc
        except OSError as exc:  # requests' connection errors are OSErrors
            raise PrometheusUnavailable(f"cannot reach Prometheus at {url}: {exc}") from exc
        to_events(query, result, out)
    out.events.sort(key=lambda e: e.time)
    return out


def write_events(events: Iterable[Event], path: Path, **header: Any) -> int:
    """Write ``events`` as a recording on their default topics, keyed, timed by event time."""
    with RecordingWriter(path, source="prometheus", **header) as writer:
        for offset, event in enumerate(events):
            writer.write(
                RawMessage(
                    topic=DEFAULT_TOPICS[event_type(event)],
                    partition=0,
                    offset=offset,
                    key=event_key(event),
                    value=encode_event(event),
                    headers=(),
                    timestamp_ms=int(event.time * 1000),
                )
            )
        return writer.count


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, *, now: datetime) -> datetime:
    """An RFC 3339 time, epoch seconds, ``now`` or ``now-2h`` as an aware datetime."""
    text = text.strip()
    if text.startswith("now"):
        rest = text.removeprefix("now").replace(" ", "")
        if not rest:
            return now
        if rest[0] == "-" and rest[-1] in _UNITS and rest[1:-1].replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(
                now.timestamp() - float(rest[1:-1]) * _UNITS[rest[-1]], UTC
            )
        raise ValueError(f"cannot read time {text!r}: use now, now-30m, RFC 3339 or epoch seconds")
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"cannot read time {text!r}: use now, now-30m, RFC 3339 or epoch seconds"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
