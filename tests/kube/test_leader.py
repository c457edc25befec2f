"""Leader election over a Lease on the test API server: one leader, fenced, fast takeover."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from controller.kube.leader import LeaderElector, LeaseSettings
from support.kubeapi import KubeAPIServer, LoggedRequest

FAST = LeaseSettings(
    name="ebbtide", namespace="ebbtide-system", lease_duration_s=2, renew_deadline_s=1.5,
    retry_period_s=1.0,
)  # fmt: skip


async def wait_for(predicate: object, within: float = 10.0) -> float:
    """Wait until ``predicate()`` is true; return how long it took."""
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - started < within, "condition not reached in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def lease_requests(server: KubeAPIServer, user_agent: str) -> list[LoggedRequest]:
    """The Lease requests one client (by its User-Agent) has sent so far."""
    return [r for r in server.requests if r.user_agent == user_agent and "/leases" in r.path]


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_settings_must_be_ordered() -> None:
    """A renew deadline at or past the lease duration would let two leaders overlap."""
    with pytest.raises(ValueError, match="renew deadline 5s, lease 5s"):
        LeaseSettings(lease_duration_s=5, renew_deadline_s=5, retry_period_s=1)


async def test_fencing_counts_from_when_the_renewal_was_sent(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """A lease write whose answer is slow fences from when it was *sent*: time spent waiting for
    the answer counts against the renew deadline, so a late answer cannot extend leadership."""
    now = [0.0]
    leading = asyncio.Event()
    elector = LeaderElector(
        kube_client,
        identity="a",
        settings=FAST,
        on_change=lambda on: leading.set() if on else None,
        clock=lambda: now[0],
    )
    kubeapi.faults.add(method="POST", path_regex="leases", status=None, delay=0.2, commit=True)
    task = asyncio.create_task(elector.run())
    try:
        await kubeapi.until(
            lambda: bool(kubeapi.requests_matching(method="POST", path_regex="leases"))
        )
        now[0] = 1.0  # the acquiring write took a second to answer
        await asyncio.wait_for(leading.wait(), 5)
        now[0] = FAST.renew_deadline_s + 0.1  # past the deadline counted from the send
        assert not elector.is_leader
    finally:
        await stop(task)


@pytest.mark.slow
async def test_one_leader_and_takeover_within_the_lease(kubeapi: KubeAPIServer) -> None:
    """Of two replicas exactly one leads; when it dies the other leads within the lease
    duration, and at no sampled instant do both act."""
    async with (
        ApiClient(Configuration(host=kubeapi.url)) as api_a,
        ApiClient(Configuration(host=kubeapi.url)) as api_b,
    ):
        api_b.user_agent = "b"  # to tell b's requests apart in the server's log
        a = LeaderElector(api_a, identity="a", settings=FAST)
        b = LeaderElector(api_b, identity="b", settings=FAST)
        both = 0

        async def watch() -> None:
            nonlocal both
            while True:
                both += a.is_leader and b.is_leader
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        task_a = asyncio.create_task(a.run())
        await wait_for(lambda: a.is_leader)
        task_b = asyncio.create_task(b.run())
        # b looks at the lease every retry period; its third look comes a full lease duration
        # after its first, so it would take a lease a had stopped renewing. Its fourth request
        # shows that third attempt over: b has not written the lease, nor does it lead.
        await kubeapi.until(lambda: len(lease_requests(kubeapi, "b")) >= 4)
        assert [r.method for r in lease_requests(kubeapi, "b")] == ["GET"] * 4
        assert a.is_leader
        assert not b.is_leader
        lease = kubeapi.get("Lease", "ebbtide-system", "ebbtide")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "a"

        await stop(task_a)  # the leader dies without releasing the lease
        assert not a.is_leader
        took = await wait_for(lambda: b.is_leader)
        assert took <= FAST.lease_duration_s + 2 * FAST.retry_period_s + 0.5
        await stop(task_b)
        await stop(watcher)
        assert both == 0


@pytest.mark.slow
async def test_a_leader_that_cannot_renew_stops_acting_before_the_lease_ends(
    kubeapi: KubeAPIServer, kube_client: ApiClient
) -> None:
    """When renewals fail (API errors), is_leader turns false within the renew deadline —
    before anyone else may take the lease."""
    changes: list[bool] = []
    elector = LeaderElector(kube_client, identity="a", settings=FAST, on_change=changes.append)
    task = asyncio.create_task(elector.run())
    await wait_for(lambda: elector.is_leader)
    kubeapi.faults.add(path_regex="leases", status=500, times=10_000)
    lost_after = await wait_for(lambda: not elector.is_leader, within=5)
    assert lost_after <= FAST.renew_deadline_s + FAST.retry_period_s + 0.2
    await stop(task)
    assert changes[0] is True
