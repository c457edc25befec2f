"""The checkpoint handshake: tell a training pod it is about to be preempted, give it until a
deadline to write a checkpoint, then evict it — and count the GPU-hours the preemption wasted.

Opt-in per workload: pods carrying ``ebbtide.io/checkpoint-handshake: "true"`` (set it in the
pod template). The whole protocol lives in the pod's annotations, so a controller restart picks
it up where it was and never notifies or evicts twice, and the engine reads the notices on the
snapshot's pods (this module is pure: the engine and the Kubernetes actuator share it):

=========================================  ========  ==========================================
annotation                                 written by  meaning
=========================================  ========  ==========================================
``ebbtide.io/checkpoint-handshake``        user      ``"true"``: ask before evicting
``ebbtide.io/checkpoint-deadline-seconds`` user      how long to wait for the ack (default: the
                                                     policy's ``training.checkpoint.deadline``,
                                                     300 s)
``ebbtide.io/preemption-notice``           Ebbtide   RFC 3339 time the notice was given
``ebbtide.io/preemption-for``              Ebbtide   the need (service) the notice was given for
``ebbtide.io/checkpoint-ack``              workload  RFC 3339 time of the checkpoint written
                                                     after the notice: evict now
``ebbtide.io/last-checkpoint``             workload  RFC 3339 time of its latest checkpoint
                                                     (optional; for the waste figure)
=========================================  ========  ==========================================

While the notice stands and neither the ack nor the deadline has come, the eviction is
``BLOCKED`` (like a PodDisruptionBudget's "not now": the pod is tried again after a hold-off).

**A notice expires** :data:`GRACE_S` after its deadline: by then the engine, had it still
needed the GPUs, would have evicted (it tries a blocked pod again a minute later), so the
preemption was abandoned. An expired notice is no notice: the next preemption, however much
later, gives a fresh one and waits again (an ack, however recent, only counts against the
notice standing), and the Kubernetes actuator removes an expired notice, its need and its ack
from the pod (:meth:`controller.kube.actuator.KubeActuator.expire_notices`).

**One noticed victim per need at a time** (:class:`Notices`): while a need's notice stands, its
plans give no other pod a notice (they may still evict pods that need none); a plan gives at most
one. Without this a breach noticed a new pod at every try while the first one's checkpoint was
being written.

Wasted GPU-hours = the pod's GPUs times hours since its last checkpoint (the ack, else
``last-checkpoint``, else the pod's start): the work a restart from that checkpoint redoes.

**Restart-aware resizing** reads the same annotations: :func:`since_checkpoint` is the work a
restart would redo now (from the latest checkpoint the pods report, else estimated from when
the job last (re)started and the policy's ``training.restarts.checkpointEvery``), and
:func:`next_checkpoint` when the next one is due (only when the pods report one), so a grow can
wait until just after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

__all__ = [
    "ACK",
    "DEADLINE",
    "DEFAULT_DEADLINE_S",
    "FOR",
    "GRACE_S",
    "HANDSHAKE",
    "LAST_CHECKPOINT",
    "NOTICE",
    "Notice",
    "Notices",
    "Step",
    "next_checkpoint",
    "next_step",
    "notice",
    "opted_in",
    "reported_checkpoint",
    "since_checkpoint",
    "stamp",
    "standing",
    "wasted_gpu_hours",
]

HANDSHAKE: Final = "ebbtide.io/checkpoint-handshake"
DEADLINE: Final = "ebbtide.io/checkpoint-deadline-seconds"
NOTICE: Final = "ebbtide.io/preemption-notice"
FOR: Final = "ebbtide.io/preemption-for"
ACK: Final = "ebbtide.io/checkpoint-ack"
LAST_CHECKPOINT: Final = "ebbtide.io/last-checkpoint"
DEFAULT_DEADLINE_S: Final = 300.0
#: How long after its deadline a notice still stands: five hold-offs of the engine's retry, so
#: a preemption still wanted evicts well within it, and one abandoned is cleared soon after.
GRACE_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class Step:
    """What the eviction does next: ``evict`` now, ``notify`` the pod, or ``wait``."""

    action: Literal["evict", "notify", "wait"]
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Notice:
    """A preemption notice on a pod: when it was given, its deadline, and for which need."""

    at: float
    deadline: float
    need: str | None

    @property
    def expires(self) -> float:
        """From then on the notice no longer stands (the preemption was abandoned)."""
        return self.deadline + GRACE_S


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


def opted_in(annotations: Mapping[str, str]) -> bool:
    """The pod asks for the checkpoint handshake before it is evicted."""
    return (annotations.get(HANDSHAKE) or "").strip().lower() == "true"


def notice(annotations: Mapping[str, str], *, deadline_s: float) -> Notice | None:
    """The notice ``annotations`` carry (standing or not), or ``None``."""
    at = _epoch(annotations.get(NOTICE))
    if at is None:
        return None
    return Notice(at, at + _deadline_s(annotations, deadline_s), annotations.get(FOR) or None)


def standing(
    annotations: Mapping[str, str], *, now: float, deadline_s: float = DEFAULT_DEADLINE_S
) -> Notice | None:
    """The notice of an opted-in pod that still stands at ``now`` (not expired), or ``None``."""
    if not opted_in(annotations):
        return None
    found = notice(annotations, deadline_s=deadline_s)
    return found if found is not None and now < found.expires else None


def next_step(
    annotations: Mapping[str, str], *, now: float, deadline_s: float = DEFAULT_DEADLINE_S
) -> Step:
    """The handshake's next step for a pod with ``annotations`` at ``now``; ``deadline_s``
    (the policy's) applies unless the pod's :data:`DEADLINE` annotation says otherwise. An
    expired notice (and any ack of it) counts for nothing: a fresh notice is given. Pure."""
    if not opted_in(annotations):
        return Step("evict")
    wait_s = _deadline_s(annotations, deadline_s)
    given = standing(annotations, now=now, deadline_s=deadline_s)
    if given is None:
        fresh = f"preemption notice given; checkpoint within {wait_s:g}s"
        if annotations.get(NOTICE):
            fresh += f" (the notice of {annotations[NOTICE]} had expired)"
        return Step("notify", fresh)
    acked = _epoch(annotations.get(ACK))
    if acked is not None and acked >= given.at:
        return Step("evict", f"checkpoint acknowledged at {annotations[ACK]}")
    if now >= given.deadline:
        return Step("evict", f"no checkpoint acknowledged by the deadline {stamp(given.deadline)}")
    return Step("wait", f"waiting for a checkpoint acknowledgement until {stamp(given.deadline)}")


@dataclass(frozen=True, slots=True)
class Notices:
    """What a plan for one need knows of the handshake: which pods an eviction would give a
    notice (opted in, none standing), and whether a pod's standing notice is this need's."""

    need: str
    now: float
    deadline_s: float

    def asks(self, annotations: Mapping[str, str]) -> bool:
        """Evicting this pod would first give it a notice."""
        return (
            opted_in(annotations)
            and standing(annotations, now=self.now, deadline_s=self.deadline_s) is None
        )

    def ours(self, annotations: Mapping[str, str]) -> bool:
        """The pod carries a standing notice given for this need."""
        given = standing(annotations, now=self.now, deadline_s=self.deadline_s)
        return given is not None and given.need == self.need


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


def reported_checkpoint(annotations: Iterable[Mapping[str, str]]) -> float | None:
    """The latest checkpoint (ack or ``last-checkpoint``) any of a job's pods reports, epoch
    seconds; ``None`` when none reports one. A DDP job checkpoints as one program, so the
    newest report of any worker is the job's."""
    times = [
        t
        for a in annotations
        for t in (_epoch(a.get(ACK)), _epoch(a.get(LAST_CHECKPOINT)))
        if t is not None
    ]
    return max(times, default=None)


def since_checkpoint(
    annotations: Iterable[Mapping[str, str]], *, started: float, now: float, every: float
) -> float:
    """Seconds of work a restart at ``now`` redoes: since the checkpoint the pods report, else
    since the last checkpoint of one taken every ``every`` seconds from ``started`` (when the
    job last (re)started)."""
    reported = reported_checkpoint(annotations)
    if reported is not None:
        return max(0.0, now - reported)
    return max(0.0, now - started) % every


def next_checkpoint(annotations: Iterable[Mapping[str, str]], *, every: float) -> float | None:
    """When the job's next checkpoint is due: ``every`` after the one its pods report (``None``
    when they report none: an estimate is no reason to wait)."""
    reported = reported_checkpoint(annotations)
    return None if reported is None else reported + every
