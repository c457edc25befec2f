"""Reads of the engine's state that only tests make.

The controller never asks these questions (metrics read :meth:`Engine.pool_status` and
:meth:`Engine.budget_states`; a reload goes through the loader and :meth:`Engine.reload`), so
they live here rather than widening the engine's surface. They read its private state on
purpose: what they check is that state.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.engine import Engine, ReloadResult
from policies.loader import Source, check_policy

__all__ = ["cooldown_remaining", "gpu_utilization", "last_stepped", "reload_sources"]


def reload_sources(engine: Engine, sources: Sequence[Source]) -> ReloadResult:
    """Load, validate and adopt policy text; on any error the current policy stays."""
    policy, errors = check_policy(sources)
    if errors or policy is None:
        return ReloadResult(False, tuple(str(e) for e in errors))
    return engine.reload(policy)


def gpu_utilization(engine: Engine, now: float) -> dict[str, float | None]:
    """Windowed mean utilization per GPU (``node/gpu``), sorted by key."""
    windows = engine._intake.gpu_windows
    return {k: windows[k].mean(now) for k in sorted(windows)}


def cooldown_remaining(engine: Engine, service_key: str, now: float) -> float:
    """Seconds before ``service_key`` may be acted for again."""
    cooldown = engine._services[service_key].spec.cooldown
    if cooldown is None:
        cooldown = engine.policy.spec.cooldowns.service
    return engine._decide.cooldowns.remaining_s(service_key, now, cooldown)


def last_stepped(engine: Engine, service_key: str) -> float:
    """When ``service_key``'s SLO was last stepped (``-inf`` before its first step)."""
    return engine._services[service_key].ticked_at
