"""Running a command's coroutine: one event loop, Ctrl-C as a clean stop, errors as one line.

Exceptions that mean "the user's input or environment is wrong" become a
:class:`click.ClickException` (one line, exit 1). Anything else is a bug and keeps its traceback.

Nothing here imports :mod:`controller.kube`: it pulls in kubernetes_asyncio (hundreds of
modules, slow to import), which only ``run --cluster kube`` needs; ``ebbtide --version`` must
not pay for it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from streams.stream_errors import BrokerError

__all__ = ["UserError", "run_async", "stop_on_signals"]

T = TypeVar("T")

#: Errors a user can act on: an unreachable service, a missing or unreadable file, bad input
#: (and a bad kubeconfig: see :func:`_user_errors`).
UserError: tuple[type[Exception], ...] = (
    ConnectionError,
    BrokerError,
    FileNotFoundError,
    PermissionError,
    ValueError,
)


def _user_errors() -> tuple[type[Exception], ...]:
    """:data:`UserError`, plus ``KubeConfigError`` once its module is loaded (if it is not,
    none can have been raised, and importing it would cost every command kubernetes_asyncio)."""
    kube = sys.modules.get("controller.kube.client")
    return (*UserError, kube.KubeConfigError) if kube is not None else UserError


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise click.Abort() from None
    except Exception as exc:
        if isinstance(exc, _user_errors()):
            raise click.ClickException(str(exc)) from exc
        raise


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGINT or SIGTERM (what Ctrl-C, ``timeout``, systemd
    and container runtimes send), so a command finishes what it is writing and exits 0
    instead of dying mid-write or printing ``Aborted!``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
