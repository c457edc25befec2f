"""The ``ebbtide`` command line: one click group, one module per family of subcommands.

Errors a user can fix are raised as :class:`click.ClickException` (or subclasses) and printed as
one line with a non-zero exit; a traceback means a bug in Ebbtide.
"""

from __future__ import annotations

import click

from controller.process.logs import configure_logging

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    envvar="EBBTIDE_LOG_LEVEL",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    envvar="EBBTIDE_LOG_FORMAT",
    help="auto: console on a TTY, JSON lines otherwise.",
)
@click.version_option(package_name="ebbtide")
def cli(log_level: str, log_format: str) -> None:
    """Ebbtide: event-driven GPU autoscaling and preemption for Kubernetes."""
    configure_logging(level=log_level, fmt=log_format)  # type: ignore[arg-type]


def _register() -> None:
    from controller.cli import (
        agent_command,
        policy_commands,
        replay_command,
        run_command,
        scenario_commands,
        scrape_command,
        simulate_command,
        status_command,
        stream_commands,
    )

    for module in (
        stream_commands,
        policy_commands,
        run_command,
        replay_command,
        simulate_command,
        scenario_commands,
        agent_command,
        scrape_command,
        status_command,
    ):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="ebbtide")
