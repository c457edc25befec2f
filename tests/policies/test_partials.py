"""Sharded ingest, pure part: partials folded per source partition and merged by a decider give
the engine exactly the windows (and decisions) one replica builds from the same events, and a
flush re-sent after a rebalance replaces what it re-covers instead of adding to it."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest
from policy_fixtures import T0, cluster, latency, make_policy, util

from policies.decisions import decision_to_dict
from policies.engine import Engine
from policies.partials import Fold, FoldSpec, Merger
from policies.snapshot import Snapshot
from streams.aggregates import Flush, decode_flush, encode_flush
from streams.events import Event, InferenceLatency, LatencyHistogram
from support.engine_probes import gpu_utilization

SECONDS = 60
NO_CLOCK = math.inf


def policy_with_fast_util() -> Engine:
    """The fixture policy with a 30 s utilization window (1 s slots, as the SLO's)."""
    policy = make_policy()
    return Engine(policy)


def stream() -> Iterator[tuple[int, list[tuple[int, Event]]]]:
    """Per second: (second, [(source partition, event)]): chat breaches from 20 s to 45 s; two
    nodes' GPUs report, node w0 on partition 1, w1 on partition 2; chat on partition 0, in all
    three latency forms."""
    for s in range(SECONDS):
        ts = T0 + s
        slow = 20 <= s < 45
        out: list[tuple[int, Event]] = []
        for k in range(20):
            ms = 180.0 + k if slow else 40.0 + k
            out.append((0, latency(ts + k / 20, ms)))
        out.append(
            (
                0,
                InferenceLatency(
                    ts=ts + 0.5, service="chat", namespace="serving", samples_ms=[10.0, 0.0, 55.5]
                ),
            )
        )
        out.append(
            (
                0,
                InferenceLatency(
                    ts=ts + 0.7,
                    service="chat",
                    namespace="serving",
                    histogram=LatencyHistogram(bounds_ms=[50.0, 100.0], counts=[3, 1, 1]),
                ),
            )
        )
        for node, part in (("w0", 1), ("w1", 2)):
            for gpu in range(8):
                pct = 2.0 if node == "w1" else 60.0 + gpu
                out.append((part, util(ts + 0.1 * gpu, node, gpu, pct)))
        yield s, out


def summary(engine: Engine, now: float) -> object:
    return (
        [(s.key, s.state, s.samples, s.level, s.quantile_ms) for s in engine.service_status(now)],
        [(p.name, p.util_pct) for p in engine.pool_status(now)],
        gpu_utilization(engine, now),
    )


def one_replica(snapshot: Snapshot) -> list[tuple[object, list[dict[str, object]]]]:
    engine = Engine(make_policy())
    out = []
    for s, events in stream():
        engine.observe_many([e for _, e in events])
        now = T0 + s + 1
        decisions = engine.evaluate(now, snapshot)
        out.append((summary(engine, now), [decision_to_dict(d) for d in decisions]))
    return out


def sharded(
    snapshot: Snapshot, flushes: Sequence[Sequence[Flush]]
) -> list[tuple[object, list[dict[str, object]]]]:
    """A decider merging ``flushes[s]`` (the flushes of second ``s``, in any order) each second."""
    engine = Engine(make_policy())
    merger = Merger(engine)
    out = []
    for s, batch in enumerate(flushes):
        for flush in batch:
            merger.apply(decode_flush(encode_flush(flush)))
        now = T0 + s + 1
        decisions = engine.evaluate(now, snapshot)
        out.append((summary(engine, now), [decision_to_dict(d) for d in decisions]))
    return out


def fold_per_second() -> list[list[Flush]]:
    """Each partition's aggregator flushes once a second; offsets count events per partition."""
    spec = FoldSpec.of(make_policy())
    offsets = [0, 0, 0]
    per_second = []
    for _, events in stream():
        folds = [Fold(spec, topic="lat", partition=p, first=offsets[p]) for p in range(3)]
        for part, event in events:
            folds[part].observe([event], NO_CLOCK)
            offsets[part] += 1
        per_second.append([f.seal(offsets[f.partition]) for f in reversed(folds)])
    return per_second


def test_merged_partials_decide_as_one_replica() -> None:
    """Three partitions' partials, merged each second, give the same SLO states, quantiles,
    pool and GPU utilization and decisions as one engine fed every event."""
    snapshot = cluster().build()
    want = one_replica(snapshot)
    got = sharded(snapshot, fold_per_second())
    assert any(decisions for _, decisions in want), "the scenario must decide something"
    assert got == want


def test_a_resent_flush_replaces_what_it_recovers_after_a_rebalance() -> None:
    """Aggregator A publishes partition 0's flushes and dies before committing the last one;
    B resumes at the committed offset and re-sends from there with other boundaries (shorter,
    then longer). The decider ends with every event counted exactly once."""
    spec = FoldSpec.of(make_policy())
    events = [e for _, evs in stream() for part, e in evs if part == 0][:400]

    def flush(first: int, nxt: int) -> Flush:
        fold = Fold(spec, topic="lat", partition=0, first=first)
        fold.observe(events[first:nxt], NO_CLOCK)
        return fold.seal(nxt)

    reference = Engine(make_policy())
    reference.observe_many(events)
    decider = Engine(make_policy())
    merger = Merger(decider)
    # A: [0, 100) committed, [100, 250) published but not committed; B resumes at 100.
    for f in (flush(0, 100), flush(100, 250), flush(100, 180), flush(180, 330), flush(330, 400)):
        merger.apply(f)
    assert merger.replaced == 1
    now = T0 + 21
    key = "serving/chat"
    assert decider.service_status(now) == reference.service_status(now)
    assert decider.quantile(key, now) == reference.quantile(key, now)
    # Adding instead of replacing would have counted [100, 180) twice.
    naive = Engine(make_policy())
    naive_merger = Merger(naive)
    for f in (flush(0, 100), flush(100, 250)):
        naive_merger.apply(f)
    for f in (flush(100, 180), flush(180, 330), flush(330, 400)):
        naive_merger.apply(Flush(f.topic, 9, f.first, f.next, f.latency, f.util, f.idle))
    assert naive.service_status(now)[0].samples > reference.service_status(now)[0].samples


def test_forget_before_bounds_what_the_merger_holds() -> None:
    """Partials of intervals no window reaches are dropped; the newest flush of each partition
    stays, so a later re-send still replaces from its offset."""
    merger = Merger(Engine(make_policy()))
    for batch in fold_per_second():
        for f in batch:
            merger.apply(f)
    merger.forget_before(T0 + SECONDS + 60)
    assert all(len(held) == 1 for held in merger._flushes.values())
    assert not merger._latency
    assert not merger._util


def test_a_damaged_flush_is_refused_with_the_reason() -> None:
    """Bytes that are not a flush, or a flush that ends before it starts, raise ValueError."""
    with pytest.raises(ValueError, match="not an aggregates flush"):
        decode_flush(b"\x01garbage")
    with pytest.raises(ValueError, match="ends before it starts"):
        decode_flush(encode_flush(Flush("t", 0, 10, 5, [], [], [])))


def test_folding_does_not_mutate_the_events() -> None:
    """A fold reads events and leaves them as they were (the engine may read them next)."""
    spec = FoldSpec.of(make_policy())
    event = InferenceLatency(ts=T0, service="chat", namespace="serving", samples_ms=[1.0, 2.0])
    before = (event.ts, list(event.samples_ms or []))
    Fold(spec, topic="lat", partition=0, first=0).observe([event], NO_CLOCK)
    assert (event.ts, list(event.samples_ms or [])) == before


@pytest.mark.parametrize("unknown", ["other"], ids=["service-not-in-policy"])
def test_events_of_unknown_services_are_counted_not_folded(unknown: str) -> None:
    """As in the engine: an event for a service the policy does not name is counted and
    dropped."""
    fold = Fold(FoldSpec.of(make_policy()), topic="lat", partition=0, first=0)
    fold.observe([latency(T0, 5.0, service=unknown)], NO_CLOCK)
    assert fold.unknown == 1
    assert not fold.seal(1).latency


def test_a_fold_longer_than_a_window_keeps_every_interval() -> None:
    """A backlog read at full speed puts more than a window (30 s) of event time into one
    flush: every one of its intervals is in the flush, none recycled by the ring."""
    spec = FoldSpec.of(make_policy())
    fold = Fold(spec, topic="lat", partition=0, first=0)
    fold.observe([latency(T0 + s, 50.0) for s in range(100)], NO_CLOCK)
    fold.observe([latency(T0 + 10, 60.0)], NO_CLOCK)  # out of order, far behind the newest
    flush = fold.seal(101)
    assert sorted(c.slot - int(T0) for c in flush.latency) == sorted([*range(100), 10])
    assert sum(c.n for c in flush.latency) == 101
    # Two cells of one interval in one flush both count.
    decider = Engine(make_policy())
    merger = Merger(decider)
    merger.index(flush)
    merger.push([("serving/chat", int(T0) + 10)], [])
    assert decider.service_status(T0 + 10.5)[0].samples == 2
