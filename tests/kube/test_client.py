"""controller/kube/client.py: the retrying API call."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from controller.kube.client import Forbidden, KubeError, Transient, call, translate


async def test_a_cancellation_that_races_the_answer_is_not_swallowed() -> None:
    """The answer and a cancellation arriving in the same loop turn still cancel the caller.
    ``asyncio.wait_for`` in Python 3.11 returned the answer instead, so an informer whose LIST
    came back as it was being stopped carried on, and shutdown hung."""
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(call(lambda: answer))
    await asyncio.sleep(0)  # the call is now waiting for the answer
    answer.set_result(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_past_its_timeout_is_a_transient_failure_and_retried() -> None:
    attempts = 0

    async def slow_then_fast() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await asyncio.sleep(1)
        return "ok"

    assert await call(slow_then_fast, timeout_s=0.01) == "ok"
    assert attempts == 2
    with pytest.raises(Transient, match="transport"):
        await call(lambda: asyncio.sleep(1), attempts=1, timeout_s=0.01)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ('{"message": "pods \\"p\\" is forbidden: User \\"x\\" cannot patch"}', Forbidden),
        (
            '{"message": "admission webhook \\"vjobset.kb.io\\" denied the request: '
            'spec.replicatedJobs: Invalid value: 1: field is immutable"}',
            KubeError,
        ),
    ],
    ids=["rbac", "webhook-denial"],
)
def test_a_403_is_rbac_only_when_no_admission_webhook_denied_it(
    body: str, kind: type[KubeError]
) -> None:
    """RBAC's 403 is :class:`Forbidden` (the chart's roles are wrong); a validating webhook's
    denial is also a 403, but the object's rules refused it, so it is a plain KubeError."""
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = body
    got = translate(exc)
    assert type(got) is kind
    assert got.status == 403
