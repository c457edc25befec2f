"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the leader actuates.

Built on ``kubernetes_asyncio.leaderelection`` (client-go's algorithm: acquire when the holder's
lease is observed unrenewed for ``lease_duration``; renew every ``retry_period``; give up after
failing to renew for ``renew_deadline``). What this module adds is the fencing the actuators
need: :attr:`LeaderElector.is_leader` is true only while the last *successful* renewal is younger
than ``renew_deadline``, read from the monotonic clock at the moment of the check. A renewal is
dated when its request was *sent*, not when the answer came back: the lease the server stored is
only as new as the write, and an answer delayed by a slow network or apiserver must not stretch
the leader's time beyond what other replicas observe. Because
``renew_deadline < lease_duration``, a leader that cannot renew stops acting before any other
replica can possibly acquire the lease, even if the election loop itself is stuck: at no time do
two replicas act. Followers keep running (consuming, evaluating) so their state is warm when they
take over, which happens within ``lease_duration`` of the leader's last renewal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

__all__ = ["LeaderElector", "LeaseSettings"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """The Lease and its timing (client-go's defaults: 15 s / 10 s / 2 s)."""

    name: str = "ebbtide-controller"
    namespace: str = "ebbtide-system"
    lease_duration_s: int = 15
    """How long a lease lasts unrenewed before another replica may take it (whole seconds:
    the Lease's ``leaseDurationSeconds``)."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps trying to renew before it steps down; < lease duration."""
    retry_period_s: float = 2.0
    """How often candidates try to acquire and the leader renews."""

    def __post_init__(self) -> None:
        # The library's own rules (it jitters the retry period by up to 1.2x).
        if not (
            self.retry_period_s >= 1
            and 1.2 * self.retry_period_s < self.renew_deadline_s < self.lease_duration_s
        ):
            raise ValueError(
                "leader election needs 1s <= retry period, 1.2 x retry period < renew deadline "
                f"< lease duration; got retry {self.retry_period_s}s, renew deadline "
                f"{self.renew_deadline_s}s, lease {self.lease_duration_s}s"
            )


class _FencedElection(leaderelection.LeaderElection):
    """The library's election, noting when each successful acquire or renewal was sent."""

    def __init__(
        self,
        config: electionconfig.Config,
        *,
        on_renew: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        super().__init__(config)
        self._on_renew = on_renew
        self._clock = clock

    async def try_acquire_or_renew(self) -> bool:
        sent = self._clock()
        ok: bool = await super().try_acquire_or_renew()
        if ok:
            self._on_renew(sent)
        return ok


class LeaderElector:
    """Campaigns for the lease forever; :attr:`is_leader` says whether to act right now."""

    def __init__(
        self,
        api: ApiClient,
        *,
        identity: str,
        settings: LeaseSettings | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.settings = settings or LeaseSettings()
        self._api = api
        self._on_change = on_change
        self._clock = clock
        self._leading = False
        self._renewed_at = -float("inf")

    @property
    def is_leader(self) -> bool:
        """True only while this replica holds a lease renewed within the renew deadline."""
        fresh = self._clock() - self._renewed_at < self.settings.renew_deadline_s
        return self._leading and fresh

    def _renewed(self, sent: float) -> None:
        self._renewed_at = sent

    def _set(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            log.info("leader.changed", identity=self.identity, leading=leading)
            if self._on_change is not None:
                self._on_change(leading)

    async def run(self) -> None:
        """Campaign, lead until the lease is lost, campaign again; until cancelled."""
        s = self.settings
        lock = LeaseLock(s.name, s.namespace, self.identity, self._api)
        lost = asyncio.Event()
        leading: set[asyncio.Task[object]] = set()

        async def started() -> None:
            # The library runs this in a task of its own and cancels it when renewal fails;
            # keep hold of it so that cancelling run() does not leave it behind.
            if (task := asyncio.current_task()) is not None:
                leading.add(task)
                task.add_done_callback(leading.discard)
            self._set(True)
            await lost.wait()

        async def stopped() -> None:
            self._set(False)

        while True:
            config = electionconfig.Config(
                lock, s.lease_duration_s, s.renew_deadline_s, s.retry_period_s, started, stopped
            )
            try:
                await _FencedElection(config, on_renew=self._renewed, clock=self._clock).run()
            except asyncio.CancelledError:
                self._set(False)
                for task in leading:
                    task.cancel()
                await asyncio.gather(*leading, return_exceptions=True)
                raise
            except Exception:
                # An API error the library did not handle: step down, wait, campaign again.
                self._set(False)
                log.exception("leader.election_failed", identity=self.identity)
            await asyncio.sleep(s.retry_period_s)
