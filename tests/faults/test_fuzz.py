"""Fuzzing the two parsers of untrusted input, no servers: the event decoder (every Kafka
message) and the policy loader (every policy file and hot reload). Arbitrary input and mutations
of valid input: neither ever raises, and every refusal says why (the decoder with a code and a
detail, the loader with FILE:LINE:COL and a message)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policies.loader import PolicyError, Source, check_policy
from streams.events import (
    EventDecoder,
    GpuUtilization,
    InferenceLatency,
    Limits,
    RejectCode,
    Rejection,
)

pytestmark = pytest.mark.slow

NOW = 1_796_000_000.0
LIBRARY = Path(__file__).resolve().parents[2] / "policies" / "library"
POLICIES = {
    p.name: p.read_text() for p in sorted(LIBRARY.glob("*.yaml")) if ".cases." not in p.name
}
# derandomize: the same examples on every run, so a failure (or an xfail) is reproducible.
FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

VALID_EVENTS: list[dict[str, Any]] = [
    {"type": "inference.latency", "ts": NOW, "service": "chat", "namespace": "serving",
     "samples_ms": [12.5, 80.0, 301.0]},
    {"type": "inference.latency", "ts": "2026-11-28T10:00:00Z", "service": "chat",
     "latency_ms": 42.0},
    {"type": "inference.latency", "ts": NOW, "service": "chat",
     "histogram": {"bounds_ms": [10.0, 100.0, 1000.0], "counts": [5, 3, 1, 0]}},
    {"type": "gpu.utilization", "ts": NOW, "node": "gpu-0", "gpu": 3, "util_pct": 97.5},
    {"type": "gpu.utilization", "ts": NOW, "node": "gpu-1", "gpu": "GPU-1f2e", "util_pct": 12.0,
     "mig_profile": "1g.10gb", "mig_instance": 2, "mem_used_mib": 1024.0,
     "mem_total_mib": 9856.0, "pod": "ml/train-0"},
]  # fmt: skip
DECODER = EventDecoder(
    Limits(max_message_bytes=400, max_batch=8, max_future_skew_s=60),
    topics={"inference.latency": "latency", "gpu.utilization": "gpu"},
)
CODES = set(get_args(RejectCode))

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def assert_decoded(raw: bytes, topic: str | None) -> None:
    result = DECODER.decode(raw, now=NOW, topic=topic)
    if isinstance(result, Rejection):
        assert result.code in CODES
        assert result.detail.strip(), f"a rejection without a reason for {raw!r}"
    else:
        assert isinstance(result, InferenceLatency | GpuUtilization)


@st.composite
def mutated_bytes(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    """A valid input with one to four byte-level edits: flip, insert, delete, cut, repeat."""
    data = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut", "repeat"]))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "cut":
            del data[i:]
        else:
            data[i:i] = data[i : i + draw(st.integers(1, 16))]
    return bytes(data)


@st.composite
def mutated_event(draw: st.DrawFn) -> bytes:
    """A valid event with fields dropped, retyped or added at the JSON level."""
    event = dict(draw(st.sampled_from(VALID_EVENTS)))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(event)) | st.text(max_size=8))
        op = draw(st.sampled_from(["drop", "replace"]))
        if op == "drop":
            event.pop(key, None)
        else:
            event[key] = draw(json_values)
    return json.dumps(event, allow_nan=True).encode()


TOPICS = st.sampled_from([None, "latency", "gpu", "elsewhere"])
VALID_BYTES = [json.dumps(e).encode() for e in VALID_EVENTS]


@FUZZ
@given(raw=st.binary(max_size=600), topic=TOPICS)
def test_decoder_on_arbitrary_bytes(raw: bytes, topic: str | None) -> None:
    """Arbitrary bytes decode to an event or a rejection with a code and a reason."""
    assert_decoded(raw, topic)


@FUZZ
@given(raw=mutated_bytes(VALID_BYTES) | mutated_event(), topic=TOPICS)
@example(raw=VALID_BYTES[0].replace(b'"inference', b'"\x80inference'), topic=None)  # found by it
def test_decoder_on_mutated_valid_events(raw: bytes, topic: str | None) -> None:
    """Mutated valid events decode to an event or a rejection with a code and a reason."""
    assert_decoded(raw, topic)


def test_the_valid_events_are_valid() -> None:
    """The seeds of the mutations are accepted as they are (else the fuzzing proves little)."""
    for raw, topic in zip(VALID_BYTES, ["latency"] * 3 + ["gpu"] * 2, strict=True):
        assert not isinstance(DECODER.decode(raw, now=NOW, topic=topic), Rejection)


ERROR_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): \S.*", re.DOTALL)


def assert_checked(text: str, name: str = "fuzz.yaml") -> None:
    policy, errors = check_policy([Source(name, text)])
    assert (policy is None) == bool(errors), "a policy is valid exactly when nothing is wrong"
    lines = text.count("\n") + 2  # a position may point just past the last line
    for error in errors:
        assert isinstance(error, PolicyError)
        match = ERROR_LINE.match(str(error))
        assert match, f"not FILE:LINE:COL: message: {error}"
        assert error.file == name
        assert 1 <= error.line <= lines, str(error)
        assert error.col >= 1, str(error)
        assert error.message.strip()


YAMLISH = st.text(
    alphabet=st.sampled_from(list("abcdeknps01 :-[]{}&*!|>#'\",?%@`\n\t")),
    max_size=200,
)


@FUZZ
@given(text=st.text(max_size=300) | YAMLISH)
def test_policy_loader_on_arbitrary_text(text: str) -> None:
    """Arbitrary text is a policy or a list of errors, each at FILE:LINE:COL with a message."""
    assert_checked(text)


@st.composite
def mutated_policy(draw: st.DrawFn) -> str:
    """A library policy with one to three line edits: drop, repeat, swap, re-indent, retype a
    value, insert characters, cut the file."""
    lines = draw(st.sampled_from(sorted(POLICIES.values()))).splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "repeat", "swap", "indent", "value", "insert", "cut"]))
        if op == "drop":
            del lines[i]
        elif op == "repeat":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "indent":
            lines[i] = " " * draw(st.integers(0, 8)) + lines[i].lstrip()
        elif op == "value" and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            value = draw(
                st.sampled_from(["", "-1", "3x", "[]", "{}", "null", "1e999", "~", "&a"]) | YAMLISH
            )
            lines[i] = f"{key}: {value}"
        elif op == "insert":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(YAMLISH) + lines[i][at:]
        elif op == "cut":
            del lines[i:]
        if not lines:
            break
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=mutated_policy())
def test_policy_loader_on_mutated_library_policies(text: str) -> None:
    """Garbled library policies load, or fail with FILE:LINE:COL errors with a message."""
    assert_checked(text)


def test_the_library_policies_are_valid() -> None:
    """The seeds of the mutations load without an error."""
    for name, text in POLICIES.items():
        assert check_policy([Source(name, text)])[1] == []
