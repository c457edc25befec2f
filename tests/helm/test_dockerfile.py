"""Static checks of the Dockerfile: pinned bases, non-root user matching the chart, the policy
library inside. (No Docker engine here: building the image is CI's job.)"""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import CHART, load_yaml

REPO = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _arg_defaults() -> dict[str, str]:
    defaults = {}
    for word, rest in _instructions():
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults[name] = value
    return defaults


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_base_images_are_pinned() -> None:
    """Every FROM names a registry image with an explicit tag (or digest) that is not latest."""
    args = _arg_defaults()
    for word, rest in _instructions():
        if word != "FROM":
            continue
        image = rest.split()[0]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)
        if image in {stage for w, r in _instructions() if w == "FROM" for stage in r.split()[2:]}:
            continue  # a previous stage
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name, image
        assert tag not in ("", "latest"), image


def test_final_stage_runs_as_the_charts_non_root_user() -> None:
    """The last USER is numeric, not 0, and equals the chart's runAsUser:runAsGroup (so
    runAsNonRoot can verify it without a passwd lookup)."""
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), uid
    assert gid.isdigit(), gid
    assert int(uid) != 0
    assert int(gid) != 0
    values = load_yaml((CHART / "values.yaml").read_text())
    assert (int(uid), int(gid)) == (values["runAsUser"], values["runAsGroup"])


def test_image_carries_the_policy_library_and_the_cli() -> None:
    """The final stage copies policies/library to /etc/ebbtide/policies and runs `ebbtide`."""
    final = _final_stage()
    copies = [rest.split() for word, rest in final if word == "COPY"]
    assert ["policies/library", "/etc/ebbtide/policies"] in copies
    assert ("ENTRYPOINT", '["ebbtide"]') in final
    assert any(word == "EXPOSE" and rest == "9108" for word, rest in final)


def test_dockerignore_keeps_the_context_small() -> None:
    """.dockerignore leaves out the venv, git history, tests and caches."""
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "tests", "**/__pycache__"} <= ignored
