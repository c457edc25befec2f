"""Load generators: how many requests each inference service is offered, second by second.

Design:

* A load is a **shape** times a **peak**: :meth:`LoadShape.factor` gives the offered load at an
  event time as a fraction of the service's ``peak_rps`` (bursts included, so it can exceed 1);
  the runner multiplies by each service's peak
  (:class:`~controller.offline.models.queueing.ServiceModel`).
  Every service follows the same shape, as services of one product do.
* **Diurnal** (:class:`Diurnal`): ``trough + (1 - trough) * (1 - cos(2 pi (h - trough_hour) /
  24)) / 2`` where ``h`` is the hour of the (UTC) day of the event time: the trough (default 15%
  of peak) at 04:00, the peak at 16:00. Simulations start at ``EPOCH`` (midnight) plus the
  ``--start`` time of day, so a run starting at 02:00 begins in the night.
* **Azure trace** (:class:`AzureTrace`): the arrival process of the Azure LLM inference trace
  2023 (code completion; one hour, 8,819 requests; CC-BY 4.0, Patel et al., "Splitwise", ISCA
  2024, github.com/Azure/AzurePublicDataset). Arrivals are counted per ``bucket_s`` (60 s) of the
  trace, smoothed over three buckets and divided by the largest count, so the shape keeps the
  trace's minute-to-minute swings; it repeats every hour of the run. The trace keeps its scale:
  :attr:`AzureTrace.peak_rps` is its busiest smoothed bucket in requests per second, which the
  runner offers times ``--load-scale`` (the diurnal day has no rate of its own: its peak is set
  relative to the service's capacity). Its requests' ``(ContextTokens, GeneratedTokens)`` are
  kept (:attr:`AzureTrace.tokens`) for the LLM serving model
  (:mod:`controller.offline.models.llmserving`); a trace without them leaves it empty.
* **Bursts** (:class:`Burst`) multiply either shape by ``factor`` for ``duration_s`` from
  ``start_s`` after the run's start, with linear ramps of ``ramp_s`` on both sides: a flash crowd
  that capacity planned for the day does not cover.
* **Arrivals** are Poisson: :func:`poisson` draws the count of one tick from a seeded
  :class:`random.Random`. A run draws each service's arrivals from its own generator, seeded by
  ``(seed, service)`` and consumed identically whatever the policy does, so the baselines and
  Ebbtide see exactly the same requests.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Final, Protocol

from policies.model import parse_duration

__all__ = [
    "AZURE_ATTRIBUTION",
    "AzureTrace",
    "Burst",
    "Diurnal",
    "LoadShape",
    "parse_burst",
    "peak_factor",
    "poisson",
]

AZURE_ATTRIBUTION: Final = (
    "Load shaped by the Azure LLM inference trace 2023 (code), CC-BY 4.0: Patel et al., "
    '"Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024; '
    "data from github.com/Azure/AzurePublicDataset"
)
_DAY: Final = 86_400.0
_PROMPT: Final = "ContextTokens"
_OUTPUT: Final = "GeneratedTokens"


class LoadShape(Protocol):
    """Offered load over time, as a fraction of each service's peak."""

    def factor(self, t: float) -> float:
        """The load at event time ``t`` (epoch seconds) relative to the peak, bursts included."""
        ...

    def describe(self) -> str:
        """One line for reports and recording headers."""
        ...


@dataclass(frozen=True, slots=True)
class Burst:
    """A flash crowd: the load times ``factor`` from ``start_s`` (seconds after the run's start)
    for ``duration_s``, ramping linearly over ``ramp_s`` on either side."""

    start_s: float
    duration_s: float
    factor: float
    ramp_s: float = 20.0

    def multiplier(self, offset: float) -> float:
        """The burst's multiplier ``offset`` seconds after the run's start (1 outside it)."""
        end = self.start_s + self.duration_s
        if offset <= self.start_s - self.ramp_s or offset >= end + self.ramp_s:
            return 1.0
        if offset < self.start_s:
            weight = (offset - (self.start_s - self.ramp_s)) / self.ramp_s
        elif offset > end:
            weight = (end + self.ramp_s - offset) / self.ramp_s
        else:
            weight = 1.0
        return 1.0 + (self.factor - 1.0) * weight


def _bursts_factor(bursts: Sequence[Burst], offset: float) -> float:
    m = 1.0
    for b in bursts:
        m *= b.multiplier(offset)
    return m


def _describe_bursts(bursts: Sequence[Burst]) -> str:
    if not bursts:
        return "no bursts"
    return ", ".join(
        f"burst x{b.factor:g} at +{b.start_s / 60:g}m for {b.duration_s / 60:g}m" for b in bursts
    )


@dataclass(frozen=True, slots=True)
class Diurnal:
    """A day of load: trough at ``trough_hour`` (UTC), peak twelve hours later; bursts on top."""

    start: float
    """The run's start (epoch seconds): burst offsets count from here."""
    trough: float = 0.15
    trough_hour: float = 4.0
    bursts: tuple[Burst, ...] = ()

    def base(self, t: float) -> float:
        """The diurnal factor without bursts."""
        hour = (t % _DAY) / 3600.0
        wave = (1.0 - math.cos(2.0 * math.pi * (hour - self.trough_hour) / 24.0)) / 2.0
        return self.trough + (1.0 - self.trough) * wave

    def factor(self, t: float) -> float:
        return self.base(t) * _bursts_factor(self.bursts, t - self.start)

    def describe(self) -> str:
        return (
            f"diurnal (trough {self.trough:.0%} of peak at {self.trough_hour:02g}:00 UTC, "
            f"peak at {(self.trough_hour + 12) % 24:02g}:00), {_describe_bursts(self.bursts)}"
        )


@dataclass(frozen=True, slots=True)
class AzureTrace:
    """The Azure LLM trace's arrivals per minute, as a shape repeating every hour."""

    start: float
    buckets: tuple[float, ...]
    """Smoothed arrivals per bucket, divided by the largest."""
    bucket_s: float = 60.0
    bursts: tuple[Burst, ...] = ()
    source: str = field(default="", compare=False)
    peak_rps: float = 0.0
    """The trace's busiest smoothed bucket, in requests per second (what factor 1 stands for)."""
    tokens: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)
    """Every request's (prompt, output) tokens, in trace order; empty without those columns."""

    @classmethod
    def from_csv(
        cls, path: Path, *, start: float, bucket_s: float = 60.0, bursts: tuple[Burst, ...] = ()
    ) -> AzureTrace:
        """Read ``TIMESTAMP,ContextTokens,GeneratedTokens`` rows; raises ``ValueError`` when
        the file has no usable row."""
        times: list[float] = []
        tokens: list[tuple[int, int]] = []
        with open(path, newline="", encoding="utf-8") as stream:
            reader = csv.DictReader(stream)
            counted = {_PROMPT, _OUTPUT} <= set(reader.fieldnames or ())
            for row in reader:
                stamp = (row.get("TIMESTAMP") or "").strip()
                if not stamp:
                    continue
                try:
                    times.append(datetime.fromisoformat(stamp[:26]).timestamp())
                except ValueError as exc:
                    raise ValueError(f"{path}: bad TIMESTAMP {stamp!r}") from exc
                if counted:
                    tokens.append(_token_pair(path, reader.line_num, row))
        if not times:
            raise ValueError(f"{path}: no requests (expected TIMESTAMP,ContextTokens,...)")
        first = min(times)
        counts = [0] * (int((max(times) - first) // bucket_s) + 1)
        for t in times:
            counts[int((t - first) // bucket_s)] += 1
        n = len(counts)
        smooth = [
            sum(counts[j] for j in (i - 1, i, i + 1) if 0 <= j < n)
            / sum(1 for j in (i - 1, i, i + 1) if 0 <= j < n)
            for i in range(n)
        ]
        top = max(smooth)
        buckets = tuple(c / top for c in smooth)
        return cls(start, buckets, bucket_s, bursts, str(path), top / bucket_s, tuple(tokens))

    def at(self, start: float) -> AzureTrace:
        """The same trace for a run starting at ``start``."""
        return replace(self, start=start)

    def factor(self, t: float) -> float:
        offset = t - self.start
        i = int(offset // self.bucket_s) % len(self.buckets)
        return self.buckets[i] * _bursts_factor(self.bursts, offset)

    def describe(self) -> str:
        low = min(self.buckets)
        return (
            f"Azure LLM trace arrivals per {self.bucket_s:g}s ({len(self.buckets)} buckets, "
            f"{low:.0%}-100% of its peak {self.peak_rps:.2f} req/s, repeating), "
            f"{_describe_bursts(self.bursts)}"
        )


def _token_pair(path: Path, line: int, row: dict[str, str]) -> tuple[int, int]:
    """A row's (ContextTokens, GeneratedTokens); ``ValueError`` naming the line when bad."""
    try:
        prompt, output = int(row[_PROMPT]), int(row[_OUTPUT])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}:{line}: bad {_PROMPT}/{_OUTPUT} ({exc})") from exc
    if prompt < 0 or output < 0:
        raise ValueError(f"{path}:{line}: negative {_PROMPT}/{_OUTPUT}")
    return prompt, output


def peak_factor(shape: LoadShape, start: float, duration: float, step: float = 10.0) -> float:
    """The largest factor over ``[start, start + duration)``, sampled every ``step`` seconds
    (what static partitioning sizes inference for)."""
    steps = max(1, math.ceil(duration / step))
    return max(shape.factor(start + i * step) for i in range(steps + 1))


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson count with ``mean``: Knuth's product method below 30, a rounded normal above
    (exact enough for arrivals, and O(1))."""
    if mean <= 0.0:
        return 0
    if mean < 30.0:
        limit, k, p = math.exp(-mean), 0, rng.random()
        while p > limit:
            k += 1
            p *= rng.random()
        return k
    return max(0, round(rng.gauss(mean, math.sqrt(mean))))


def parse_burst(text: str) -> Burst:
    """``OFFSET:DURATION:FACTOR`` such as ``40m:15m:6`` (durations with a unit)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"a burst is OFFSET:DURATION:FACTOR, e.g. 40m:15m:6; got {text!r}")
    try:
        start, duration, factor = (
            parse_duration(parts[0]),
            parse_duration(parts[1]),
            float(parts[2]),
        )
    except ValueError as exc:
        raise ValueError(f"bad burst {text!r}: {exc}") from exc
    if duration <= 0 or factor <= 0 or start < 0:
        raise ValueError(f"bad burst {text!r}: offset >= 0, duration > 0 and factor > 0")
    return Burst(start, duration, factor)
