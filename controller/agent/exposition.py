"""One Prometheus text exposition in, the few series the scraper needs out.

Parsing is prometheus_client's own text parser (``prometheus_client.parser``, the reference
implementation of the format Prometheus scrapes), so every quirk of the format — escaped label
values, ``+Inf``/``NaN``, comments, ``_created`` samples — is read as Prometheus reads it. Only the
families named in ``wanted`` are kept, and the work is bounded: at most ``max_samples`` samples
are looked at, whatever the server sends.

A malformed exposition is reported as :class:`BadExposition` with one line saying why, never
raised: a server answering garbage is counted and skipped by the scraper.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["BadExposition", "Exposition", "Histogram", "Series", "parse_exposition"]

Labels = tuple[tuple[str, str], ...]
"""Sorted label pairs: hashable, so they can key a series."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram series: ``cumulative[i]`` observations at or below ``bounds[i]``; the last
    entry (one more than ``bounds``) is the ``+Inf`` bucket, every observation."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Series:
    labels: Labels
    value: float


@dataclass(slots=True)
class Exposition:
    """The wanted series of one scrape: histograms by family name, other samples (gauges,
    counters, a histogram's ``_sum``) by sample name, each with its labels."""

    histograms: dict[str, list[tuple[Labels, Histogram]]] = field(default_factory=dict)
    values: dict[str, list[Series]] = field(default_factory=dict)
    samples: int = 0
    problems: list[str] = field(default_factory=list)
    """Histograms that could not be read (a missing ``+Inf`` bucket, buckets that shrink): one
    line each; the rest of the exposition is still used."""


@dataclass(frozen=True, slots=True)
class BadExposition:
    reason: str


def parse_exposition(
    text: str,
    *,
    histograms: Collection[str],
    values: Collection[str],
    max_samples: int = 100_000,
) -> Exposition | BadExposition:
    """Keep the histogram families named in ``histograms`` and the samples named in ``values``.

    Sample names in ``values`` are as exposed (``vllm:generation_tokens_total``), so counters,
    gauges and a histogram's ``_sum``/``_count`` are named the same way in mappings."""
    out = Exposition()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.samples += 1
                if out.samples > max_samples:
                    return BadExposition(
                        f"more than {max_samples} samples; the rest was not read "
                        "(raise the scrape's max_samples, or scrape a narrower endpoint)"
                    )
                if sample.name in values:
                    out.values.setdefault(sample.name, []).append(
                        Series(_labels(sample.labels), float(sample.value))
                    )
            if family.type == "histogram" and family.name in histograms:
                _read_histogram(family.name, family.samples, out)
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # what the parser raises
        return BadExposition(f"not a Prometheus text exposition: {exc}")
    except UnicodeError as exc:
        return BadExposition(f"not text: {exc}")
    return out


def _labels(labels: Mapping[str, str], drop: str | None = None) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _read_histogram(name: str, samples: Sequence[Sample], out: Exposition) -> None:
    buckets: dict[Labels, list[tuple[float, float]]] = {}
    counts: dict[Labels, float] = {}
    for sample in samples:
        s_name, s_labels, value = sample.name, sample.labels, float(sample.value)
        if s_name == f"{name}_bucket" and "le" in s_labels:
            key = _labels(s_labels, drop="le")
            buckets.setdefault(key, []).append((float(s_labels["le"]), value))
        elif s_name == f"{name}_count":
            counts[_labels(s_labels)] = value
    for key, pairs in buckets.items():
        pairs.sort()
        bounds = tuple(le for le, _ in pairs if math.isfinite(le))
        cumulative = [v for _, v in pairs]
        if len(cumulative) == len(bounds):  # no +Inf bucket: the _count is the same number
            total = counts.get(key)
            if total is None:
                out.problems.append(f"{name}{dict(key)}: no +Inf bucket and no _count")
                continue
            cumulative.append(total)
        if any(b < a for a, b in itertools.pairwise(cumulative)):
            out.problems.append(
                f"{name}{dict(key)}: cumulative bucket counts decrease with the bound"
            )
            continue
        out.histograms.setdefault(name, []).append((key, Histogram(bounds, tuple(cumulative))))
