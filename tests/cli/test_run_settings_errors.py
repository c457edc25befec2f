"""``ebbtide run`` and ``broker`` given wrong settings: one line, non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.process.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
LATENCY = ROOT / "policies" / "library" / "latency-first.yaml"


def _invoke(args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output.strip().splitlines()


def test_missing_config_file(tmp_path: Path) -> None:
    """--config naming no file: one line naming it."""
    code, lines = _invoke(["run", "--policy", str(BALANCED), "--config", str(tmp_path / "no.yaml")])
    assert code == 1
    assert lines == [f"Error: config file {tmp_path / 'no.yaml'} does not exist"]


def test_config_with_a_tab_is_one_line_with_its_position(tmp_path: Path) -> None:
    """A tab where YAML wants spaces: FILE:LINE:COL and the parser's words, on one line."""
    config = tmp_path / "c.yaml"
    config.write_text("kafka:\n\tbootstrap: x:9092\n")
    code, lines = _invoke(["run", "--policy", str(BALANCED), "--config", str(config)])
    assert code == 1
    (line,) = lines
    assert line.startswith(f"Error: config file {config}:2:1: invalid YAML: ")


def test_no_policy_says_how_to_give_one() -> None:
    """run with no policy at all names the flag and the variable."""
    code, lines = _invoke(["run"])
    assert code == 2
    assert lines[-1] == (
        "Error: invalid settings: no policy: give --policy FILE "
        "(or EBBTIDE_POLICIES=FILE[,FILE...])"
    )


def test_missing_policy_file_is_one_line() -> None:
    """run --policy naming no file: one line, not a PolicyLoadError traceback."""
    code, lines = _invoke(["run", "--policy", "nope.yaml"])
    assert code == 1
    (line,) = lines
    assert line.startswith("Error: cannot read policy: nope.yaml:1:1: cannot read")


@pytest.mark.parametrize(
    ("value", "files"),
    [
        (str(BALANCED), 1),
        (f"{BALANCED},{LATENCY}", 2),
        (f"{BALANCED}:{LATENCY}", 2),
        (f'["{BALANCED}", "{LATENCY}"]', 2),
    ],
    ids=["one-path", "comma-list", "colon-list", "json-list"],
)
def test_policies_from_the_environment_take_plain_paths(
    value: str, files: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EBBTIDE_POLICIES takes a path, a comma or colon list, or JSON."""
    monkeypatch.setenv("EBBTIDE_POLICIES", value)
    settings = load_settings()
    assert settings.policies[0] == BALANCED
    assert len(settings.policies) == files


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--policy", str(BALANCED), "--metrics-address", "notaport"], "HOST:PORT"),
        (["run", "--policy", str(BALANCED), "--metrics-address", "h:70000"], "HOST:PORT"),
        (["broker", "--port", "99999"], "99999 is not in the range 0<=x<=65535"),
    ],
    ids=["metrics-not-a-port", "metrics-port-too-big", "broker-port-too-big"],
)
def test_bad_addresses_are_usage_errors(args: list[str], words: str) -> None:
    """An address or port that cannot be: a usage error naming the option, before any I/O."""
    code, lines = _invoke(args)
    assert code == 2
    assert words in lines[-1]


def test_a_bad_metrics_address_from_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EBBTIDE_HTTP__ADDRESS is checked like --metrics-address: one line, before any I/O."""
    monkeypatch.setenv("EBBTIDE_HTTP__ADDRESS", "notaport")
    code, lines = _invoke(["run", "--policy", str(BALANCED)])
    assert code == 2
    assert "http.address" in lines[-1]
    assert "HOST:PORT" in lines[-1]


def test_objectives_with_sharded_ingest_is_one_line() -> None:
    """ServiceObjectives with a decider: refused in one line saying why (the aggregators fold
    only the policy files' services); with the default role they are accepted."""
    env = {"EBBTIDE_KUBE__OBJECTIVE_NAMESPACES": '["team-a"]'}
    code, lines = _invoke(["run", "--policy", str(BALANCED), "--role", "decide"], env=env)
    assert code == 2
    (line,) = [ln for ln in lines if ln.startswith("Error:")]
    assert "ServiceObjectives need shards.role 'all', not 'decide'" in line
    assert load_settings(policies=[BALANCED], kube={"objective_namespaces": ["*"]}).kube
