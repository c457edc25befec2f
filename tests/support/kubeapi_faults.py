"""Scripted faults and the request log of the Kubernetes API test server.

A test scripts failures with ``server.faults.add(...)``: matching requests (by method and a regex
searched in the path) are answered with an error Status before the store is touched, so a fault
never changes state, unlike kmock's. A delay longer than the client's timeout simulates a
timeout; the client hanging up cancels the request, so it changes nothing either, unless
``commit=True`` asks for the awkward case: the write is made and only the answer is late.

Every request is logged as a ``LoggedRequest`` (method, path, query, decoded body, content type,
user agent, the status it got and whether its handler has ended), so a test can assert what the
controller sent and what it was told, and wait until no handler is left to change anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Fault", "Faults", "LoggedRequest"]


@dataclass(kw_only=True)
class Fault:
    """A scripted failure: requests matching ``method`` and ``path_regex`` get ``status``.

    ``delay`` seconds pass first (longer than the client's timeout simulates a timeout);
    ``status=None`` then serves the request normally. A client that gives up cancels the request,
    so nothing changes, unless ``commit=True``: the request is served at once and only the answer
    is delayed (the write happened, the client saw a timeout). ``times=None`` never runs out.
    """

    method: str | None
    path_regex: re.Pattern[str]
    status: int | None
    times: int | None
    delay: float
    message: str
    commit: bool = False
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.method in (None, method)) and bool(self.path_regex.search(path))


class Faults:
    """The scripted faults of one server, tried in the order they were added."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(
        self,
        *,
        method: str | None = None,
        path_regex: str = "",
        status: int | None = 500,
        times: int | None = 1,
        delay: float = 0.0,
        message: str = "injected fault",
        commit: bool = False,
    ) -> Fault:
        """Script a fault; returns it so a test can read ``hits``."""
        if commit and status is not None:
            raise ValueError("commit=True serves the request, so it takes status=None")
        fault = Fault(
            method=method.upper() if method else None,
            path_regex=re.compile(path_regex),
            status=status,
            times=times,
            delay=delay,
            message=message,
            commit=commit,
        )
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        self._faults.clear()

    def take(self, method: str, path: str) -> Fault | None:
        """The first live fault matching this request, counting one use of it."""
        for fault in self._faults:
            if fault.matches(method, path):
                fault.hits += 1
                if fault.times is not None and fault.hits >= fault.times:
                    self._faults.remove(fault)
                return fault
        return None


@dataclass
class LoggedRequest:
    """One request as the server saw it; ``status`` is filled in once answered, ``finished``
    once its handler has ended (answered, or cancelled because the client hung up first)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    status: int | None = None
    user_agent: str = ""
    """The client's ``User-Agent``: tells apart clients that send the same requests."""
    finished: bool = False
