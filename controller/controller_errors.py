"""What the controller raises for failures a caller may handle: one base, :class:`ControllerError`.

Each leaf lives beside the code that raises it (a config file, a scenario, the node agent's
NVML and pod-resources readers, the metrics server) and keeps the builtin it has always been
(``ValueError`` for a refused file, ``ConnectionError`` for a port that cannot be served), so
the CLI's one-line user errors and existing handlers still catch them.
"""

from __future__ import annotations

__all__ = ["ControllerError"]


class ControllerError(Exception):
    """A failure of the controller shell a caller can act on (a bad file, an unusable device)."""
