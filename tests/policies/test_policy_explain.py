"""`ebbtide policy explain` covers every setting; `--values` and `-o json` for policy authors;
the chart README's policy commands run as written; policies carry the `$schema` line."""

from __future__ import annotations

import copy
import json
import re
import shlex
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from ruamel.yaml import YAML

from controller.cli.policy_commands import policy
from policies.explain import explain
from policies.loader import load_policy_text
from policies.model import Policy

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "policies" / "library"

#: A policy that sets every optional section, so each setting of the model is in play.
FULL: dict[str, Any] = {
    "apiVersion": "ebbtide.io/v1alpha1",
    "kind": "Policy",
    "metadata": {"name": "full", "description": "every setting"},
    "spec": {
        "dryRun": False,
        "killSwitch": False,
        "protectedNamespaces": ["kube-system"],
        "pools": {
            "whole": {"nodeSelector": {"pool": "whole"}, "kind": "whole"},
            "mig": {
                "nodeSelector": {"pool": "mig"},
                "kind": "mig",
                "taints": [{"key": "nvidia.com/mig", "value": "yes", "effect": "NoSchedule"}],
            },
            "spare": {"nodeSelector": {"pool": "spare"}, "kind": "whole"},
            "slices": {"nodeSelector": {"pool": "slices"}, "kind": "mig"},
        },
        "services": {
            "chat": {
                "namespace": "serving",
                "workload": "chat-server",
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
                    "minSamples": 20,
                    "staleAfter": "5m",
                },
                "scale": {
                    "kind": "Deployment",
                    "tolerance": "10%",
                    "maxStep": 4,
                    "down": {
                        "stabilization": "5m",
                        "below": "50%",
                        "maxStep": 1,
                        "cooldown": "2m",
                        "crowd": {"after": "2m", "memory": "12h"},
                    },
                    "leading": {
                        "ratePerReplica": 2.5,
                        "learn": True,
                        "learnAt": "95%",
                        "headroom": True,
                        "startup": "1m",
                        "forecast": {"period": "1d", "maxError": "25%"},
                    },
                    "signals": {
                        "waiting": 4,
                        "running": 16,
                        "kvCache": "80%",
                        "gpuUtilization": "70%",
                        "staleAfter": "30s",
                    },
                    "workBound": {"afterSteps": 2, "loadDrop": "20%", "settle": "2m"},
                    "readyEndsCooldown": True,
                    "shrinkFirst": False,
                },
                "objectives": [{"metric": "tpot", "percentile": 95, "objectiveMs": 50}],
                "cooldown": "1m",
            }
        },
        "training": {
            "selector": {"class": "training"},
            "pools": ["whole"],
            "elastic": {
                "minReplicasAnnotation": "x/min",
                "maxReplicasAnnotation": "x/max",
                "growAfter": "5m",
                "growStep": 1,
                "growTo": "step",
                "regrowAfter": "1h",
            },
            "victimOrder": ["priority", "newest"],
            "gracePeriod": "30s",
            "checkpoint": {"deadline": "5m"},
            "restarts": {
                "restartCost": "2m",
                "checkpointEvery": "30m",
                "tasksFirst": False,
                "payback": "0s",
                "checkpointHorizon": "0s",
            },
            "gangMinimumAnnotation": "x/gang",
            "progressAnnotation": "x/progress",
            "owner": "others",
        },
        "mig": {
            "enabled": True,
            "fromPool": "whole",
            "toPool": "mig",
            "convertBelow": "20%",
            "convertAfter": "30m",
            "nodeIdleBelow": "5%",
            "maxConcurrent": 1,
            "minWholeNodes": 2,
            "profiles": {"A100-80GB": "all-1g.10gb"},
            "configs": {"all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
            "revertAfter": "5m",
            "stuckAfter": "15m",
        },
        "budgets": {
            "evictions": {"max": 10, "per": "10m"},
            "scaleSteps": {"max": 30, "per": "10m"},
            "migConversions": {"max": 2, "per": "1h"},
        },
        "cooldowns": {"service": "2m", "trainingGrow": "5m"},
    },
}

#: One other valid value for each setting of FULL.
CHANGES: dict[str, Any] = {
    "metadata.name": "other",
    "metadata.description": "something else",
    "spec.dryRun": True,
    "spec.killSwitch": True,
    "spec.protectedNamespaces": ["kube-system", "ops"],
    "spec.pools.spare.nodeSelector": {"pool": "reserve"},
    "spec.pools.spare.kind": "mig",
    "spec.pools.mig.taints": [{"key": "nvidia.com/mig", "value": "yes", "effect": "NoExecute"}],
    "spec.services.chat.namespace": "web",
    "spec.services.chat.workload": "chat-v2",
    "spec.services.chat.pool": "spare",
    "spec.services.chat.gpusPerReplica": 2,
    "spec.services.chat.replicas.min": 3,
    "spec.services.chat.replicas.max": 12,
    "spec.services.chat.slo.percentile": 95,
    "spec.services.chat.slo.objectiveMs": 250,
    "spec.services.chat.slo.metric": "ttft",
    "spec.services.chat.slo.window": "2m",
    "spec.services.chat.slo.resolution": "10s",
    "spec.services.chat.slo.breachAfter": "45s",
    "spec.services.chat.slo.recoverBelow": "70%",
    "spec.services.chat.slo.recoverAfter": "3m",
    "spec.services.chat.slo.minSamples": 50,
    "spec.services.chat.slo.staleAfter": "7m",
    "spec.services.chat.scale.kind": "StatefulSet",
    "spec.services.chat.scale.tolerance": "15%",
    "spec.services.chat.scale.maxStep": 8,
    "spec.services.chat.scale.down.stabilization": "20m",
    "spec.services.chat.scale.down.below": "40%",
    "spec.services.chat.scale.down.maxStep": "25%",
    "spec.services.chat.scale.down.cooldown": "4m",
    "spec.services.chat.scale.down.crowd.after": "3m",
    "spec.services.chat.scale.down.crowd.memory": "1d",
    "spec.services.chat.scale.leading.ratePerReplica": 5,
    "spec.services.chat.scale.signals.waiting": 8,
    "spec.services.chat.scale.signals.running": 32,
    "spec.services.chat.scale.signals.kvCache": "90%",
    "spec.services.chat.scale.signals.gpuUtilization": "60%",
    "spec.services.chat.scale.signals.staleAfter": "1m",
    "spec.services.chat.scale.workBound.afterSteps": 3,
    "spec.services.chat.scale.workBound.loadDrop": "30%",
    "spec.services.chat.scale.workBound.settle": "3m",
    "spec.services.chat.objectives": [{"metric": "tpot", "percentile": 99, "objectiveMs": 60}],
    "spec.services.chat.scale.leading.headroom": False,
    "spec.services.chat.scale.leading.startup": "3m",
    "spec.services.chat.scale.leading.learn": False,
    "spec.services.chat.scale.leading.learnAt": "90%",
    "spec.services.chat.scale.leading.tolerance": "5%",
    "spec.services.chat.scale.leading.forecast.period": "7d",
    "spec.services.chat.scale.leading.forecast.maxError": "10%",
    "spec.services.chat.scale.readyEndsCooldown": False,
    "spec.services.chat.scale.shrinkFirst": True,
    "spec.services.chat.cooldown": "90s",
    "spec.training.selector": {"class": "batch"},
    "spec.training.pools": ["spare"],
    "spec.training.elastic.minReplicasAnnotation": "y/min",
    "spec.training.elastic.maxReplicasAnnotation": "y/max",
    "spec.training.elastic.growAfter": "10m",
    "spec.training.elastic.growStep": 2,
    "spec.training.elastic.growTo": "idle",
    "spec.training.elastic.regrowAfter": "2h",
    "spec.training.restarts.restartCost": "5m",
    "spec.training.restarts.checkpointEvery": "1h",
    "spec.training.restarts.tasksFirst": True,
    "spec.training.restarts.payback": "1h",
    "spec.training.restarts.checkpointHorizon": "5m",
    "spec.training.victimOrder": ["leastProgress"],
    "spec.training.gracePeriod": "1m",
    "spec.training.checkpoint.deadline": "10m",
    "spec.training.gangMinimumAnnotation": "y/gang",
    "spec.training.progressAnnotation": "y/progress",
    "spec.training.owner": "ebbtide",
    "spec.mig.enabled": False,
    "spec.mig.fromPool": "spare",
    "spec.mig.toPool": "slices",
    "spec.mig.convertBelow": "10%",
    "spec.mig.convertAfter": "1h",
    "spec.mig.nodeIdleBelow": "2%",
    "spec.mig.maxConcurrent": 2,
    "spec.mig.minWholeNodes": 1,
    "spec.mig.profiles": {"H100-80GB": "all-1g.10gb"},
    "spec.mig.configs": {"all-balanced": {"1g.10gb": 3, "2g.20gb": 2}},
    "spec.mig.revertAfter": "10m",
    "spec.mig.stuckAfter": "30m",
    "spec.budgets.evictions.max": 5,
    "spec.budgets.evictions.per": "20m",
    "spec.budgets.scaleSteps.max": 20,
    "spec.budgets.scaleSteps.per": "5m",
    "spec.budgets.migConversions.max": 3,
    "spec.budgets.migConversions.per": "2h",
    "spec.cooldowns.service": "3m",
    "spec.cooldowns.trainingGrow": "7m",
}
#: Map keys of FULL, named generically, as the model names them.
_GENERIC = {"pools.spare": "pools.*", "pools.mig": "pools.*", "services.chat": "services.*"}


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


def _settings(model: type[BaseModel], prefix: str) -> set[str]:
    """Every setting (leaf field, by alias) of ``model``; maps of models named ``*``."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        tp = _unwrap(info.annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out |= _settings(tp, path + ".")
            continue
        if typing.get_origin(tp) is dict:
            value = _unwrap(typing.get_args(tp)[1])
            if isinstance(value, type) and issubclass(value, BaseModel):
                out |= _settings(value, path + ".*.")
                continue
        out.add(path)
    return out


def _generic(path: str) -> str:
    for concrete, generic in _GENERIC.items():
        path = path.replace(concrete, generic)
    return path


def _changed(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(FULL)
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return data


def _text(data: dict[str, Any]) -> str:
    return explain(load_policy_text(json.dumps(data))).text()


def test_changes_cover_every_setting_of_the_model() -> None:
    """The table names every setting the model has: a new setting fails here until the
    explanation describes it (and this table changes it)."""
    model = _settings(Policy, "") - {"apiVersion", "kind"}
    assert {_generic(p) for p in CHANGES} == model


@pytest.mark.parametrize("path", sorted(CHANGES))
def test_every_setting_changes_the_explanation(path: str) -> None:
    """Changing any one setting changes what explain says."""
    assert _text(_changed(path, CHANGES[path])) != _text(FULL), path


def test_proactive_example_reads_differently_from_balanced() -> None:
    """The issue's case: examples/policy-proactive.yaml read word for word like balanced.
    Besides the name, explain now names its set rate per replica, maxStep 8 and its 20m
    scale-down window (readyEndsCooldown and shrinkFirst are balanced's defaults too now)."""
    balanced = CliRunner().invoke(policy, ["explain", str(LIBRARY / "balanced.yaml")]).stdout
    proactive = (
        CliRunner()
        .invoke(policy, ["explain", str(ROOT / "examples" / "policy-proactive.yaml")])
        .stdout
    )
    only = set(proactive.splitlines()[1:]) - set(balanced.splitlines()[1:])
    text = "\n".join(only)
    for needle in (
        "2.5 requests/s a replica",
        "at most 8 replica(s) a step",
        "last 20m",
    ):
        assert needle in text, needle


def test_balanced_explains_its_learned_capacity_and_headroom() -> None:
    """The library's balanced scales chat on a learned rate per replica with start-up headroom
    (issue 24): explain says how it is learned and at what latency, what it starts from, that
    it sizes a breach under load, what headroom keeps, and that a climb's cooldown ends once its
    replicas run, into GPUs free now."""
    text = CliRunner().invoke(policy, ["explain", str(LIBRARY / "balanced.yaml")]).stdout
    for needle in (
        "serves at 100% of the objective, learned from its own percentile against its load",
        "until that fit is confident, 2.5 requests/s a replica",
        "a breach under load is sized by it, not by the percentile's ratio",
        "one pod start-up ahead (start-up observed from its pods",
        "only replicas that could be brought back in time go",
        "cooldown ends early",
        "GPUs free now",
    ):
        assert needle in text, needle
    assert "Forecast:" not in text  # not on by default: no arena day shows it winning


def test_explain_json() -> None:
    """-o json gives the sections as data and the effective spec with defaults filled in."""
    result = CliRunner().invoke(policy, ["explain", "-o", "json", str(LIBRARY / "balanced.yaml")])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["policy"] == "balanced"
    assert data["mode"] == "live"
    titles = [s["title"] for s in data["sections"]]
    assert titles == ["Pools", "Services", "Training", "MIG", "Limits"]
    services = data["sections"][1]["items"]
    assert services[0]["subject"] == "serving/chat"
    assert data["spec"]["services"]["chat"]["slo"]["minSamples"] == 20  # a default
    assert data["spec"]["services"]["chat"]["slo"]["window"] == 60.0


def _values_file(tmp_path: Path, *docs: tuple[str, str], extra: str = "") -> Path:
    """A Helm values file with ``docs`` (file name, policy text) under ``policies:``."""
    lines = ["image: {repository: example/ebbtide}", "policies:"]
    for name, text in docs:
        lines.append(f"  {name}:")
        lines += [f"    {line}" if line.strip() else "" for line in text.splitlines()]
    path = tmp_path / "values.yaml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def test_validate_values_places_errors_in_the_values_file(tmp_path: Path) -> None:
    """--values checks the policies inside Helm values; an error is placed at its line and
    column in the values file, as text and with -o json."""
    text = (LIBRARY / "balanced.yaml").read_text().replace("objectiveMs: 300", "objectiveMs: -3")
    values = _values_file(tmp_path, ("balanced.yaml", text))
    line = next(
        i for i, row in enumerate(values.read_text().splitlines(), 1) if "objectiveMs: -3" in row
    )
    result = CliRunner().invoke(policy, ["validate", "--values", str(values)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{values}:{line}:26: spec.services.chat.slo.objectiveMs:")
    result = CliRunner().invoke(policy, ["validate", "-o", "json", "--values", str(values)])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["errors"][0]["line"] == line
    assert report["errors"][0]["path"] == "spec.services.chat.slo.objectiveMs"


def test_validate_values_ok_and_json(tmp_path: Path) -> None:
    """A values file with a valid policy validates; -o json says ok with the digest."""
    values = _values_file(tmp_path, ("balanced.yaml", (LIBRARY / "balanced.yaml").read_text()))
    result = CliRunner().invoke(policy, ["validate", "-o", "json", "--values", str(values)])
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    assert (report["ok"], report["policy"], report["errors"]) == (True, "balanced", [])
    assert len(report["digest"]) == 16


def test_values_follow_the_charts_choice(tmp_path: Path) -> None:
    """As the chart's `ebbtide.policies` helper: defaultPolicies are used when policies is
    empty, and merged with them under mergeDefaultPolicies (a conflict is then refused)."""
    balanced = (LIBRARY / "balanced.yaml").read_text()
    indented = "\n".join(f"    {line}" if line.strip() else "" for line in balanced.splitlines())
    only_defaults = tmp_path / "defaults.yaml"
    only_defaults.write_text(f"policies: {{}}\ndefaultPolicies:\n  balanced.yaml:\n{indented}\n")
    result = CliRunner().invoke(policy, ["validate", "--values", str(only_defaults)])
    assert result.exit_code == 0, result.stderr
    assert "'balanced'" in result.stdout
    latency = (LIBRARY / "latency-first.yaml").read_text()
    both = _values_file(
        tmp_path,
        ("latency.yaml", latency),
        extra=f"mergeDefaultPolicies: true\ndefaultPolicies:\n  balanced.yaml:\n{indented}\n",
    )
    result = CliRunner().invoke(policy, ["validate", "--values", str(both)])
    assert result.exit_code == 1
    assert "defined twice" in result.stderr
    replaced = _values_file(
        tmp_path,
        ("latency.yaml", latency),
        extra=f"defaultPolicies:\n  balanced.yaml:\n{indented}\n",
    )
    result = CliRunner().invoke(policy, ["validate", "--values", str(replaced)])
    assert result.exit_code == 0, result.stderr


def test_values_without_policies_and_files_with_values(tmp_path: Path) -> None:
    """Values with no policy documents, and files together with --values, are one clear line."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("dryRun: false\n")
    result = CliRunner().invoke(policy, ["validate", "--values", str(empty)])
    assert result.exit_code == 1
    assert "no policy documents" in result.stderr
    result = CliRunner().invoke(
        policy, ["validate", "--values", str(empty), str(LIBRARY / "balanced.yaml")]
    )
    assert result.exit_code == 2
    assert "not both" in result.stderr


def _readme_commands() -> list[list[str]]:
    text = (ROOT / "helm" / "ebbtide" / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.+?)\n```", text, re.S)
    return [
        shlex.split(line)[2:]
        for block in blocks
        for line in block.splitlines()
        if line.startswith("ebbtide policy ")
    ]


def test_chart_readme_policy_commands_run_as_written(tmp_path: Path) -> None:
    """The chart README's `ebbtide policy …` commands, with its file names standing for a
    values file holding the library's balanced policy and its cases, exit 0."""
    commands = _readme_commands()
    assert {c[0] for c in commands} == {"validate", "explain", "test"}
    values = _values_file(tmp_path, ("balanced.yaml", (LIBRARY / "balanced.yaml").read_text()))
    files = {
        "my-policies.yaml": str(values),
        "my-policies.cases.yaml": str(LIBRARY / "balanced.cases.yaml"),
    }
    for words in commands:
        args = [files.get(w, w) for w in words]
        assert not [a for a in args if a.endswith(".yaml") and not Path(a).is_file()], args
        result = CliRunner().invoke(policy, args)
        assert result.exit_code == 0, (words, result.stdout, result.stderr)


def test_test_command_takes_values(tmp_path: Path) -> None:
    """`policy test --values V CASES` runs the cases against the values' policy; a wrong
    expectation fails with a diff whose decisions carry their time."""
    values = _values_file(tmp_path, ("balanced.yaml", (LIBRARY / "balanced.yaml").read_text()))
    cases = LIBRARY / "balanced.cases.yaml"
    result = CliRunner().invoke(policy, ["test", "--values", str(values), str(cases)])
    assert result.exit_code == 0, result.stdout
    broken = tmp_path / "broken.cases.yaml"
    broken.write_text(
        cases.read_text().replace(
            "target: serving/chat, from: 2, to: 4", "target: serving/chat, from: 2, to: 9"
        )
    )
    result = CliRunner().invoke(policy, ["test", "--values", str(values), str(broken)])
    assert result.exit_code == 1
    assert re.search(
        r"\+\{action: scale, target: serving/chat, from: 2, to: 4.*\}  # at 1m5s", result.stdout
    )


POLICY_FILES = sorted(
    [p for p in LIBRARY.glob("*.yaml") if not p.name.endswith(".cases.yaml")]
    + [p for p in (ROOT / "examples").glob("policy-*.yaml") if not p.name.endswith(".cases.yaml")]
)


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: p.name)
def test_policies_carry_the_schema_line(path: Path) -> None:
    """Each library and example policy starts with the YAML language server's `$schema` line,
    its path resolves to docs/policy.schema.json, and the schema accepts the policy."""
    first = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, first
    schema_path = (path.parent / match.group(1)).resolve()
    assert schema_path == ROOT / "docs" / "policy.schema.json"
    schema = json.loads(schema_path.read_text())
    data = json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(data))


def test_values_with_broken_yaml_or_a_non_mapping_policy(tmp_path: Path) -> None:
    """A values file that is not YAML, or whose policy entry is not a mapping, is one line
    each, placed in the values file."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("policies:\n  a.yaml: {spec: [\n")
    result = CliRunner().invoke(policy, ["validate", "--values", str(broken)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{broken}:3:1: invalid YAML")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("policies:\n  a.yaml: just text\n")
    result = CliRunner().invoke(policy, ["validate", "--values", str(scalar)])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"{scalar}:2:3: policies.a.yaml: a policy document is a mapping (apiVersion, kind, "
        "metadata, spec)"
    )
