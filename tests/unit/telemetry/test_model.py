"""Samples survive the agent's JSON unchanged; anything else is refused naming the bad field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from bot.telemetry.errors import SampleFormatError
from bot.telemetry.model import MAX_DEPTH, _deeper_than, from_json, sign, to_json
from tests.unit.telemetry.builders import START, a_process, a_sample


def test_samples_round_trip_through_json() -> None:
    """Every field, processes included, comes back equal."""
    samples = [
        a_sample(util_pct=87.5, processes=(a_process(job="slurm/7", started=1.7e9),)),
        a_sample(index=3, util_pct=None, memory_used_mib=None, health="lost", error="gone"),
    ]
    assert samples == from_json(to_json(samples))


def test_times_come_back_in_utc_whatever_offset_was_sent() -> None:
    """An agent in another zone still lands on the UTC timeline."""
    body = json.loads(to_json([a_sample()]))
    body["samples"][0]["taken_at"] = START.astimezone(timezone(timedelta(hours=2))).isoformat()
    (sample,) = from_json(json.dumps(body))
    assert (START, UTC) == (sample.taken_at, sample.taken_at.tzinfo)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=2), "version 1"),
        (lambda d: d.update(samples={}), "`samples` to be a list"),
        (lambda d: d["samples"][0].update(index="0"), "samples[0].index: expected int"),
        (lambda d: d["samples"][0].update(index=True), "samples[0].index: expected int"),
        (lambda d: d["samples"][0].update(health="fine"), "samples[0].health"),
        (lambda d: d["samples"][0].update(taken_at="2025-03-14T09:00:00"), "needs a UTC offset"),
        (lambda d: d["samples"][0].update(taken_at="tuesday"), "not an ISO 8601 time"),
        (lambda d: d["samples"][0]["processes"].append({"user": "x"}), "processes[0].pid"),
    ],
)
def test_malformed_documents_are_refused_naming_the_field(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    document = json.loads(to_json([a_sample()]))
    change(document)
    with pytest.raises(SampleFormatError, match=re.escape(message)):
        from_json(json.dumps(document))


def test_bytes_that_are_not_json_are_refused() -> None:
    with pytest.raises(SampleFormatError, match="not JSON"):
        from_json(b"\xff{")


def test_the_signature_covers_timestamp_nonce_and_body() -> None:
    """Changing any signed part changes the signature; the format is v1=<64 hex>."""
    base = sign("t" * 32, "1741942800", "n1", b"{}")
    assert re.fullmatch("v1=[0-9a-f]{64}", base)
    assert base != sign("t" * 32, "1741942801", "n1", b"{}")
    assert base != sign("t" * 32, "1741942800", "n2", b"{}")
    assert base != sign("t" * 32, "1741942800", "n1", b"{ }")
    assert base != sign("u" * 32, "1741942800", "n1", b"{}")


def test_a_sample_moves_onto_another_clock() -> None:
    moved = a_sample().shifted(timedelta(seconds=-90))
    assert datetime(2025, 3, 14, 8, 58, 30, tzinfo=UTC) == moved.taken_at


def depth(value: Any) -> int:
    """How deep a decoded JSON value nests, the obvious way."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize(
    "text",
    [
        '{"a": "[[[[[[[[[[[[", "b": []}',
        '{"a": "\\"[[[[[[[[[[", "b": [[]]}',
        '{"a": "\\\\", "b": [[[[[[[[]]]]]]]]}',
        '{"a": "\\\\\\"{{{{{{{{{{", "b": {}}',
        '["\\\\\\\\", [[[[[[[[["]"]]]]]]]]]]',
        '[[[[[[[["\\u005b"]]]]]]]]',
        '{"x": "]]]]]", "y": [[[[[[[[[]]]]]]]]]}',
    ],
)
def test_the_depth_limit_counts_brackets_never_those_inside_strings(text: str) -> None:
    """Brackets, quotes and backslashes inside strings never change the nesting the limit
    sees: a document is refused exactly when it nests deeper than eight."""
    deep = depth(json.loads(text)) > MAX_DEPTH
    assert deep == _deeper_than(text.encode(), MAX_DEPTH)
