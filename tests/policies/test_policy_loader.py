"""Policy loading: every invalid case is reported at its exact FILE:LINE:COL with its path."""

from __future__ import annotations

import textwrap

import pytest

from policies.loader import PolicyLoadError, Source, check_policy, load_policy, read_sources
from policies.model import parse_duration, parse_percent

HEAD = """\
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata:
  name: t
spec:
  pools:
    whole: {nodeSelector: {pool: whole}}
    mig: {nodeSelector: {pool: mig}, kind: mig}
"""
# Line numbers below count from 1 at "apiVersion"; HEAD is 8 lines.

SERVICE = """\
  services:
    chat:
      pool: whole
      slo:
        percentile: 99
        objectiveMs: 200
"""  # lines 9-14


def errors_of(*texts: str) -> list[tuple[str, int, int, str, str]]:
    sources = [Source(f"f{i}.yaml", t) for i, t in enumerate(texts)]
    policy, errors = check_policy(sources)
    assert (policy is None) == bool(errors)
    return [(e.file, e.line, e.col, e.path, e.message) for e in errors]


CASES = [
    pytest.param(
        HEAD + SERVICE.replace("objectiveMs: 200", "objectiveMs: 200\n        colour: red"),
        [("f0.yaml", 15, 9, "spec.services.chat.slo.colour", "unknown key")],
        id="unknown-key",
    ),
    pytest.param(
        HEAD + SERVICE.replace("objectiveMs: 200", "objectivMs: 200"),
        [
            ("f0.yaml", 12, 7, "spec.services.chat.slo.objectiveMs", "required key is missing"),
            ("f0.yaml", 14, 9, "spec.services.chat.slo.objectivMs", "did you mean 'objectiveMs'"),
        ],
        id="misspelt-key-suggests",
    ),
    pytest.param(
        HEAD + SERVICE.replace("objectiveMs: 200", "objectiveMs: fast"),
        [("f0.yaml", 14, 22, "spec.services.chat.slo.objectiveMs", "valid number")],
        id="wrong-type",
    ),
    pytest.param(
        HEAD + SERVICE + "        window: 10 minutes\n",
        [("f0.yaml", 15, 17, "spec.services.chat.slo.window", "invalid duration '10 minutes'")],
        id="bad-duration",
    ),
    pytest.param(
        HEAD + SERVICE + "        breachAfter: 30\n",
        [("f0.yaml", 15, 22, "spec.services.chat.slo.breachAfter", "a duration is a string")],
        id="duration-without-unit",
    ),
    pytest.param(
        HEAD + SERVICE.replace("percentile: 99", "percentile: 100"),
        [("f0.yaml", 13, 21, "spec.services.chat.slo.percentile", "less than 100")],
        id="percentile-out-of-range",
    ),
    pytest.param(
        HEAD + SERVICE + "        recoverBelow: 0.8\n",
        [("f0.yaml", 15, 23, "spec.services.chat.slo.recoverBelow", "a percentage is a string")],
        id="bare-number-percentage",
    ),
    pytest.param(
        HEAD + SERVICE.replace("pool: whole", "pool: wohle"),
        [("f0.yaml", 11, 13, "spec.services.chat.pool", "undefined pool 'wohle'")],
        id="undefined-pool",
    ),
    pytest.param(
        HEAD + SERVICE.replace("pool: whole", "pool: wohle").replace("99", "101"),
        [
            ("f0.yaml", 11, 13, "spec.services.chat.pool", "undefined pool 'wohle'"),
            ("f0.yaml", 13, 21, "spec.services.chat.slo.percentile", "less than 100"),
        ],
        id="every-problem-reported",
    ),
    pytest.param(
        HEAD + "  training:\n    selector: {a: b}\n    pools: [whole, gpu]\n",
        [("f0.yaml", 11, 20, "spec.training.pools[1]", "undefined pool 'gpu'")],
        id="undefined-pool-in-list",
    ),
    pytest.param(
        HEAD
        + "  mig:\n    fromPool: mig\n    toPool: mig\n    convertBelow: 20%\n"
        + "    convertAfter: 30m\n    revertAfter: 5m\n    profiles: {A100-80GB: all-1g.10gb}\n",
        [("f0.yaml", 10, 15, "spec.mig.fromPool", "must be of kind whole")],
        id="mig-pool-wrong-kind",
    ),
    pytest.param(
        HEAD + SERVICE + "      replicas: {min: 5, max: 2}\n",
        [("f0.yaml", 15, 7, "spec.services.chat.replicas", "min (5) is greater than max (2)")],
        id="cross-field",
    ),
    pytest.param(
        HEAD + "  pools: {}\n",
        [("f0.yaml", 9, 3, "", "invalid YAML: found duplicate key")],
        id="duplicate-yaml-key",
    ),
    pytest.param(
        "apiVersion: ebbtide.io/v2\nkind: Policy\nmetadata: {name: t}\nspec: {pools: {}}\n",
        [("f0.yaml", 1, 13, "apiVersion", "ebbtide.io/v1alpha1")],
        id="wrong-api-version",
    ),
    pytest.param(
        HEAD + "  services: [oops\n",
        [("f0.yaml", 10, 1, "", "invalid YAML")],
        id="yaml-syntax",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_policy_positions(
    text: str, expected: list[tuple[str, int, int, str, str]]
) -> None:
    """Each invalid policy yields exactly the expected errors at the right line and column."""
    got = errors_of(text)
    assert [(f, ln, c, p) for f, ln, c, p, _ in got] == [
        (f, ln, c, p) for f, ln, c, p, _ in expected
    ]
    for (*_, message), (*_, want) in zip(got, expected, strict=True):
        assert want in message


def test_merge_conflict_reported_at_second_definition() -> None:
    """Two files defining the same pool conflict; the error points at the second one."""
    second = (
        "apiVersion: ebbtide.io/v1alpha1\nkind: Policy\nspec:\n"
        "  pools:\n    whole: {nodeSelector: {x: y}}\n"
    )
    got = errors_of(HEAD, second)
    assert got == [
        ("f1.yaml", 5, 5, "spec.pools.whole", "defined twice (first defined at f0.yaml:7:5)")
    ]


def test_merge_scalar_conflict() -> None:
    """A non-mergeable spec key (dryRun) defined in two files is a conflict."""
    first = HEAD + "  dryRun: true\n"
    second = "apiVersion: ebbtide.io/v1alpha1\nkind: Policy\nspec:\n  dryRun: false\n"
    assert errors_of(first, second) == [
        ("f1.yaml", 4, 3, "spec.dryRun", "defined twice (first defined at f0.yaml:9:3)")
    ]


def test_merge_unions_services_and_pools() -> None:
    """Services and pools from several files merge; positions still point into each file."""
    team = textwrap.dedent(
        """\
        apiVersion: ebbtide.io/v1alpha1
        kind: Policy
        spec:
          protectedNamespaces: [team-a]
          services:
            search:
              pool: mig
              slo: {percentile: 99.9, objectiveMs: 50}
        """
    )
    policy = load_policy([Source("base.yaml", HEAD + SERVICE), Source("team.yaml", team)])
    assert sorted(policy.spec.services) == ["chat", "search"]
    assert policy.spec.protected_namespaces == ["team-a"]
    broken = team.replace("pool: mig", "pool: nope")
    errs = errors_of(HEAD + SERVICE, broken)
    assert errs[0][:4] == ("f1.yaml", 7, 13, "spec.services.search.pool")


def test_load_policy_raises_with_all_errors() -> None:
    """load_policy raises PolicyLoadError whose message lists every problem, one per line."""
    text = HEAD + SERVICE.replace("pool: whole", "pool: x").replace("200", "-1")
    with pytest.raises(PolicyLoadError) as info:
        load_policy([Source("p.yaml", text)])
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert all(line.startswith("p.yaml:") for line in lines)


def test_read_sources_missing_file(tmp_path: object) -> None:
    """An unreadable file is reported as an error, not a traceback."""
    with pytest.raises(PolicyLoadError, match="cannot read"):
        read_sources(["/nonexistent/policy.yaml"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("10m", 600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1d", 86400.0)],
    ids=["seconds", "minutes", "compound", "millis", "days"],
)
def test_parse_duration(text: str, seconds: float) -> None:
    """Durations with units parse to seconds."""
    assert parse_duration(text) == seconds


def test_parse_percent() -> None:
    """Percentages parse to fractions; bare numbers are refused."""
    assert parse_percent("40%") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="percentage"):
        parse_percent(0.4)
