"""The inference servers the scraper knows, one module each, and custom ones from a file."""

from controller.agent.servers.kind import KindsError, LatencySource, ServerKind, load_kinds
from controller.agent.servers.kserve import KSERVE
from controller.agent.servers.sglang import SGLANG
from controller.agent.servers.tgi import TGI
from controller.agent.servers.triton import TRITON
from controller.agent.servers.vllm import VLLM

__all__ = ["BUILTIN", "KindsError", "LatencySource", "ServerKind", "load_kinds"]

BUILTIN: dict[str, ServerKind] = {k.name: k for k in (VLLM, SGLANG, TGI, TRITON, KSERVE)}
"""Built-in kinds by name; a custom kind of the same name replaces one."""
