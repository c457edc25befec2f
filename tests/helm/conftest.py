"""Render the chart once per values set with the real Helm engine (helm-python-sdk, no binary).

``rendered`` is session-scoped: each values file in ``tests/helm/values/`` (plus the defaults) is
rendered once and every test reads the parsed manifests. Values files are layered on the chart's
defaults the way ``helm install -f`` does.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The dev extra installs the real Helm engine; a missing one fails here, never skips.
import helm_python as helm
import pytest
from ruamel.yaml import YAML

CHART = Path(__file__).resolve().parents[2] / "helm" / "ebbtide"
VALUES_DIR = Path(__file__).parent / "values"
RELEASE = "ebb"
NAMESPACE = "ebbtide-system"
#: "default" plus every values file's stem.
VALUE_SETS = ("default", *sorted(p.stem for p in VALUES_DIR.glob("*.yaml")))

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """One render: the parsed manifests (template path kept) and NOTES.txt."""

    name: str
    values: dict[str, Any]
    manifests: tuple[tuple[str, Manifest], ...]
    notes: str

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for _, m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> Manifest:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, f"{self.name}: {len(found)} {kind} named *{name_suffix}"
        return found[0]

    def pod_specs(self) -> list[tuple[str, dict[str, Any]]]:
        """(workload name, pod spec) for every Deployment and DaemonSet."""
        return [
            (m["metadata"]["name"], m["spec"]["template"]["spec"])
            for _, m in self.manifests
            if m["kind"] in ("Deployment", "DaemonSet")
        ]


def load_yaml(text: str) -> Any:
    """One YAML document as plain data (ruamel's safe loader: YAML 1.2, no tags)."""
    return YAML(typ="safe", pure=True).load(text)


def load_yaml_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML stream."""
    return [d for d in YAML(typ="safe", pure=True).load_all(text) if d]


def dump_yaml(data: Any) -> str:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.dump(data, out)
    return out.getvalue()


def values_for(name: str) -> dict[str, Any]:
    """The user values of a set (``{}`` for the defaults)."""
    if name == "default":
        return {}
    loaded: dict[str, Any] = load_yaml((VALUES_DIR / f"{name}.yaml").read_text()) or {}
    return loaded


def render(chart: Any, values: dict[str, Any]) -> dict[str, str]:
    """Template path → rendered text, as ``helm template`` would produce (schema checked)."""
    out: dict[str, str] = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return out


def parse(name: str, values: dict[str, Any], out: dict[str, str]) -> Rendered:
    manifests: list[tuple[str, Manifest]] = []
    notes = ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        manifests.extend((path, doc) for doc in load_yaml_all(text))
    return Rendered(name, values, tuple(manifests), notes)


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    """The chart, loaded once."""
    loaded = helm.Chart.load(CHART)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def rendered(chart: Any) -> dict[str, Rendered]:
    """Every values set, rendered once for the whole directory."""
    result: dict[str, Rendered] = {}
    for name in VALUE_SETS:
        values = values_for(name)
        result[name] = parse(name, values, render(chart, values))
    return result
