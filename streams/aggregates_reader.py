"""A decider's reader of the aggregates topic: from a point in time, then following, never
skipping a flush.

Every decider replica reads the whole topic without a consumer group (it is small: a few
messages per second per source partition), so a follower's windows are as warm as the leader's.
Unlike :meth:`streams.capture.TopicReader.since` it hands flushes over as they come rather than
collecting the catch-up first, and it keeps what it reads whatever its timestamp: a partition
with nothing after the start time starts at the end offset *listed at that moment*, so no flush
published in between is skipped. Reading a flush twice is harmless (a re-sent flush replaces its
predecessor), skipping one is not, so where this broker lists a too-low end offset the reader
only re-reads.
"""

from __future__ import annotations

from collections.abc import Callable

from streams.capture import TopicReader

__all__ = ["AggregatesReader"]


class AggregatesReader(TopicReader):
    """Reads the topic from ``since_s`` on and hands each value to a callback until
    cancelled; :attr:`caught_up` once a fetch found nothing new after the start."""

    async def run(self, since_s: float, on_value: Callable[[bytes], None]) -> None:
        await self.start()
        consumer, partitions = self._consumer, self._partitions
        try:
            # Ends first: a flush published after the listing lies at or past the end listed;
            # one published before it with a later timestamp is found by time.
            ends = await consumer.end_offsets(partitions)
            found = await consumer.offsets_for_times({tp: int(since_s * 1000) for tp in partitions})
            for tp in partitions:
                at = found.get(tp)
                consumer.seek(tp, ends[tp] if at is None or at.timestamp < 0 else at.offset)
            await self.follow(on_value)
        finally:
            await self.stop()
