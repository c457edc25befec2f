"""Safe by default: against a real cluster ``ebbtide run`` writes nothing until told to."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.process.settings import Settings
from policies.loader import load_policy_text

POLICY = """
apiVersion: ebbtide.io/v1alpha1
kind: Policy
metadata: {name: t}
spec:
  pools: {whole: {nodeSelector: {pool: whole}}}
"""


@pytest.mark.parametrize(
    ("cluster", "flag", "policy_says", "dry"),
    [
        pytest.param("kube", None, None, True, id="kube-defaults-to-dry-run"),
        pytest.param("kube", False, None, False, id="kube-live-when-told"),
        pytest.param("kube", None, "dryRun: false", False, id="kube-live-when-the-policy-says"),
        pytest.param("kube", None, "dryRun: true", True, id="kube-policy-dry"),
        pytest.param("kube", True, "dryRun: false", True, id="flag-wins-over-policy"),
        pytest.param("sim:s.yaml", None, None, False, id="simulated-cluster-live"),
        pytest.param("sim:s.yaml", True, None, True, id="simulated-dry-when-told"),
    ],
)
def test_dry_run_is_settled_per_policy(
    cluster: str, flag: bool | None, policy_says: str | None, dry: bool
) -> None:
    """A real cluster is dry-run unless ``--live`` or the policy's own ``dryRun: false``."""
    text = POLICY + (f"  {policy_says}\n" if policy_says else "")
    policy = load_policy_text(text, "p.yaml")
    settings = Settings(policies=[Path("p.yaml")], cluster=cluster, dry_run=flag)
    assert settings.for_policy(policy).dry_run is dry
    assert settings.for_policy(policy).for_policy(policy) == settings.for_policy(policy)
