"""Each package's own exceptions share one base: StreamsError, PoliciesError, ControllerError.

A newcomer (or a caller) catches one name per layer; leaves keep their builtins (see
tests/streams/test_errors.py for the wire's tree).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import controller
import policies
import streams
from controller.controller_errors import ControllerError
from policies.policy_errors import PoliciesError
from streams.stream_errors import StreamsError


def _own_exceptions(package: ModuleType) -> list[str]:
    """Public exception classes defined in the package's modules (not imported into them)."""
    found = []
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, BaseException)
                and cls.__module__ == info.name
                and not name.startswith("_")
            ):
                found.append(f"{info.name}.{name}")
    return found


def _cls(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


@pytest.mark.parametrize(
    ("package", "base"),
    [(streams, StreamsError), (policies, PoliciesError), (controller, ControllerError)],
    ids=["streams", "policies", "controller"],
)
def test_every_exception_a_package_defines_derives_from_its_base(
    package: ModuleType, base: type
) -> None:
    """No public exception class in the package stands outside its one base."""
    own = _own_exceptions(package)
    assert own, "the walk found the package's exceptions"
    assert [e for e in own if not issubclass(_cls(e), base)] == []
