"""What the scraper reads from one kind of inference server: a :class:`ServerKind`.

Built-in kinds live one per module beside this one (as KEDA keeps one scaler per file), each
taken from the server's own source, which the module cites; :func:`load_kinds` reads more from
the agent's config file, in the same shape, so a server Ebbtide does not know needs no code.

Names are the **sample names as exposed** (``vllm:generation_tokens_total``, with a counter's
``_total``), except latency histograms, which are named by family (``vllm:e2e_request_latency_
seconds``, without ``_bucket``). Where a server renamed a metric, list both names: the first one
present in a scrape is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from controller.controller_errors import ControllerError
from streams.events import Objective

__all__ = ["KindsError", "LatencySource", "ServerKind", "load_kinds"]

_Names = tuple[Annotated[str, Field(min_length=1)], ...]


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class LatencySource(_Frozen):
    """A latency histogram and what it measures."""

    metric: str
    """The histogram family's name."""
    objective: Objective
    unit_ms: Annotated[float, Field(gt=0)] = 1000.0
    """Milliseconds per unit of the bucket bounds (1000 for seconds, 0.001 for microseconds)."""


class ServerKind(_Frozen):
    """How to read one kind of server."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]
    port: Annotated[int, Field(ge=1, le=65535)]
    """Where its metrics are served by default (a pod annotation can say otherwise)."""
    path: str = "/metrics"
    source: str = ""
    """Where the names come from (a file of the server's source, or its docs)."""
    role: Literal["inference", "gpu"] = "inference"
    """``gpu``: a GPU exporter (dcgm-exporter), read into ``gpu.utilization`` events by its
    own module rather than through the fields below."""
    gauges: _Names = ()
    """More samples to read (a ``gpu`` kind's)."""
    latency: tuple[LatencySource, ...] = ()
    """Latency histograms; for each objective the first one present is used."""
    waiting: _Names = ()
    """Gauges of queued requests; the first present is used, summed over its series."""
    running: _Names = ()
    """Gauges of requests being served."""
    kv_cache: _Names = ()
    """Gauges of the KV-cache usage."""
    kv_cache_scale: Annotated[float, Field(gt=0)] = 100.0
    """Percent per unit of the KV-cache gauge (100 for a 0 to 1 fraction)."""
    kv_cache_reduce: Literal["max", "mean"] = "max"
    """How series of the KV-cache gauge combine (one per engine): the fullest, or their mean."""
    requests: _Names = ()
    """Counters of finished requests (their rate is the request rate)."""
    tokens: _Names = ()
    """Counters of generated tokens."""
    prompt_tokens: _Names = ()
    """Counters of prompt tokens."""

    def histogram_names(self) -> set[str]:
        return {source.metric for source in self.latency}

    def value_names(self) -> set[str]:
        return {
            *self.gauges,
            *self.waiting,
            *self.running,
            *self.kv_cache,
            *self.requests,
            *self.tokens,
            *self.prompt_tokens,
        }


class KindsError(ControllerError, ValueError):
    """The agent's server-kinds file cannot be used; the message says where and why."""


class _KindsFile(_Frozen):
    kinds: tuple[ServerKind, ...]


def load_kinds(path: Path) -> tuple[ServerKind, ...]:
    """Server kinds from a YAML file ``{kinds: [{name, port, latency: [...], ...}]}``, keys
    in camelCase as in policies (``kvCacheScale``); docs/servers/custom.md has an example."""
    try:
        raw = YAML(typ="safe").load(path.read_text())
    except (OSError, YAMLError) as exc:
        raise KindsError(f"{path}: {exc}") from exc
    try:
        return _KindsFile.model_validate(raw).kinds
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise KindsError(f"{path}: {where}: {first['msg']}") from exc
