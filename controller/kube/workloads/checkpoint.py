"""The checkpoint handshake: tell a training pod it is about to be preempted, give it until a
deadline to write a checkpoint, then evict it — and count the GPU-hours the preemption wasted.

Opt-in per workload: pods carrying ``ebbtide.io/checkpoint-handshake: "true"`` (set it in the
pod template). The whole protocol lives in the pod's annotations, so a controller restart picks
it up where it was and never notifies or evicts twice:

=========================================  ========  ==========================================
annotation                                 written by  meaning
=========================================  ========  ==========================================
``ebbtide.io/checkpoint-handshake``        user      ``"true"``: ask before evicting
``ebbtide.io/checkpoint-deadline-seconds`` user      how long to wait for the ack (default: the
                                                     policy's ``training.checkpoint.deadline``,
                                                     300 s)
``ebbtide.io/preemption-notice``           Ebbtide   RFC 3339 time the notice was given
``ebbtide.io/checkpoint-ack``              workload  RFC 3339 time of the checkpoint written
                                                     after the notice: evict now
``ebbtide.io/last-checkpoint``             workload  RFC 3339 time of its latest checkpoint
                                                     (optional; for the waste figure)
=========================================  ========  ==========================================

While the notice stands and neither the ack nor the deadline has come, the eviction is
``BLOCKED`` (like a PodDisruptionBudget's "not now": the engine tries another victim, then this
one again). Wasted GPU-hours = the pod's GPUs times hours since its last checkpoint (the ack, else
``last-checkpoint``, else the pod's start): the work a restart from that checkpoint redoes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

__all__ = [
    "ACK",
    "DEADLINE",
    "DEFAULT_DEADLINE_S",
    "HANDSHAKE",
    "LAST_CHECKPOINT",
    "NOTICE",
    "Step",
    "next_step",
    "stamp",
    "wasted_gpu_hours",
]

HANDSHAKE: Final = "ebbtide.io/checkpoint-handshake"
DEADLINE: Final = "ebbtide.io/checkpoint-deadline-seconds"
NOTICE: Final = "ebbtide.io/preemption-notice"
ACK: Final = "ebbtide.io/checkpoint-ack"
LAST_CHECKPOINT: Final = "ebbtide.io/last-checkpoint"
DEFAULT_DEADLINE_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class Step:
    """What the eviction does next: ``evict`` now, ``notify`` the pod, or ``wait``."""

    action: Literal["evict", "notify", "wait"]
    detail: str = ""


def stamp(epoch: float) -> str:
    """RFC 3339 UTC, whole seconds (what annotations carry)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _deadline_s(annotations: Mapping[str, str], default_s: float) -> float:
    try:
        return max(0.0, float(annotations.get(DEADLINE, default_s)))
    except ValueError:
        return default_s


def next_step(
    annotations: Mapping[str, str], *, now: float, deadline_s: float = DEFAULT_DEADLINE_S
) -> Step:
    """The handshake's next step for a pod with ``annotations`` at ``now``; ``deadline_s``
    (the policy's) applies unless the pod's :data:`DEADLINE` annotation says otherwise. Pure."""
    if (annotations.get(HANDSHAKE) or "").strip().lower() != "true":
        return Step("evict")
    wait_s = _deadline_s(annotations, deadline_s)
    noticed = _epoch(annotations.get(NOTICE))
    if noticed is None:
        return Step("notify", f"preemption notice given; checkpoint within {wait_s:g}s")
    acked = _epoch(annotations.get(ACK))
    if acked is not None and acked >= noticed:
        return Step("evict", f"checkpoint acknowledged at {annotations[ACK]}")
    deadline = noticed + wait_s
    if now >= deadline:
        return Step("evict", f"no checkpoint acknowledged by the deadline {stamp(deadline)}")
    return Step("wait", f"waiting for a checkpoint acknowledgement until {stamp(deadline)}")


def wasted_gpu_hours(
    annotations: Mapping[str, str], gpus: int, *, started: str | None, now: float
) -> float:
    """GPU-hours a restart from the latest checkpoint redoes: ``gpus`` times hours since the ack,
    else ``last-checkpoint``, else ``started`` (RFC 3339; 0 when none is known)."""
    since = (
        _epoch(annotations.get(ACK)) or _epoch(annotations.get(LAST_CHECKPOINT)) or _epoch(started)
    )
    if since is None or gpus <= 0:
        return 0.0
    return gpus * max(0.0, now - since) / 3600.0
