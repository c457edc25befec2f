"""values.schema.json: bad values fail the install with a message naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import CHART, helm, render
from .policy_schema import SCHEMA_PATH, synced

_POLICY = "/policies/balanced.yaml"


def _bad_policy(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "ebbtide.io/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "bad"},
        "spec": {"pools": {"whole": {"nodeSelector": {"a": "b"}}}, **spec},
    }
    return {"policies": {"bad.yaml": doc}}


_SASL_NO_USER = {"securityProtocol": "SASL_PLAINTEXT", "sasl": {"enabled": True}}
_CERT_NO_KEY = {"securityProtocol": "SSL", "tls": {"enabled": True, "certKey": "c.crt"}}
_EMPTY_SPEC = {"apiVersion": "ebbtide.io/v1alpha1", "kind": "Policy", "metadata": {"name": "p"}}

#: (id, values, where the error is reported, what the message says)
BAD_VALUES: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("replicas -1", {"controller": {"replicas": -1}}, "/controller/replicas", "minimum"),
    ("replicas string", {"controller": {"replicas": "2"}}, "/controller/replicas", "want integer"),
    ("dryRun string", {"dryRun": "yes"}, "/dryRun", "want boolean"),
    ("dryRun removed", {"dryRun": None}, "", "missing property 'dryRun'"),
    ("unknown top-level key", {"dryrun": True}, "", "'dryrun' not allowed"),
    ("unknown nested key", {"controller": {"replica": 2}}, "/controller", "'replica' not allowed"),
    ("latest tag", {"image": {"tag": "latest"}}, "/image/tag", "not"),
    (
        "no memory request",
        {"controller": {"resources": {"requests": {"memory": None}}}},
        "/controller/resources/requests",
        "missing property 'memory'",
    ),
    ("bad enum", {"controller": {"antiAffinity": "strict"}}, "/controller/antiAffinity", "soft"),
    (
        "SASL protocol without sasl",
        {"kafka": {"securityProtocol": "SASL_SSL"}},
        "/kafka/securityProtocol",
        "PLAINTEXT",
    ),
    ("sasl without username", {"kafka": _SASL_NO_USER}, "/kafka/sasl/username", "minLength"),
    ("client cert without key", {"kafka": _CERT_NO_KEY}, "/kafka/tls/keyKey", "minLength"),
    ("bootstrap without port", {"kafka": {"bootstrap": "kafka"}}, "/kafka/bootstrap", "pattern"),
    ("agent enum", {"agent": {"enabled": True, "migUtil": "zero"}}, "/agent/migUtil", "memory"),
    (
        "policy file name",
        {"policies": {"bad name.yaml": {}}},
        "/policies/bad name.yaml",
        "'bad name.yaml' does not match pattern",
    ),
    ("valid policy (control)", _bad_policy(), None, ""),
    (
        "policy without apiVersion",
        {"policies": {"p.yaml": {"kind": "Policy"}}},
        "/policies/p.yaml",
        "apiVersion",
    ),
    ("policy unknown key", _bad_policy(pool={}), "/policies/bad.yaml/spec", "'pool' not allowed"),
    (
        "policy wrong type",
        _bad_policy(dryRun="no"),
        "/policies/bad.yaml/spec/dryRun",
        "want boolean",
    ),
    (
        "policy bare-number duration",
        _bad_policy(cooldowns={"service": 30}),
        "/policies/bad.yaml/spec/cooldowns/service",
        "want string",
    ),
    (
        "policy without pools",
        {"policies": {"p.yaml": {**_EMPTY_SPEC, "spec": {}}}},
        "/policies/p.yaml/spec",
        "missing property 'pools'",
    ),
]


@pytest.mark.parametrize(
    ("values", "where", "says"), [pytest.param(*b[1:], id=b[0]) for b in BAD_VALUES]
)
def test_bad_values_are_refused_naming_the_field(
    chart: Any, values: dict[str, Any], where: str | None, says: str
) -> None:
    """The schema refuses the values at render time; the message gives the path and the rule."""
    if where is None:  # the control case: a well-formed policy renders
        render(chart, values)
        return
    assert helm is not None
    with pytest.raises(helm.HelmValuesError) as caught:
        render(chart, values)
    message = str(caught.value)
    assert f"at '{where}'" in message, message
    assert says in message, message


def test_schema_holds_the_policy_model_schema() -> None:
    """values.schema.json's policy definitions equal `ebbtide policy schema` (run
    `python tests/helm/policy_schema.py` to resync)."""
    current = json.loads(SCHEMA_PATH.read_text())
    assert current == synced(current)


def test_every_default_value_is_described_by_the_schema() -> None:
    """Every key in values.yaml has a schema entry (so none escapes type checking)."""
    assert helm is not None
    schema = json.loads(SCHEMA_PATH.read_text())
    with helm.Chart.load(CHART) as loaded:
        defaults = loaded.values

    def missing(values: dict[str, Any], node: dict[str, Any], path: str) -> list[str]:
        out = []
        props = node.get("properties", {})
        for key, value in values.items():
            if key not in props:
                out.append(f"{path}/{key}")
                continue
            sub = props[key]
            if isinstance(value, dict) and "properties" in sub:
                out.extend(missing(value, sub, f"{path}/{key}"))
        return out

    assert missing(defaults, schema, "") == []


def test_no_policy_at_all_fails_the_install(chart: Any) -> None:
    """Dropping the default policy without giving one of your own fails at template time."""
    with pytest.raises(Exception, match="no policy file"):
        render(chart, {"defaultPolicies": {"balanced.yaml": None}})
