"""structlog set-up: JSON lines for machines, a coloured console on a TTY.

Configured once by the CLI before any command runs; library code only calls
``structlog.get_logger()`` and never configures logging itself.

On the console a ``decision`` event (some 600 characters of inputs, thresholds and
alternatives as key=value pairs) is one line a person reads at a glance:
``scale serving/chat 2→4 applied (slo-breach-scale-up): <reason>``. JSON lines keep every
field unchanged: the console is for people, JSON for machines and ``jq``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
#: Fields of a decision event kept beside the readable line on the console.
_KEPT = ("timestamp", "level", "logger")


def decision_line(record: MutableMapping[str, Any]) -> str:
    """A decision record (:func:`policies.decisions.decision_to_dict` plus its outcome) as one
    line: action, target, from→to (or the MIG profile), outcome, rule and reason."""
    change = ""
    if "from" in record and "to" in record:
        change = f" {record['from']}→{record['to']}"
    elif record.get("profile"):
        change = f" → {record['profile']}"
    outcome = record.get("outcome", "decided")
    if record.get("dry_run") and outcome != "dry_run":
        outcome = f"{outcome}, dry-run"
    line = f"{record.get('action')} {record.get('target')}{change} {outcome}"
    if rule := record.get("rule"):
        line += f" ({rule})"
    if reason := record.get("reason"):
        line += f": {reason}"
    if detail := record.get("detail"):
        line += f" [{detail}]"
    return line


def _readable_decision(
    _logger: object, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Console only: a decision event becomes its one-line summary."""
    if event_dict.get("event") != "decision":
        return event_dict
    kept = {k: event_dict[k] for k in _KEPT if k in event_dict}
    return {**kept, "event": f"decision {decision_line(event_dict)}"}


def configure_logging(*, level: str = "info", fmt: LogFormat = "auto") -> None:
    """Route structlog and the standard library (aiokafka logs through it) to stderr."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    numeric = logging.getLevelNamesMapping()[level.upper()]
    readable = [_readable_decision] if use_console else []
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, *readable, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # aiokafka is chatty at INFO about every reconnect; its warnings still come through.
    root.setLevel(max(numeric, logging.WARNING))
