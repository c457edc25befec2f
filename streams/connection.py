"""How to reach a Kafka cluster: bootstrap servers, client identity and security.

One frozen value, :class:`KafkaConfig`, turns into the keyword arguments every aiokafka client
takes, so consumers, producers and the admin client cannot disagree on security settings.
Secrets are held as :class:`Secret` so they never appear in a ``repr`` or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.helpers import create_ssl_context

from streams.stream_errors import KafkaUnavailable

__all__ = ["KafkaConfig", "Secret", "default_replication", "ensure_topics"]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@dataclass(frozen=True, slots=True)
class Secret:
    """A string that prints as ``'***'``."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """Connection settings shared by every Kafka client Ebbtide opens."""

    bootstrap: str
    """Comma-separated ``host:port`` list."""
    client_id: str = "ebbtide"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaConsumer``/``AIOKafkaProducer``/admin clients."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        if self.security_protocol.startswith("SASL"):
            if not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
                raise ValueError(
                    f"security protocol {self.security_protocol} needs a SASL mechanism, "
                    "username and password"
                )
            kwargs |= {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_plain_username": self.sasl_username,
                "sasl_plain_password": self.sasl_password.value,
            }
        return kwargs


def default_replication(brokers: int) -> int:
    """Three replicas, as Kafka's internal topics default to, or every broker of a smaller
    cluster (a factor above the broker count is refused)."""
    return max(1, min(3, brokers))


async def ensure_topics(
    config: KafkaConfig,
    topics: list[str],
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    configs: dict[str, str] | None = None,
    timeout_s: float = 15.0,
) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are. Without a
    ``replication_factor``, each is replicated as Kafka's own default for internal topics is:
    three times, or once per broker on a smaller cluster. ``configs`` are topic settings for
    the topics created (``{"cleanup.policy": "compact"}``)."""
    admin = AIOKafkaAdminClient(**config.client_kwargs(), request_timeout_ms=int(timeout_s * 1000))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        if missing:
            if replication_factor is None:
                brokers = (await admin.describe_cluster())["brokers"]
                replication_factor = default_replication(len(brokers))
            # Created concurrently by another client is what we wanted.
            with contextlib.suppress(TopicAlreadyExistsError):
                response = await admin.create_topics(
                    [
                        NewTopic(t, partitions, replication_factor, topic_configs=configs or {})
                        for t in missing
                    ]
                )
                refused = [
                    f"{topic}: {message or f'error {code}'}"
                    for topic, code, message in response.topic_errors
                    if code not in (0, TopicAlreadyExistsError.errno)
                ]
                if refused:
                    raise KafkaUnavailable(f"Kafka refused to create topics: {'; '.join(refused)}")
    except (KafkaError, TimeoutError) as exc:
        raise KafkaUnavailable(
            f"cannot reach Kafka at {config.bootstrap} to create topics: {exc}"
        ) from exc
    finally:
        await admin.close()
