"""Settings of ``ebbtide run``, grouped, from flags, environment and a config file.

Precedence, highest first: command-line flags, environment variables (``EBBTIDE_`` prefix, ``__``
between a group and its field: ``EBBTIDE_KAFKA__BOOTSTRAP``), the YAML file given with
``--config`` (or ``EBBTIDE_CONFIG``), then the defaults here. Secrets (the SASL password) come
from the environment or from a file (``sasl_password_file``, e.g. a mounted Secret) and are
:class:`~pydantic.SecretStr`: they never appear in a ``repr``, a log line or an error.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from controller.controller_errors import ControllerError
from controller.kube.kube_settings import DEFAULT_WORKLOAD_KINDS, KubeSettings, WorkloadKindName
from policies.model import Policy
from streams.connection import KafkaConfig, Secret
from streams.events import INFERENCE_LOAD, LOAD_TOPIC, Limits

__all__ = [
    "DEFAULT_WORKLOAD_KINDS",
    "ConfigFileError",
    "HttpSettings",
    "KafkaSettings",
    "KubeSettings",
    "Settings",
    "ShardSettings",
    "WarmStartSettings",
    "WorkloadKindName",
]


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Group):
    """Where events come from and where decisions and rejects go."""

    bootstrap: str = "127.0.0.1:9092"
    """Comma-separated ``host:port`` list."""
    rewind_margin_s: float = Field(30.0, ge=0)
    """No consumer group: each replica reads every partition from the policy's longest window
    plus this much before now (room for late events and producer clock skew), whether it is
    new or restarted, and is ready once caught up with the end offsets seen at start."""
    partitions_refresh_s: float = Field(30.0, gt=0)
    """No consumer group: how often the topics' partitions are listed again, so partitions
    added later (``kafka-topics --alter --partitions``) are read, from their beginning."""
    latency_topic: str = "ebbtide.inference.latency"
    gpu_topic: str = "ebbtide.gpu.utilization"
    load_topic: str | None = LOAD_TOPIC
    """``inference.load`` events (the agent's scraper, the OTLP bridge): the gauges the
    policy's load signals read (docs/policies.md); empty: not consumed."""
    deadletter_topic: str = "ebbtide.deadletter"
    decisions_topic: str | None = "ebbtide.decisions"
    """Audit log of every decision and its outcome; empty to disable."""
    replication_factor: int | None = Field(None, ge=1)
    """Replicas of the topics the controller creates when they do not exist (the decisions log
    carries budgets across restarts); unset: three, or every broker of a smaller cluster."""
    client_id: str = "ebbtide"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    """A file holding the SASL password (a mounted Secret); wins over ``sasl_password``."""
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    max_message_bytes: int = Field(1_048_576, gt=0)
    max_batch: int = Field(10_000, gt=0)
    """Most samples or histogram buckets in one event."""
    max_future_skew_s: float = Field(300.0, ge=0)

    def connection(self) -> KafkaConfig:
        password = self.sasl_password.get_secret_value() if self.sasl_password else None
        if self.sasl_password_file is not None:
            password = self.sasl_password_file.read_text().strip()
        return KafkaConfig(
            bootstrap=self.bootstrap,
            client_id=self.client_id,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=Secret(password) if password is not None else None,
            ssl_cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
            ssl_certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
            ssl_keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
        )

    def limits(self) -> Limits:
        return Limits(self.max_message_bytes, self.max_batch, self.max_future_skew_s)

    def topics(self) -> dict[str, str]:
        topics = {"inference.latency": self.latency_topic, "gpu.utilization": self.gpu_topic}
        if self.load_topic:
            topics[INFERENCE_LOAD] = self.load_topic
        return topics


class HttpSettings(_Group):
    """The metrics and health endpoint."""

    address: str = "0.0.0.0:9108"
    """``host:port`` for ``/metrics``, ``/healthz`` and ``/readyz`` (port 0: any free port)."""

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        _, colon, port = value.rpartition(":")
        if not (colon and port.isdigit() and int(port) < 65536):
            raise ValueError(f"HOST:PORT with a port from 0 to 65535; got {value!r}")
        return value

    ready_max_lag: int = Field(10_000, ge=0)
    """Ready only while the consumer is at most this many events behind."""
    ready_max_fetch_age_s: float = Field(30.0, gt=0)
    """...and has reached the broker within this many seconds."""


class WarmStartSettings(_Group):
    """Fill windows from Prometheus at start so a restarted controller does not act blind."""

    url: str | None = None
    latency_query: str | None = None
    """PromQL, e.g. ``sum by (le, service, namespace) (increase(x_bucket[15s]))``."""
    latency_unit_ms: float = 1000.0
    gpu_query: str | None = "DCGM_FI_DEV_GPU_UTIL"
    lookback_s: float = Field(600.0, gt=0)
    step: str = "15s"


class ShardSettings(_Group):
    """Sharded ingest (docs/limits.md): which role this replica plays, and the aggregators'
    consumer group. The default, ``all``, is one replica that reads every event itself."""

    role: Literal["all", "aggregate", "decide"] = "all"
    """``all``: consume every event and decide (no sharding). ``aggregate``: fold the event
    partitions the group assigns into partials and publish them; never decide. ``decide``:
    merge the partials and decide (leader elected by the Lease, as with ``all``)."""
    aggregates_topic: str = "ebbtide.aggregates"
    """The topic aggregators publish to and deciders read (compacted, and time-limited)."""
    aggregates_retention_s: float | None = Field(None, gt=0)
    """``retention.ms`` of the aggregates topic when Ebbtide creates it (``compact,delete``).
    Unset: the policy's longest window + ``kafka.rewind_margin_s`` + 1 h, what a restarted
    decider reads back plus room for a late backlog."""
    group_id: str = "ebbtide-aggregators"
    """The aggregators' consumer group: Kafka splits the event partitions between them."""
    flush_every_s: float = Field(1.0, gt=0)
    """How often an aggregator publishes its partials and commits: the delay sharding adds."""
    session_timeout_s: float = Field(10.0, gt=0)
    """How long an aggregator may be silent before the group moves its partitions."""
    heartbeat_s: float = Field(3.0, gt=0)


class Settings(BaseSettings):
    """Everything ``ebbtide run`` needs. See the module docstring for where values come from."""

    model_config = SettingsConfigDict(
        env_prefix="EBBTIDE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    policies: Annotated[list[Path], NoDecode] = Field(default_factory=list, min_length=1)
    """Policy files; several merge into one policy. ``EBBTIDE_POLICIES`` takes one path, a
    comma- or colon-separated list, or a JSON list."""
    cluster: str = "kube"
    """``kube`` (the Kubernetes API) or ``sim:SCENARIO.yaml`` (a simulated cluster)."""
    dry_run: bool | None = None
    """Decide and report, write nothing (whatever the policy says). Unset: dry-run against a
    real cluster (``kube``) unless the policy says ``dryRun: false``, live on a simulated one;
    :meth:`for_policy` settles it."""
    evaluate_every_s: float = Field(1.0, gt=0)
    """Evaluate at least this often, so recoveries and idleness are seen without new events."""
    ingest_hold_max_s: float = Field(0.5, ge=0)
    """Longest a tick holds ingest while it decides and carries out (:mod:`streams.hold`); past
    it the consumer goes on. 0 turns the hold off."""
    reload_every_s: float = Field(2.0, gt=0)
    """How often the policy files are checked for changes (a ConfigMap update)."""
    shutdown_timeout_s: float = Field(20.0, gt=0)
    kafka: KafkaSettings = KafkaSettings()
    kube: KubeSettings = KubeSettings()
    http: HttpSettings = HttpSettings()
    warm_start: WarmStartSettings = WarmStartSettings()
    shards: ShardSettings = ShardSettings()

    def for_policy(self, policy: Policy) -> Settings:
        """These settings with ``dry_run`` settled for ``policy``: safe by default, so a
        controller pointed at a real cluster writes nothing until told to (``--no-dry-run``,
        ``EBBTIDE_DRY_RUN=false``, or the policy's own ``dryRun: false``)."""
        if self.dry_run is not None:
            return self
        live = self.cluster != "kube" or (
            "dry_run" in policy.spec.model_fields_set and not policy.spec.dry_run
        )
        return self.model_copy(update={"dry_run": not live})

    def dry_run_for(self, policy: Policy) -> bool:
        """The process-level dry-run flag under ``policy`` (see :meth:`for_policy`)."""
        return bool(self.for_policy(policy).dry_run)

    @field_validator("policies", mode="before")
    @classmethod
    def _path_list(cls, value: Any) -> Any:
        """A plain string (as the environment gives) is a path or a list of them."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            return json.loads(value)
        return [p for p in re.split(r"[,:]", value) if p.strip()]

    @model_validator(mode="after")
    def _cluster_mode(self) -> Settings:
        if self.cluster != "kube" and not self.cluster.startswith("sim:"):
            raise ValueError(f"cluster must be 'kube' or 'sim:SCENARIO', not {self.cluster!r}")
        if self.kube.objective_namespaces and self.shards.role != "all":
            raise ValueError(
                f"kube.objective_namespaces: ServiceObjectives need shards.role 'all', not "
                f"{self.shards.role!r}: the aggregators fold only the policy files' services, so "
                "an objective's events would never reach the deciders"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_cls.model_config.get("yaml_file"):
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


class ConfigFileError(ControllerError, ValueError):
    """The ``--config`` file is missing or is not YAML; the message is one line."""


def _check_yaml(path: Path) -> None:
    """Refuse a missing or malformed config file in one line with FILE:LINE:COL, before
    pydantic-settings reads it (its errors are multi-line parser tracebacks)."""
    if not path.is_file():
        raise ConfigFileError(f"config file {path} does not exist")
    try:
        YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(f"config file {where}: invalid YAML: {problem}") from exc


def load_settings(config_file: Path | None = None, **flags: Any) -> Settings:
    """Settings from flags (``None`` values are left to lower layers), the environment and the
    config file (``config_file``, else ``$EBBTIDE_CONFIG``); :class:`ConfigFileError` when
    that file is missing or not YAML."""
    path = config_file or (Path(p) if (p := os.environ.get("EBBTIDE_CONFIG")) else None)
    cls: type[Settings] = Settings
    if path is not None:
        _check_yaml(path)

        class FromFile(Settings):
            model_config = SettingsConfigDict(**{**Settings.model_config, "yaml_file": path})

        cls = FromFile
    return cls(**{k: v for k, v in flags.items() if v is not None})
