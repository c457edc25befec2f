"""The inference servers the scraper knows, one module each, and custom ones from a file."""

from pathlib import Path

from controller.agent.servers.dcgm import DCGM
from controller.agent.servers.kind import KindsError, LatencySource, ServerKind, load_kinds
from controller.agent.servers.kserve import KSERVE
from controller.agent.servers.sglang import SGLANG
from controller.agent.servers.tgi import TGI
from controller.agent.servers.triton import TRITON
from controller.agent.servers.vllm import VLLM

__all__ = ["BUILTIN", "KindsError", "LatencySource", "ServerKind", "known_kinds", "load_kinds"]

BUILTIN: dict[str, ServerKind] = {k.name: k for k in (VLLM, SGLANG, TGI, TRITON, KSERVE, DCGM)}
"""Built-in kinds by name; a custom kind of the same name replaces one."""


def known_kinds(path: Path | None = None) -> dict[str, ServerKind]:
    """The built-in kinds, with those of the file at ``path`` added (or replacing one of the
    same name); :class:`KindsError` when the file cannot be used."""
    kinds = dict(BUILTIN)
    if path is not None:
        kinds.update((k.name, k) for k in load_kinds(path))
    return kinds
