"""record, publish and the agent read Kafka settings from ``ebbtide run``'s variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from streams.broker import EmbeddedBroker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["record", "--out", "x.jsonl", "--max-events", "1"], id="record"),
        pytest.param(["publish", str(EXAMPLE), "--as-fast-as-possible"], id="publish"),
        pytest.param(["agent"], id="agent"),
    ],
)
def test_security_settings_come_from_the_run_variables(
    args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """EBBTIDE_KAFKA__* is read (a wrong protocol is refused, one line naming the field) and
    EBBTIDE_KAFKA__BOOTSTRAP stands in for --bootstrap, as for `ebbtide run`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EBBTIDE_KAFKA__BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("EBBTIDE_KAFKA__SECURITY_PROTOCOL", "TLS")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "invalid Kafka settings: kafka.security_protocol" in result.output


def test_publish_to_the_bootstrap_in_the_run_variable(
    kafka_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only EBBTIDE_KAFKA__BOOTSTRAP set, publish reaches that broker."""
    monkeypatch.setenv("EBBTIDE_KAFKA__BOOTSTRAP", kafka_broker.bootstrap)
    result = CliRunner().invoke(cli, ["publish", str(EXAMPLE), "--as-fast-as-possible"])
    assert result.exit_code == 0, result.output
    sent = sum(1 for line in EXAMPLE.read_text().splitlines()[1:] if line.strip())
    assert f"published {sent}" in result.output
