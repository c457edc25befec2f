"""Scrapes of one server in, ``inference.latency`` and ``inference.load`` events out.

Prometheus histograms and counters are cumulative since the server started; events carry what
happened since the previous scrape. :class:`SignalTracker` keeps the previous scrape of each
target and turns the difference into events:

* **histogram deltas** — the bucket counts added since the last scrape, per objective (``e2e``,
  ``ttft``, ``tpot``), as an ``inference.latency`` histogram event. The ``+Inf`` bucket becomes
  the event's overflow count; bounds above :data:`~streams.events.MAX_LATENCY_MS` (vLLM's
  e2e histogram ends at 7680 s) fold into the overflow too, so no event is refused for them;
* **counter rates** — requests and tokens per second over the span between the two scrapes;
* **gauges** — queue depth, running requests, KV-cache usage, as read.

A counter or bucket lower than at the previous scrape means the server restarted (a container
restart keeps the pod's name and address): like Prometheus' ``rate()``, the new value is taken
as everything since the restart, and ``resets`` is counted. Bounds that changed between scrapes
(a server upgraded in place) restart the series: nothing is published for that interval, and
``bounds_changed`` is counted. The first scrape of a target is its baseline: it publishes load
gauges but no deltas, since its cumulative counts cover the whole life of the server — unless
the server says it started moments ago (``process_start_time_seconds``, which prometheus_client
exposes by default, within ``fresh_s`` of the scrape): then everything it counted is recent and
is published, so a new replica's first requests are not lost.

Several series of one metric (vLLM's one per data-parallel engine, Triton's one per model) are
summed; a target can keep only the series whose labels match (``Target.match``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from controller.agent.exposition import Exposition, Histogram, Labels, Series
from controller.agent.servers.kind import ServerKind
from streams.events import (
    MAX_LATENCY_MS,
    InferenceLatency,
    InferenceLoad,
    LatencyHistogram,
    Objective,
)

__all__ = ["MAX_PROBLEMS", "PROCESS_START", "SignalStats", "SignalTracker", "Target"]

MAX_PROBLEMS = 1000

#: prometheus_client's process collector: when the server process started (epoch seconds).
PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True, slots=True)
class Target:
    """One server to scrape and the service its readings belong to."""

    url: str
    kind: ServerKind
    service: str
    namespace: str = "default"
    pod: str | None = None
    model: str | None = None
    match: Labels = ()
    """Only series carrying all these labels are read (e.g. one model of a Triton server)."""
    node: str | None = None
    """The node the server runs on (names a GPU exporter's devices without ``Hostname``)."""


@dataclass(slots=True)
class SignalStats:
    resets: int = 0
    """Counters or histograms found lower than at the previous scrape (a server restart)."""
    bounds_changed: int = 0
    """Histograms whose bucket bounds changed between two scrapes (their interval is lost)."""
    problems: Counter[str] = field(default_factory=Counter)
    """Histograms that could not be used, by reason (at most :data:`MAX_PROBLEMS` distinct
    reasons; later ones count as ``other``, so the counts stay bounded however many pods
    misbehave)."""

    def note(self, problem: str, count: int = 1) -> None:
        key = problem if problem in self.problems or len(self.problems) < MAX_PROBLEMS else "other"
        self.problems[key] += count


@dataclass(frozen=True, slots=True)
class _Seen:
    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]


class SignalTracker:
    """Remembers each target's previous scrape; :meth:`events` gives what changed since."""

    def __init__(self, *, fresh_s: float = 30.0) -> None:
        self.stats = SignalStats()
        self._fresh_s = fresh_s
        self._histograms: dict[tuple[str, str], _Seen] = {}
        self._counters: dict[tuple[str, str], tuple[float, float]] = {}
        self._last: dict[str, float] = {}

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the state of targets whose URL is not in ``keep`` (pods that went away)."""
        urls = set(keep)
        self._histograms = {k: v for k, v in self._histograms.items() if k[0] in urls}
        self._counters = {k: v for k, v in self._counters.items() if k[0] in urls}
        self._last = {k: v for k, v in self._last.items() if k in urls}

    def events(
        self, target: Target, expo: Exposition, *, ts: float, now: float
    ) -> list[InferenceLatency | InferenceLoad]:
        """Events for one scrape of ``target`` taken at wall time ``ts`` (event time) and
        monotonic time ``now`` (rates)."""
        out: list[InferenceLatency | InferenceLoad] = []
        known = target.url in self._last or self._started_recently(expo, ts)
        done: set[Objective] = set()
        for source in target.kind.latency:
            if source.objective in done or source.metric not in expo.histograms:
                continue
            done.add(source.objective)
            counts = self._delta(target, source.metric, expo.histograms[source.metric], known)
            if counts is None:
                continue
            histogram = _histogram_ms(counts[0], counts[1], source.unit_ms)
            if histogram is not None:
                out.append(
                    InferenceLatency(
                        ts=ts,
                        service=target.service,
                        namespace=target.namespace,
                        histogram=histogram,
                        pod=target.pod,
                        model=target.model,
                        objective=source.objective,
                    )
                )
        load = self._load(target, expo, ts=ts, now=now)
        if load is not None:
            out.append(load)
        return out

    def _started_recently(self, expo: Exposition, ts: float) -> bool:
        starts = expo.values.get(PROCESS_START)
        if not starts:
            return False
        return 0.0 <= ts - max(s.value for s in starts) <= self._fresh_s

    # -- histograms ------------------------------------------------------------------------

    def _delta(
        self,
        target: Target,
        metric: str,
        series: Sequence[tuple[Labels, Histogram]],
        known: bool,
    ) -> tuple[tuple[float, ...], list[int]] | None:
        """``(bounds, counts per bucket)`` added since the previous scrape, overflow last.

        A histogram first seen on a target scraped before appeared since that scrape
        (prometheus_client creates a labelled series on its first observation): its baseline
        is zero."""
        chosen = [h for labels, h in series if _matches(labels, target.match)]
        if not chosen:
            return None
        bounds = chosen[0].bounds
        if any(h.bounds != bounds for h in chosen):
            self.stats.note(f"{metric}: series with different bounds")
            return None
        cumulative = tuple(
            sum(column) for column in zip(*(h.cumulative for h in chosen), strict=True)
        )
        key = (target.url, metric)
        before = self._histograms.get(key)
        self._histograms[key] = _Seen(bounds, cumulative)
        if before is None:
            if not known:
                return None
            before = _Seen(bounds, (0.0,) * len(cumulative))
        if before.bounds != bounds:
            self.stats.bounds_changed += 1
            return None
        delta = [now - then for now, then in zip(cumulative, before.cumulative, strict=True)]
        if any(d < 0 for d in delta):
            self.stats.resets += 1
            delta = list(cumulative)
        counts = [round(delta[0])]
        for i in range(1, len(delta)):
            counts.append(round(delta[i] - delta[i - 1]))
        if any(c < 0 for c in counts):  # exposition.py already refuses decreasing buckets
            self.stats.note(f"{metric}: bucket counts moved apart")
            return None
        return bounds, counts

    # -- gauges and counters ---------------------------------------------------------------

    def _load(
        self, target: Target, expo: Exposition, *, ts: float, now: float
    ) -> InferenceLoad | None:
        kind = target.kind
        before = self._last.get(target.url)
        self._last[target.url] = now
        span = now - before if before is not None and now > before else None
        waiting = _gauge(expo, kind.waiting, target.match)
        running = _gauge(expo, kind.running, target.match)
        kv = _kv_cache(expo, kind, target.match)
        rates = {
            "request_rate": self._rate(target, expo, kind.requests, now, span),
            "tokens_per_s": self._rate(target, expo, kind.tokens, now, span),
            "prompt_tokens_per_s": self._rate(target, expo, kind.prompt_tokens, now, span),
        }
        if (
            waiting is None
            and running is None
            and kv is None
            and all(v is None for v in rates.values())
        ):
            return None
        return InferenceLoad(
            ts=ts,
            service=target.service,
            version=1,
            namespace=target.namespace,
            pod=target.pod,
            model=target.model,
            server=kind.name,
            waiting=waiting,
            running=running,
            kv_cache_pct=kv,
            interval_s=span if any(v is not None for v in rates.values()) else None,
            **rates,
        )

    def _rate(
        self, target: Target, expo: Exposition, names: Sequence[str], now: float, span: float | None
    ) -> float | None:
        value = _gauge(expo, names, target.match)
        if value is None:
            return None
        key = (target.url, names[0])
        before = self._counters.get(key)
        self._counters[key] = (value, now)
        if span is None:
            return None
        if before is None:  # a counter that appeared since the previous scrape starts at zero
            before = (0.0, now - span)
        increase = value - before[0]
        if increase < 0:
            self.stats.resets += 1
            increase = value
        return increase / span


def _matches(labels: Labels, match: Labels) -> bool:
    return not match or set(match) <= set(labels)


def _first(expo: Exposition, names: Sequence[str], match: Labels) -> list[Series] | None:
    for name in names:
        series = [s for s in expo.values.get(name, ()) if _matches(s.labels, match)]
        if series:
            return series
    return None


def _gauge(expo: Exposition, names: Sequence[str], match: Labels) -> float | None:
    series = _first(expo, names, match)
    if series is None:
        return None
    total = sum(s.value for s in series)
    return total if total >= 0 and total == total else None  # NaN or negative: not a reading


def _kv_cache(expo: Exposition, kind: ServerKind, match: Labels) -> float | None:
    series = _first(expo, kind.kv_cache, match)
    if series is None:
        return None
    values = [s.value for s in series if s.value == s.value]
    if not values:
        return None
    value = max(values) if kind.kv_cache_reduce == "max" else sum(values) / len(values)
    return min(100.0, max(0.0, value * kind.kv_cache_scale))


def _histogram_ms(
    bounds: tuple[float, ...], counts: list[int], unit_ms: float
) -> LatencyHistogram | None:
    """The event's histogram, or ``None`` when nothing was observed; bounds past the largest
    latency an event may carry fold into the overflow count."""
    if sum(counts) == 0:
        return None
    bounds_ms = [b * unit_ms for b in bounds]
    lo = sum(1 for b in bounds_ms if b < 0)  # none in practice: they fold into the first bucket
    hi = sum(1 for b in bounds_ms if b <= MAX_LATENCY_MS)
    if hi <= lo:
        return None
    head = sum(counts[: lo + 1])
    overflow = sum(counts[hi:])
    return LatencyHistogram(
        bounds_ms=bounds_ms[lo:hi], counts=[head, *counts[lo + 1 : hi], overflow]
    )
