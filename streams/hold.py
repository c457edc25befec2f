"""A hold on ingest while a decision is made and carried out.

One process, one event loop: the consumer's fetch and hand-over tasks and the tick that decides
and issues the API calls share it. Under a backlog the loop is never idle, so each step of a
decision being carried out (the intent's write-ahead acknowledgement, the API server's answer)
waits for a turn behind batches of background events, and the reaction to the event that tipped
a service grows with the background rate. The tick takes the hold for the time it decides and
issues; meanwhile the consumer neither fetches nor hands over, so the loop has only the
decision's own I/O to run. Events are not lost, only held in the broker and the client's buffers
a little longer.

The hold is bounded: ingest waits at most ``max_s`` from the moment the hold was taken, then goes
on whatever the tick is doing (an API server that hangs must not stop the windows from filling),
and counts an overrun. ``max_s = 0`` turns the hold off.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["IngestHold"]


class IngestHold:
    """Taken by the decision path (:meth:`held`), waited on by ingest (:meth:`wait`)."""

    def __init__(self, max_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_s < 0:
            raise ValueError(f"max_s must be >= 0, not {max_s}")
        self.max_s = max_s
        self.overruns = 0
        """Holds that outlasted ``max_s`` while ingest waited on them."""
        self.held_s = 0.0
        """Seconds the hold was taken in all (enabled holds only)."""
        self._clock = clock
        self._released = asyncio.Event()
        self._released.set()
        self._since = 0.0
        self._depth = 0
        self._overrun_counted = False

    @property
    def holding(self) -> bool:
        return not self._released.is_set()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold ingest for the body; nested or concurrent holds end with the last of them."""
        if self.max_s == 0:
            yield
            return
        if self._depth == 0:
            self._since = self._clock()
            self._overrun_counted = False
            self._released.clear()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.held_s += self._clock() - self._since
                self._released.set()

    async def wait(self) -> None:
        """Return once the hold is released, or ``max_s`` after it was taken."""
        if not self.holding:
            return
        left = self._since + self.max_s - self._clock()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._released.wait()
        if self.holding and not self._overrun_counted:
            self._overrun_counted = True
            self.overruns += 1
