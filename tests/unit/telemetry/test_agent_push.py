"""The bot's end of the agent: signed pushes land in the TelemetryWindow; unknown nodes, bad
signatures, old timestamps, replays, bad bodies and samples for another node are refused, counted
and (for known nodes) reported; orders leave signed; no bytes and no headers make it raise."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.telemetry.agent_push import load_tokens
from bot.telemetry.errors import TokenFileError
from bot.telemetry.model import order_signature, sign, to_json
from tests.unit.telemetry.builders import NODE, START, TOKEN, IngestRig, a_sample, at


@pytest.fixture
def bot() -> IngestRig:
    return IngestRig()


def test_a_signed_push_lands_in_telemetry(bot: IngestRig) -> None:
    status, message = bot.push()
    assert (200, {"ok": True, "taken": 1, "orders": []}) == (status, json.loads(message))
    assert bot.telemetry.gpu(NODE, 0, START).fresh
    assert [] == bot.refused


def test_header_names_are_case_insensitive(bot: IngestRig) -> None:
    body = to_json([a_sample()])
    stamp = str(int(START.timestamp()))
    headers = {
        "x-gpubot-node": NODE,
        "X-GPUBOT-TIMESTAMP": stamp,
        "x-Gpubot-Nonce": "n",
        "x-gpubot-signature": sign(TOKEN, stamp, "n", body),
    }
    assert 200 == bot.ingest.handle(headers, body)[0]


@pytest.mark.parametrize(
    ("push", "reason"),
    [
        ({"node": "gpu-9"}, "unknown node"),
        ({"node": ""}, "unknown node"),
        ({"token": "0" * 32}, "bad signature"),  # another node's token
        ({"sent": START - timedelta(minutes=5, seconds=1)}, "timestamp +301 s off"),
        ({"sent": START + timedelta(minutes=6)}, "timestamp -360 s off"),
        ({"nonce": ""}, "X-Gpubot-Nonce"),
    ],
)
def test_unauthenticated_pushes_are_refused_with_401_and_reported(
    bot: IngestRig, push: dict[str, object], reason: str
) -> None:
    status, message = bot.push(**push)  # type: ignore[arg-type]
    assert (401, True) == (status, reason in message)
    node = str(push.get("node", NODE))
    # A node name alone proves nothing: only refusals naming a known node are reported.
    assert ([(node, message)] if node == NODE else []) == bot.refused
    assert 1 == bot.ingest.refusals.total
    assert not bot.telemetry.gpu(NODE, 0, START).fresh


def test_a_tampered_body_is_refused(bot: IngestRig) -> None:
    stamp = str(int(START.timestamp()))
    body = to_json([a_sample()])
    headers = {
        "X-Gpubot-Node": NODE,
        "X-Gpubot-Timestamp": stamp,
        "X-Gpubot-Nonce": "n",
        "X-Gpubot-Signature": sign(TOKEN, stamp, "n", body),
    }
    assert (401, "bad signature") == bot.ingest.handle(headers, to_json([a_sample(util_pct=0.5)]))


def test_a_replayed_push_is_refused_while_its_timestamp_is_still_accepted(bot: IngestRig) -> None:
    assert 200 == bot.push(nonce="same")[0]
    bot.now = at(4)
    assert (401, "replayed request (nonce already used)") == bot.push(nonce="same", sent=START)
    assert [(NODE, "replayed request (nonce already used)")] == bot.refused


def test_nonces_are_forgotten_once_their_timestamp_would_be_refused_anyway(bot: IngestRig) -> None:
    """Replay protection needs no memory beyond the timestamp window."""
    for k in range(20):
        bot.now = at(k)
        assert 200 == bot.push(nonce=f"n{k}")[0]
    # Pushes of the last five minutes (the timestamp window) are all it still remembers.
    assert 6 == len(bot.ingest._nonces[NODE])


def test_a_node_pushing_too_often_is_slowed_down(bot: IngestRig) -> None:
    bot.ingest.max_nonces = 3
    assert [200, 200, 200, 429] == [bot.push(nonce=f"n{k}")[0] for k in range(4)]


def test_a_body_that_is_not_samples_is_a_400(bot: IngestRig) -> None:
    status, message = bot.push(b'{"version": 1, "samples": [{"node": 1}]}')
    assert 400 == status
    assert message.startswith("malformed samples: samples[0].")


def test_samples_for_another_node_are_refused(bot: IngestRig) -> None:
    status, message = bot.push(to_json([a_sample(), a_sample(node="l40s-node-01")]))
    assert (403, "samples for another node: l40s-node-01") == (status, message)
    assert not bot.telemetry.readings(START)


def test_samples_move_onto_the_bot_clock(bot: IngestRig) -> None:
    """A node whose clock lags two minutes is not read as two minutes stale."""
    bot.now = at(2)
    bot.push(to_json([a_sample(taken_at=START)]), sent=START)
    assert at(2) == bot.telemetry.gpu(NODE, 0, at(2)).last_seen


def test_pushes_a_moment_apart_across_a_second_keep_their_order(bot: IngestRig) -> None:
    """The timestamp is in whole seconds: a clock that agrees with the bot's is not corrected
    by the fraction of a second since the stamp's, or the later push would be shifted before
    the earlier one and dropped as not newer."""
    first, then = at(seconds=10.9), at(seconds=11.1)
    bot.now = first
    assert 200 == bot.push(to_json([a_sample(taken_at=first)]), sent=first, nonce="n-1")[0]
    bot.now = then
    status, answer = bot.push(to_json([a_sample(taken_at=then)]), sent=then, nonce="n-2")
    assert (200, 1) == (status, json.loads(answer)["taken"])
    assert then == bot.telemetry.gpu(NODE, 0, then).last_seen


def test_a_failing_on_refused_does_not_change_the_answer(bot: IngestRig) -> None:
    def broken(node: str, reason: str) -> None:
        raise RuntimeError("audit is down")

    bot.ingest.on_refused = broken
    assert (401, "bad signature") == bot.push(token="f" * 32)


def test_the_tokens_file_maps_nodes_to_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"{NODE}: {TOKEN}\nl40s-node-01: '{'1' * 32}'\n")
    assert {NODE: TOKEN, "l40s-node-01": "1" * 32} == load_tokens(path)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (None, "cannot read the agent tokens"),
        ("- a\n- b\n", "expected a mapping"),
        (f"{NODE}: short\n", "shorter than 16 characters"),
        (f"{NODE}: 12345678901234567890\n", "must be strings"),
        (f"{NODE}: [\n", "not YAML"),
    ],
)
def test_a_bad_tokens_file_is_one_clear_line(tmp_path: Path, text: str | None, words: str) -> None:
    path = tmp_path / "tokens.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TokenFileError) as caught:
        load_tokens(path)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_push_is_answered_with_the_nodes_orders_and_results_are_handed_on(bot: IngestRig) -> None:
    """The orders callback's orders ride on the 200; signed results reach the results callback."""
    handed: list[tuple[str, int, list[dict[str, Any]]]] = []
    bot.ingest.orders = lambda node: [{"id": 7, "lease": 3}]
    bot.ingest.results = lambda node, order, results: handed.append((node, order, results))
    status, message = bot.push()
    expires = int((START + timedelta(minutes=10)).timestamp())
    order = {"id": 7, "lease": 3, "node": NODE, "expires": expires}
    signed = {**order, "signature": order_signature(TOKEN, order)}
    assert (200, [signed]) == (status, json.loads(message)["orders"])
    body = json.dumps({"order": 7, "results": [{"pid": 42, "outcome": "gone"}]}).encode()
    assert 200 == bot.push(body, path="results", nonce="n-2")[0]
    assert [(NODE, 7, [{"pid": 42, "outcome": "gone"}])] == handed


def test_results_are_signed_malformed_ones_and_refused_ones_turned_away(bot: IngestRig) -> None:
    """Same signature and replay checks as samples; 400 on a bad body; 409 when refused."""
    bot.ingest.results = lambda node, order, results: f"no order {order} for {node}"
    body = json.dumps({"order": 9, "results": []}).encode()
    assert 401 == bot.push(body, path="results", token="f" * 32)[0]
    assert (409, "no order 9 for a100-node-01") == bot.push(body, path="results", nonce="a")
    assert 401 == bot.push(body, path="results", nonce="a")[0]  # replayed
    status, message = bot.push(b'{"order": "x"}', path="results", nonce="b")
    assert (400, "malformed results: order: expected an integer id") == (status, message)
