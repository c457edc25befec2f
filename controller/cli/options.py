"""Option helpers shared by the commands: policies, Kafka settings, durations, progress on a
terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from controller.process.settings import KafkaSettings
from policies.loader import PolicyLoadError, check_policy, read_sources
from policies.model import Policy, parse_duration

__all__ = [
    "bootstrap_option",
    "duration_option",
    "kafka_settings",
    "load_policy_files",
    "one_line",
    "progress",
    "stderr_is_terminal",
]


def bootstrap_option(*, required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--bootstrap`` for the commands that talk to a user's Kafka (record, publish, agent);
    its variable is ``ebbtide run``'s (``EBBTIDE_KAFKA_BOOTSTRAP`` is still read)."""
    return click.option(
        "--bootstrap",
        envvar=["EBBTIDE_KAFKA__BOOTSTRAP", "EBBTIDE_KAFKA_BOOTSTRAP"],
        required=required,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (comma-separated). Env: EBBTIDE_KAFKA__BOOTSTRAP; TLS and "
        "SASL from the same EBBTIDE_KAFKA__* variables as ebbtide run.",
    )


class _KafkaEnv(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EBBTIDE_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    kafka: KafkaSettings = KafkaSettings()


def kafka_settings(bootstrap: str, *, client_id: str) -> KafkaSettings:
    """Kafka settings from ``ebbtide run``'s ``EBBTIDE_KAFKA__*`` variables (TLS, SASL, topics),
    ``bootstrap`` winning; a wrong value is one line naming the field."""
    try:
        return _KafkaEnv(kafka={"bootstrap": bootstrap, "client_id": client_id}).kafka
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise click.ClickException(f"invalid Kafka settings: {where}: {first['msg']}") from exc


def one_line(what: str, errors: Sequence[Any], hint: str = "") -> click.ClickException:
    """The first error, and how many more: a CLI error stays one line."""
    more = f" (and {len(errors) - 1} more{hint})" if len(errors) > 1 else ""
    return click.ClickException(f"{what}: {errors[0]}{more}")


def load_policy_files(paths: tuple[Path, ...]) -> Policy:
    """The merged policy, or a one-line error pointing at ``ebbtide policy validate``."""
    try:
        sources = read_sources(paths)
    except PolicyLoadError as exc:
        raise one_line("cannot read policy", list(exc.errors)) from exc
    policy, errors = check_policy(sources)
    if errors or policy is None:
        files = " ".join(str(p) for p in paths)
        raise one_line("invalid policy", errors, f"; see ebbtide policy validate {files}")
    return policy


def duration_option(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    """A click callback: ``30s``/``10m``/``1h30m`` to seconds, > 0."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if seconds <= 0:
        raise click.BadParameter("must be longer than 0s")
    return seconds


def stderr_is_terminal() -> bool:
    """Progress goes to stderr only on a terminal: pipes and CI logs stay clean."""
    return sys.stderr.isatty()


@contextmanager
def progress(length: int, label: str, unit: str) -> Iterator[Callable[[int], None] | None]:
    """A callback taking how far the work has got (out of ``length``) that draws a bar with
    the rate in ``unit`` per second and the ETA on stderr; ``None`` when stderr is not a
    terminal, so callers skip the bookkeeping."""
    if not stderr_is_terminal():
        yield None
        return
    started = time.monotonic()
    with click.progressbar(
        length=length, label=label, file=sys.stderr, show_eta=True, item_show_func=lambda s: s
    ) as bar:
        done = [0]

        def update(position: int) -> None:
            rate = position / max(time.monotonic() - started, 1e-9)
            bar.update(position - done[0], f"{rate:,.0f} {unit}/s")
            done[0] = position

        yield update
