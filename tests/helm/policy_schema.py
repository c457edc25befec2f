"""Keep the chart's ``values.schema.json`` in step with the policy model.

The chart validates each entry of ``policies`` against the same JSON Schema that
``ebbtide policy schema`` prints: its ``$defs`` are copied into the values schema's ``$defs`` (the
chart's own definitions are lower-case, the model's CamelCase, so names cannot clash) and the
policy document itself becomes ``$defs.Policy``. A test fails when they drift; this script
rewrites them::

    python tests/helm/policy_schema.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from policies.model import policy_json_schema

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "helm" / "ebbtide" / "values.schema.json"
_DROP = ("$id", "$schema", "$defs", "title")


def policy_defs() -> dict[str, Any]:
    """The ``$defs`` entries the chart's schema must hold for policies."""
    schema = policy_json_schema()
    defs: dict[str, Any] = dict(schema["$defs"])
    document = {k: v for k, v in schema.items() if k not in _DROP}
    document["description"] = "One Ebbtide policy document (see docs/policies.md)."
    defs["Policy"] = document
    return defs


def synced(values_schema: dict[str, Any]) -> dict[str, Any]:
    """``values_schema`` with its policy definitions replaced by the model's."""
    own = {k: v for k, v in values_schema["$defs"].items() if k[:1].islower()}
    return {**values_schema, "$defs": {**own, **policy_defs()}}


def main() -> None:
    current = json.loads(SCHEMA_PATH.read_text())
    SCHEMA_PATH.write_text(json.dumps(synced(current), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
