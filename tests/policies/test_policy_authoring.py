"""What a policy author's editor and `policy test` show: a schema whose defaults validate,
errors in the author's units, and failures that say what is wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from controller.cli.policy_commands import policy
from policies.model import policy_json_schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "policy.schema.json"
LIBRARY = ROOT / "policies" / "library"
POLICIES = sorted(p for p in LIBRARY.glob("*.yaml") if not p.name.endswith(".cases.yaml"))


def _defaults(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every property of the schema that has a default: ``(Def.property, its schema)``."""
    nodes = {"Policy": schema, **schema["$defs"]}
    return [
        (f"{name}.{key}", prop)
        for name, node in nodes.items()
        for key, prop in node.get("properties", {}).items()
        if "default" in prop
    ]


def test_committed_schema_is_current() -> None:
    """docs/policy.schema.json is what the code generates (regenerate with `ebbtide policy
    schema > docs/policy.schema.json`)."""
    assert json.loads(SCHEMA_FILE.read_text()) == policy_json_schema()


@pytest.mark.parametrize(
    ("where", "prop"),
    _defaults(policy_json_schema()),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_default_is_valid_for_its_own_property(where: str, prop: dict[str, Any]) -> None:
    """An editor inserts a default as it is: it must pass the schema (`breachAfter: 30s`, not
    `30.0`; `recoverBelow: 90%`, not `0.9`), nested defaults (budgets) included."""
    schema = policy_json_schema()
    resolver = {"$defs": schema["$defs"], **prop}
    jsonschema.Draft202012Validator(resolver).validate(prop["default"])


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_library_policies_validate_against_the_shipped_schema(path: Path) -> None:
    """What we ship as examples passes the schema we ship for editors."""
    document = YAML(typ="safe").load(path.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(document)


def test_docs_name_a_working_schema_modeline() -> None:
    """docs/policies.md shows a yaml-language-server line whose path reaches the shipped file
    from policies/library/."""
    text = (ROOT / "docs" / "policies.md").read_text()
    match = re.search(r"^# yaml-language-server: \$schema=(\S+)$", text, re.MULTILINE)
    assert match is not None
    assert (LIBRARY / match.group(1)).resolve() == SCHEMA_FILE


def test_percent_errors_are_in_percent(tmp_path: Path) -> None:
    """`convertBelow: 200%` is refused as "at most 100%", not as a fraction above 1."""
    bad = tmp_path / "p.yaml"
    text = (LIBRARY / "balanced.yaml").read_text()
    bad.write_text(re.sub(r"convertBelow: \S+", "convertBelow: 200%", text))
    result = CliRunner().invoke(policy, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "spec.mig.convertBelow: a percentage here is at most 100%; got 200%" in result.stderr
    assert "less than or equal to 1" not in result.stderr


CASES = """
cases:
  - name: latency for a service the policy does not have
    snapshot: {nodes: [{name: w0, gpus: 8, labels: {ebbtide.io/pool: whole}}]}
    events:
      - {service: chat, namespace: default, latencyMs: 900, from: 0s, to: 60s, every: 1s}
    expect:
      - {at: 30s, count: 0}
  - name: a wrong expectation
    snapshot: {nodes: [{name: w0, gpus: 8, labels: {ebbtide.io/pool: whole}}]}
    expect:
      - at: 10s
        decisions: [{action: scale, dry_run: false, to: 3}]
"""


def test_policy_test_fails_on_unknown_services_and_diffs_in_yaml(tmp_path: Path) -> None:
    """`policy test` fails a case whose events name a service the policy lacks (here the
    namespace is wrong), and prints expectations as YAML (`false`, not `False`)."""
    cases = tmp_path / "c.cases.yaml"
    cases.write_text(CASES)
    result = CliRunner().invoke(policy, ["test", str(LIBRARY / "balanced.yaml"), str(cases)])
    assert result.exit_code == 1
    out = result.stdout
    assert "FAIL  latency for a service the policy does not have" in out
    assert "events for services the policy does not define: default/chat" in out
    assert "-{action: scale, dry_run: false, to: 3}" in out
    assert "False" not in out
