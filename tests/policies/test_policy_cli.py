"""`ebbtide policy …` through click's CliRunner, and the library's own cases."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from controller.cli.policy_commands import policy
from policies.casetest import load_cases, run_cases
from policies.loader import Source, load_policy, read_sources

LIBRARY = Path(__file__).resolve().parents[2] / "policies" / "library"
POLICIES = sorted(p for p in LIBRARY.glob("*.yaml") if not p.name.endswith(".cases.yaml"))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(policy, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_validate_ok() -> None:
    """A valid policy validates with exit 0 and names the policy."""
    code, out, _ = invoke("validate", str(LIBRARY / "balanced.yaml"))
    assert code == 0
    assert "ok: policy 'balanced'" in out


def test_validate_errors(tmp_path: Path) -> None:
    """An invalid policy exits 1 with one FILE:LINE:COL line per problem."""
    bad = tmp_path / "bad.yaml"
    text = (LIBRARY / "balanced.yaml").read_text().replace("objectiveMs: 300", "objectiveMs: -3")
    bad.write_text(
        text.replace("pool: whole\n      gpusPerReplica", "pool: gpu\n      gpusPerReplica")
    )
    code, _, err = invoke("validate", str(bad))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{bad}:32:13: spec.services.chat.pool: undefined pool 'gpu'")
    assert lines[1].startswith(f"{bad}:37:22: spec.services.chat.slo.objectiveMs:")


def test_validate_merge_conflict() -> None:
    """Validating two files that define the same service reports the conflict."""
    code, _, err = invoke(
        "validate", str(LIBRARY / "balanced.yaml"), str(LIBRARY / "latency-first.yaml")
    )
    assert code == 1
    assert "defined twice" in err


def test_explain() -> None:
    """explain prints a summary naming services, training, MIG and budgets."""
    code, out, _ = invoke("explain", str(LIBRARY / "balanced.yaml"))
    assert code == 0
    for needle in ("serving/chat", "P99", "Training:", "Convert whole nodes", "budgets:"):
        assert needle in out


def test_schema_is_valid_json_schema() -> None:
    """schema prints a JSON Schema that validates the library policies' plain data."""
    code, out, _ = invoke("schema")
    assert code == 0
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    from ruamel.yaml import YAML

    for path in POLICIES:
        data = json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))
        assert not list(validator.iter_errors(data)), path.name


def test_test_command_passes_and_fails(tmp_path: Path) -> None:
    """test exits 0 when the cases pass, and 1 with a diff when one fails."""
    cases = LIBRARY / "balanced.cases.yaml"
    code, out, _ = invoke("test", str(LIBRARY / "balanced.yaml"), str(cases))
    assert code == 0, out
    assert "0 failed" in out
    broken = tmp_path / "broken.cases.yaml"
    broken.write_text(
        cases.read_text().replace(
            "target: serving/chat, from: 2, to: 4", "target: serving/chat, from: 2, to: 9"
        )
    )
    code, out, _ = invoke("test", str(LIBRARY / "balanced.yaml"), str(broken))
    assert code == 1
    assert "FAIL  a sustained breach shrinks sweep tasks rather than restart the DDP job" in out
    assert "-{action: scale, target: serving/chat, from: 2, to: 9" in out
    assert "+{action: scale, target: serving/chat, from: 2, to: 4" in out


def test_test_command_bad_case_file(tmp_path: Path) -> None:
    """A case file with an unknown key is refused with its position."""
    bad = tmp_path / "bad.cases.yaml"
    bad.write_text(
        "cases:\n  - name: x\n    snapshot: {}\n    expect: [{at: 1s}]\n    colour: red\n"
    )
    code, _, err = invoke("test", str(LIBRARY / "balanced.yaml"), str(bad))
    assert code == 1
    assert f"{bad}:5:5: cases[0].colour: unknown key" in err


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.stem)
def test_library_cases_pass(path: Path) -> None:
    """Every library policy loads and passes its own cases file."""
    loaded = load_policy(read_sources([path]))
    (source,) = read_sources([path.with_suffix(".cases.yaml")])
    cases, errors = load_cases(Source(source.name, source.text))
    assert not errors
    assert cases is not None
    results = run_cases(loaded, cases)
    assert [r.failures for r in results if not r.passed] == []
