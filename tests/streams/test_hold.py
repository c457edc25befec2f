"""The hold on ingest (:mod:`streams.hold`): released, held, bounded, off."""

from __future__ import annotations

import asyncio

import pytest

from streams.hold import IngestHold


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_waiting_on_a_released_hold_returns_at_once() -> None:
    hold = IngestHold(60)
    await asyncio.wait_for(hold.wait(), timeout=5)
    assert not hold.holding
    assert hold.overruns == 0


async def test_ingest_waits_while_held_and_goes_on_when_the_last_holder_leaves() -> None:
    hold = IngestHold(60)
    waiter: asyncio.Task[None] | None = None
    async with hold.held():
        async with hold.held():  # nested: the tick and something inside it
            waiter = asyncio.create_task(hold.wait())
            await turns()
        await turns()
        assert hold.holding
        assert not waiter.done()
    await asyncio.wait_for(waiter, timeout=5)
    assert not hold.holding
    assert hold.overruns == 0
    assert hold.held_s >= 0


async def test_a_hold_longer_than_max_s_lets_ingest_go_on_and_counts_one_overrun() -> None:
    hold = IngestHold(0.01)
    async with hold.held():
        await asyncio.wait_for(hold.wait(), timeout=5)  # ends at max_s, still held
        await asyncio.wait_for(hold.wait(), timeout=5)  # past max_s: at once
        assert hold.holding
    assert hold.overruns == 1


async def test_max_s_zero_turns_the_hold_off() -> None:
    hold = IngestHold(0)
    async with hold.held():
        assert not hold.holding
        await asyncio.wait_for(hold.wait(), timeout=5)
    assert hold.overruns == 0
    assert hold.held_s == 0


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_s"):
        IngestHold(-1)
