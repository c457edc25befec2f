"""OTLP metrics points (from Kafka, :mod:`streams.otlp`) to the events a scrape would give.

Clusters that already ship metrics with the OpenTelemetry Collector (a Prometheus receiver
scraping vLLM, say, and the Kafka exporter) need no scraper: the bridge reads those topics and
publishes the same ``inference.latency`` and ``inference.load`` events. Which metric means what
comes from the same server kinds as the scraper (:mod:`controller.agent.servers`), matched by
metric name; the Collector's Prometheus receiver keeps the exposed names, except that it may
drop a counter's ``_total``, so both spellings match.

Who a point belongs to comes from its resource attributes (the Collector's k8sattributes
processor sets them): the service from ``ebbtide.service``, else ``service.name``; the
namespace from ``k8s.namespace.name``; the pod from ``k8s.pod.name``.

Cumulative points go through the same :class:`~controller.agent.signals.SignalTracker` as
scrapes (deltas, resets, rates). Delta points (an SDK exporting with delta temporality) are
added up per series first, so the tracker sees them as cumulative: the first point of each
series is its baseline, as for a scrape.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from controller.agent.exposition import Exposition, Histogram, Labels, Series
from controller.agent.servers import ServerKind
from controller.agent.signals import SignalTracker, Target
from streams.events import InferenceLatency, InferenceLoad
from streams.otlp import OtlpBatch, Point

__all__ = ["OtlpTranslator"]


@dataclass(frozen=True, slots=True)
class _Role:
    kind: ServerKind
    histogram: str | None = None
    """The histogram family a point feeds (for histogram points)."""
    value: str | None = None
    """The sample name a gauge or sum point feeds."""


class OtlpTranslator:
    """Turns batches of points into events, remembering each series between batches."""

    def __init__(self, kinds: Mapping[str, ServerKind], *, forget_after_s: float = 600.0) -> None:
        self.tracker = SignalTracker()
        self._forget_after_s = forget_after_s
        self._seen: dict[str, float] = {}
        """Target URL -> the newest point time seen for it (to forget pods that went away)."""
        self._pruned_at = float("-inf")
        self.unmatched: Counter[str] = Counter()
        """Points of metrics no kind reads (counted by metric name, up to 1000 names)."""
        self._roles: dict[str, _Role] = {}
        for kind in kinds.values():
            for name in kind.histogram_names():
                self._roles.setdefault(name, _Role(kind, histogram=name))
            for name in kind.value_names():
                self._roles.setdefault(name, _Role(kind, value=name))
                if name.endswith("_total"):
                    self._roles.setdefault(name.removesuffix("_total"), _Role(kind, value=name))
                for suffix in ("_sum", "_count"):  # read from the histogram point itself
                    if name.endswith(suffix):
                        self._roles.setdefault(name.removesuffix(suffix), _Role(kind))
        self._running: dict[tuple[str, str, Labels], tuple[float, ...]] = {}

    def events(self, batch: OtlpBatch) -> list[InferenceLatency | InferenceLoad]:
        groups: dict[tuple[Labels, str], tuple[ServerKind, Exposition, list[float]]] = {}
        for point in batch.points:
            role = self._roles.get(point.metric)
            if role is None:
                if len(self.unmatched) < 1000 or point.metric in self.unmatched:
                    self.unmatched[point.metric] += 1
                continue
            key = (point.resource, role.kind.name)
            kind, expo, times = groups.setdefault(key, (role.kind, Exposition(), []))
            times.append(point.time_s)
            self._add(expo, role, point, f"otlp:{kind.name}:{point.resource}")
        out: list[InferenceLatency | InferenceLoad] = []
        for (resource, _), (kind, expo, times) in groups.items():
            target = _target(resource, kind)
            if target is None:
                self.tracker.stats.note("no service.name on the resource")
                continue
            ts = max(times)
            self._seen[target.url] = ts
            out.extend(self.tracker.events(target, expo, ts=ts, now=ts))
        self._prune()
        return out

    def _prune(self) -> None:
        """Forget series whose resource sent nothing for ``forget_after_s`` (pods come and go:
        the state would otherwise grow for as long as the bridge runs)."""
        if not self._seen:
            return
        newest = max(self._seen.values())
        if newest - self._pruned_at < self._forget_after_s / 10:
            return
        self._pruned_at = newest
        cutoff = newest - self._forget_after_s
        self._seen = {url: t for url, t in self._seen.items() if t >= cutoff}
        self.tracker.forget(self._seen)
        self._running = {k: v for k, v in self._running.items() if k[0] in self._seen}

    def _add(self, expo: Exposition, role: _Role, point: Point, url: str) -> None:
        if point.kind != "histogram":
            if role.value is not None:
                (value,) = self._accumulate(url, role.value, point, (point.value,))
                expo.values.setdefault(role.value, []).append(Series(point.attributes, value))
            return
        if role.histogram is not None:
            cumulative = tuple(itertools.accumulate(point.counts, initial=0.0))[1:]
            cumulative = self._accumulate(url, role.histogram, point, cumulative)
            expo.histograms.setdefault(role.histogram, []).append(
                (point.attributes, Histogram(point.bounds, cumulative))
            )
        wanted = role.kind.value_names()
        for name, value in (
            (f"{point.metric}_sum", point.total),
            (f"{point.metric}_count", float(sum(point.counts))),
        ):
            if name in wanted:
                (value,) = self._accumulate(url, name, point, (value,))
                expo.values.setdefault(name, []).append(Series(point.attributes, value))

    def _accumulate(
        self, url: str, name: str, point: Point, values: tuple[float, ...]
    ) -> tuple[float, ...]:
        """Cumulative values of a series: as given, or the running total of delta points."""
        if point.cumulative:
            return values
        key = (url, name, point.attributes)
        before = self._running.get(key)
        total = (
            values
            if before is None or len(before) != len(values)
            else tuple(a + b for a, b in zip(before, values, strict=True))
        )
        self._running[key] = total
        return total


def _target(resource: Labels, kind: ServerKind) -> Target | None:
    attrs = dict(resource)
    service = attrs.get("ebbtide.service") or attrs.get("service.name")
    if not service:
        return None
    return Target(
        url=f"otlp:{kind.name}:{resource}",
        kind=kind,
        service=service,
        namespace=attrs.get("k8s.namespace.name") or "default",
        pod=attrs.get("k8s.pod.name") or None,
    )
