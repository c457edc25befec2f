"""The ServiceObjective CRD: the chart ships what the model generates, Kubernetes accepts it, and
its OpenAPI schema and CEL rules (run by cel-python, a real CEL engine with RE2 as the API
server's) refuse what the policy loader refuses, with the loader's own messages."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from controller.cli.policy_commands import policy as policy_cli
from controller.kube.objective_crd import objective_crd, with_objectives
from policies.engine import Engine
from policies.loader import Source, check_policy, load_policy, read_sources

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "helm" / "ebbtide" / "crds" / "serviceobjectives.yaml"
SCHEMA = objective_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

#: chat from policies/library/balanced.yaml, as a team would write its ServiceObjective spec.
CHAT: dict[str, Any] = {
    "pool": "whole",
    "gpusPerReplica": 1,
    "replicas": {"min": 2, "max": 16},
    "slo": {
        "percentile": 99,
        "objectiveMs": 300,
        "window": "1m",
        "resolution": "5s",
        "breachAfter": "30s",
        "recoverBelow": "80%",
        "recoverAfter": "2m",
        "staleAfter": "5m",
    },
    "scale": {
        "tolerance": "10%",
        "maxStep": 4,
        "readyEndsCooldown": True,
        "shrinkFirst": True,
        "down": {"below": "50%", "stabilization": "5m", "maxStep": 1, "cooldown": "2m"},
    },
}


def _cel_errors(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Evaluate every ``x-kubernetes-validations`` rule on ``value`` as the API server does
    (each rule with ``self`` bound to its node; ``messageExpression`` evaluated on failure)."""
    env = celpy.Environment()
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        bound = {"self": celpy.json_to_cel(value)}
        if not env.program(env.compile(rule["rule"])).evaluate(bound):
            if "messageExpression" in rule:
                message = env.program(env.compile(rule["messageExpression"])).evaluate(bound)
            else:
                message = rule["message"]
            errors.append(f"{path}: {message}")
    if isinstance(value, dict):
        for key, child in value.items():
            if key in schema.get("properties", {}):
                errors += _cel_errors(schema["properties"][key], child, f"{path}.{key}")
    return errors


def _schema_errors(spec: dict[str, Any]) -> list[str]:
    """The OpenAPI v3.0 schema's verdict (draft 4 semantics: boolean exclusiveMinimum)."""
    obj = {"apiVersion": "ebbtide.io/v1alpha1", "kind": "ServiceObjective",
           "metadata": {"name": "chat", "namespace": "serving"}, "spec": spec}  # fmt: skip
    validator = jsonschema.Draft4Validator(SCHEMA)
    return [e.message for e in validator.iter_errors(obj)]


def _loader_messages(spec: dict[str, Any]) -> list[str]:
    """What `ebbtide policy validate` says of the same service in a policy file."""
    policy = {
        "apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
        "spec": {
            "pools": {"whole": {"nodeSelector": {"pool": "whole"}}},
            "services": {"chat": {"namespace": "serving", **spec}},
        },
    }  # fmt: skip
    _, errors = check_policy([Source("p.yaml", json.dumps(policy))])
    return [e.message for e in errors]


def test_the_chart_ships_the_generated_crd() -> None:
    """helm/ebbtide/crds/serviceobjectives.yaml is `ebbtide policy crd`'s output, so the
    schema follows the policy model."""
    shipped = YAML(typ="safe").load(SHIPPED.read_text())
    assert shipped == json.loads(json.dumps(objective_crd()))


def test_kubernetes_accepts_the_crd() -> None:
    """kubernetes-validate checks it against Kubernetes 1.30's own CRD schema, strictly."""
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "-k", "1.30.0", "--strict", str(SHIPPED)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def _structural(node: dict[str, Any], path: str = "") -> list[str]:
    """Kubernetes' structural schema rule: every node has a type (or is int-or-string)."""
    bad = [] if "type" in node or node.get("x-kubernetes-int-or-string") else [path or "/"]
    for key, child in node.get("properties", {}).items():
        bad += _structural(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        bad += _structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        bad += _structural(node["additionalProperties"], f"{path}{{}}")
    return bad


def test_schema_is_structural() -> None:
    assert _structural(SCHEMA) == []


def test_a_valid_objective_passes_schema_rules_and_loader() -> None:
    """The library's chat service is valid three times over."""
    assert _schema_errors(CHAT) == []
    assert _cel_errors(SCHEMA["properties"]["spec"], CHAT) == []
    assert _loader_messages(CHAT) == []


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(CHAT)
    node = spec
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return spec


#: One invalid spec per rule, and where the rule sits.
INVALID = {
    "min above max": (_with("replicas.min", 20), "spec.replicas"),
    "scale without replicas": (_with("replicas", None), "spec"),
    "resolution above window": (_with("slo.resolution", "2m"), "spec.slo"),
    "resolution above the default window": (
        _with("slo.window", None)
        | {"slo": {**_with("slo.window", None)["slo"], "resolution": "90s"}},
        "spec.slo",
    ),
    "too many slots": (_with("slo.window", "2h"), "spec.slo"),
    "percentage over 100": (_with("slo.recoverBelow", "120%"), "spec.slo.recoverBelow"),
    "shrinkFirst alone": (_with("scale.readyEndsCooldown", False), "spec.scale"),
    "below 100%": (_with("scale.down.below", "100%"), "spec.scale.down"),
    "below 0%": (_with("scale.down.below", "0%"), "spec.scale.down"),
    "step 0%": (_with("scale.down.maxStep", "0%"), "spec.scale.down.maxStep"),
}


@pytest.mark.parametrize("name", INVALID)
def test_cel_rules_say_what_the_loader_says(name: str) -> None:
    """Each rule refuses its case with exactly the message the policy loader gives for the same
    service in a policy file; the OpenAPI schema alone lets it through (it is the rule's job)."""
    spec, where = INVALID[name]
    cel = _cel_errors(SCHEMA["properties"]["spec"], spec)
    loader = _loader_messages(spec)
    assert len(cel) == 1, cel
    assert cel[0].startswith(f"{where}: ")
    assert cel[0].removeprefix(f"{where}: ") in loader, (cel, loader)
    assert _schema_errors(spec) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("slo.window", "1d"),
        ("slo.objectiveMs", 0),
        ("replicas.max", 0),
        ("slo.recoverBelow", "0.8"),
    ],
)
def test_the_schema_refuses_shapes(path: str, value: Any) -> None:
    """Units, bounds and types are the OpenAPI schema's: days are not a Go duration (write
    24h), a zero objective or maximum and a bare fraction are refused."""
    assert _schema_errors(_with(path, value))


def _objective(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "ebbtide.io/v1alpha1",
        "kind": "ServiceObjective",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
TEAMS = [
    _objective("team-a", "search", CHAT),
    _objective("team-b", "chat", CHAT),  # the policy file's service
    _objective("team-c", "embed", _with("pool", "gpu")),
    _objective("team-d", "rerank", _with("replicas.min", 20)),
    _objective("team-e", "search", CHAT),  # team-a's name
]


def test_objectives_join_the_policy_or_say_why_not() -> None:
    """Objects in several namespaces: a valid one joins the policy as a service in its own
    namespace (the engine runs it); a taken name, an undefined pool or an invalid spec is
    refused with the loader's words."""
    policy = load_policy(read_sources([BALANCED]))
    merged, verdicts = with_objectives(policy, TEAMS, None)
    got = {v.key: (v.accepted, v.reason, v.message) for v in verdicts}
    assert got["team-a/search"][:2] == (True, "Accepted")
    assert got["team-b/chat"][:2] == (False, "NameTaken")
    assert "already defined by the policy file (namespace serving)" in got["team-b/chat"][2]
    assert got["team-c/embed"] == (
        False, "InvalidSpec", "spec.pool: undefined pool 'gpu' (pools: mig, whole)"
    )  # fmt: skip
    assert got["team-d/rerank"] == (
        False, "InvalidSpec", "spec.replicas: min (20) is greater than max (16)"
    )  # fmt: skip
    assert got["team-e/search"][:2] == (False, "NameTaken")
    assert merged.service_key("search") == "team-a/search"
    assert set(merged.spec.services) == {"chat", "search"}
    assert Engine(merged).slo_state("team-a/search").state == "ok"


def test_objectives_only_in_allowed_namespaces() -> None:
    """With the chart's namespace list, an object elsewhere is refused and says where."""
    policy = load_policy(read_sources([BALANCED]))
    _, (verdict,) = with_objectives(policy, [TEAMS[0]], {"team-x"})
    assert (verdict.accepted, verdict.reason) == (False, "NamespaceNotAllowed")
    assert "serviceObjectives.namespaces: team-x" in verdict.message


def test_validate_with_objectives(tmp_path: Path) -> None:
    """`policy validate POLICY --objectives FILE` says which objects join, and places each
    refused one at its document in the file, exit 1."""
    good = tmp_path / "good.yaml"
    good.write_text(json.dumps(TEAMS[0]))
    result = CliRunner().invoke(policy_cli, ["validate", str(BALANCED), "--objectives", str(good)])
    assert result.exit_code == 0, result.stderr
    assert "ok: ServiceObjective team-a/search join it" in result.stdout
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("---\n".join(json.dumps(o) + "\n" for o in TEAMS[:3]))
    result = CliRunner().invoke(policy_cli, ["validate", str(BALANCED), "--objectives", str(mixed)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"{mixed}:3:1: ServiceObjective team-b/chat: NameTaken: service 'chat' is already "
        "defined by the policy file (namespace serving), which wins; service names are unique "
        "across namespaces",
        f"{mixed}:5:1: ServiceObjective team-c/embed: InvalidSpec: spec.pool: undefined pool "
        "'gpu' (pools: mig, whole)",
    ]
