"""One set of rules for policy types: the loader refuses what the shipped JSON Schema (and so
the chart's values schema, which embeds it) refuses, instead of coercing `"200"` to 200."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from controller.cli.policy_commands import policy
from policies.loader import PolicyLoadError, load_policy_text
from policies.model import policy_json_schema

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
HELM_VALUES_SCHEMA = ROOT / "helm" / "ebbtide" / "values.schema.json"


def _balanced() -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe").load(BALANCED.read_text())
    return data


def _set(doc: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


#: A value of the wrong JSON type at a path of balanced.yaml: pydantic's lax mode coerced each.
WRONG_TYPES = {
    "objectiveMs string": ("spec.services.chat.slo.objectiveMs", "200"),
    "percentile string": ("spec.services.chat.slo.percentile", "99"),
    "minSamples string": ("spec.services.chat.slo.minSamples", "20"),
    "minSamples float": ("spec.services.chat.slo.minSamples", 20.5),
    "replicas.max string": ("spec.services.chat.replicas.max", "16"),
    "gpusPerReplica bool": ("spec.services.chat.gpusPerReplica", True),
    "dryRun string": ("spec.dryRun", "true"),
    "dryRun int": ("spec.dryRun", 1),
    "label value int": ("spec.pools.whole.nodeSelector.ebbtide\\.io/pool", 1),
}


def _doc_for(case: str) -> dict[str, Any]:
    path, value = WRONG_TYPES[case]
    if "\\." in path:  # a label key with a dot in it: set it by hand
        doc = copy.deepcopy(_balanced())
        pool = next(iter(doc["spec"]["pools"].values()))
        key = next(iter(pool["nodeSelector"]))
        pool["nodeSelector"][key] = value
        return doc
    return _set(_balanced(), path, value)


@pytest.mark.parametrize("case", WRONG_TYPES, ids=list(WRONG_TYPES))
def test_loader_refuses_what_the_schema_refuses(case: str) -> None:
    """Each wrong type fails the shipped schema and the chart's values schema, and the loader
    refuses it too (before: coerced and accepted)."""
    doc = _doc_for(case)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(policy_json_schema()).validate(doc)
    values = json.loads(HELM_VALUES_SCHEMA.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(values).validate({"policies": [doc]})
    with pytest.raises(PolicyLoadError):
        load_policy_text(json.dumps(doc))


def test_policy_validate_points_at_the_quoted_number(tmp_path: Path) -> None:
    """`objectiveMs: "200"` is an error at its FILE:LINE:COL, naming the expected type."""
    text = BALANCED.read_text()
    assert "objectiveMs: 300" in text
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("objectiveMs: 300", 'objectiveMs: "300"', 1))
    line = 1 + text[: text.index("objectiveMs: 300")].count("\n")
    col = 1 + len(text.splitlines()[line - 1].split("objectiveMs:")[0]) + len("objectiveMs: ")
    result = CliRunner().invoke(policy, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert f"{path}:{line}:{col}: spec.services.chat.slo.objectiveMs: " in result.output
    assert "number" in result.output


def test_yaml_native_values_still_load() -> None:
    """What YAML writes natively passes both: integers where floats are expected, durations
    and percentages as strings, booleans, and the library as shipped."""
    doc = _set(_balanced(), "spec.services.chat.slo.objectiveMs", 250)
    doc = _set(doc, "spec.services.chat.slo.percentile", 99.5)
    doc = _set(doc, "spec.dryRun", True)
    jsonschema.Draft202012Validator(policy_json_schema()).validate(doc)
    loaded = load_policy_text(json.dumps(doc))
    assert loaded.spec.services["chat"].slo.objective_ms == 250.0
    assert loaded.spec.dry_run is True
