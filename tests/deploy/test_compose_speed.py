"""The compose publisher plays at the recorded pace unless asked: the live controller then
decides what an offline replay decides (faster play compresses event time, not policy time)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_publisher_defaults_to_speed_1() -> None:
    """docker-compose.yml publishes with --retime at EBBTIDE_SPEED, which defaults to 1."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["publisher"]["command"]
    assert "--retime" in command
    assert "--speed=${EBBTIDE_SPEED:-1}" in command


def test_readme_says_why_faster_publishing_decides_differently() -> None:
    """The README names the knob and the reason (wall-clock windows and cooldowns)."""
    readme = (ROOT / "README.md").read_text()
    assert "EBBTIDE_SPEED=10" in readme
    assert "wall clock" in readme
