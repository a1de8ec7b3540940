"""The agent routes under attack: no headers and no bytes make the ingest raise or log a
traceback; each is a 4xx with its reason. Numbers, lists, strings and nesting are bounded,
samples must lie near the signed timestamp, and refusals are counted and logged sparingly."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from bot.telemetry.model import MAX_PROCESSES, MAX_SAMPLES, to_json
from tests.unit.telemetry.builders import NODE, START, TOKEN, IngestRig, a_process, a_sample, at

REFUSED = {400, 401, 403, 413, 429}


@pytest.fixture
def bot() -> IngestRig:
    return IngestRig()


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Fails the test if anything was logged at ERROR or with a traceback."""
    caplog.set_level(logging.INFO)
    yield caplog
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert [] == [r.getMessage() for r in bad]


def nonces() -> Iterator[str]:
    k = 0
    while True:
        k += 1
        yield f"n{k}"


HOSTILE_HEADERS: list[tuple[dict[str, Any], str]] = [
    ({"X-Gpubot-Timestamp": "²"}, "malformed X-Gpubot-Timestamp"),  # isdigit() says yes
    ({"X-Gpubot-Timestamp": "١٧٤١٩٤٢٨٠٠"}, "malformed X-Gpubot-Timestamp"),  # Arabic digits
    ({"X-Gpubot-Timestamp": "9" * 5000}, "malformed X-Gpubot-Timestamp"),  # past int()'s limit
    ({"X-Gpubot-Timestamp": "9" * 13}, "malformed X-Gpubot-Timestamp"),
    ({"X-Gpubot-Timestamp": "999999999999"}, "off the bot's clock"),
    ({"X-Gpubot-Timestamp": " 1741942800"}, "malformed X-Gpubot-Timestamp"),
    ({"X-Gpubot-Timestamp": "1741942800\n"}, "malformed X-Gpubot-Timestamp"),
    ({"X-Gpubot-Timestamp": "-1"}, "malformed X-Gpubot-Timestamp"),
    ({"X-Gpubot-Timestamp": b"1741942800"}, "malformed X-Gpubot-Timestamp"),
    ({"X-Gpubot-Signature": "v1=" + "é" * 64}, "bad signature"),  # compare_digest raised
    ({"X-Gpubot-Signature": "\xff" * 67}, "bad signature"),
    ({"X-Gpubot-Signature": "v1=" + "A" * 64}, "bad signature"),
    ({"X-Gpubot-Signature": ""}, "bad signature"),
    ({"X-Gpubot-Nonce": "ñ"}, "malformed X-Gpubot-Nonce"),
    ({"X-Gpubot-Nonce": "a\nb"}, "malformed X-Gpubot-Nonce"),
    ({"X-Gpubot-Nonce": "n" * 129}, "malformed X-Gpubot-Nonce"),
    ({"X-Gpubot-Nonce": "\udcff"}, "malformed X-Gpubot-Nonce"),  # a lone surrogate
    ({"X-Gpubot-Node": NODE + "\r\nX-Evil: 1"}, "unknown node"),
    ({"X-Gpubot-Node": "\udcff\x00" * 1000}, "unknown node"),
    ({"X-Gpubot-Node": NODE.encode()}, "unknown node"),
]


@pytest.mark.parametrize(("headers", "reason"), HOSTILE_HEADERS)
@pytest.mark.parametrize("path", ["samples", "results"])
def test_hostile_headers_are_refused_with_401_never_raised(
    bot: IngestRig,
    no_tracebacks: pytest.LogCaptureFixture,
    headers: dict[str, Any],
    reason: str,
    path: str,
) -> None:
    body = to_json([a_sample()])
    sent = {**bot.headers(body), **headers}
    handle = bot.ingest.handle if path == "samples" else bot.ingest.handle_results
    status, message = handle(sent, body)
    assert (401, True) == (status, reason in message)
    assert {} == bot.telemetry.readings(START)


def document(change: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(to_json([a_sample(processes=(a_process(started=1.7e9),))]))
    change(data)
    return json.dumps(data).encode()


def sample(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["samples"][0].update(fields)


def process(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["samples"][0]["processes"][0].update(fields)


def raw(text: str) -> Callable[[dict[str, Any]], None]:
    """Swap the util_pct value for raw JSON text (what json.dumps would never write)."""
    return lambda d: d["samples"][0].update(util_pct=f"@@{text}@@")


def document_raw(change: Callable[[dict[str, Any]], None]) -> bytes:
    text = document(change).decode()
    start, end = text.index('"@@'), text.index('@@"') + 3
    return (text[:start] + text[start + 3 : end - 3] + text[end:]).encode()


HOSTILE_BODIES: list[tuple[bytes, str]] = [
    (b"\xff\xfe{", "not JSON"),
    (b'{"version": 1, "samples": [', "not JSON"),
    (b"[" * 100_000, "nested deeper than 8"),
    (b'{"version":1,"samples":[],"x":' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper"),
    (document_raw(raw("NaN")), "not JSON: NaN is not a number"),
    (document_raw(raw("-Infinity")), "not JSON: -Infinity is not a number"),
    (document_raw(raw("1e999")), "samples[0].util_pct: expected 0 to 100, got inf"),
    (document_raw(raw("9" * 5000)), "not JSON"),
    (document_raw(raw("9" * 400)), "samples[0].util_pct: expected 0 to 100, got 999"),
    (document(sample(util_pct=101)), "samples[0].util_pct: expected 0 to 100, got 101"),
    (document(sample(index=10**30)), "samples[0].index: expected 0 to 1023"),
    (document(sample(index=-1)), "samples[0].index: expected 0 to 1023, got -1"),
    (document(sample(memory_total_mib=2**40)), "samples[0].memory_total_mib: expected 0 to"),
    (document(sample(power_w=-5)), "samples[0].power_w: expected 0 to"),
    (document(sample(uuid="x" * 1000)), "samples[0].uuid: longer than 128 characters"),
    (document(sample(error="e" * 5000)), "samples[0].error: longer than 1000 characters"),
    (document(sample(taken_at="x" * 100)), "samples[0].taken_at: longer than 64"),
    (document(sample(taken_at="9999-12-31T23:59:59-01:00")), "samples[0].taken_at: out of range"),
    (document(process(pid=2**31)), "processes[0].pid: expected 1 to 4.1943"),
    (document(process(pid=0)), "processes[0].pid: expected 1 to 4.1943"),
    (document(process(started=-1.0)), "processes[0].started: expected 0 to"),
    (document(process(user="u" * 65)), "processes[0].user: longer than 64 characters"),
    (
        document(lambda d: d.update(samples=d["samples"] * (MAX_SAMPLES + 1))),
        f"samples: at most {MAX_SAMPLES} in one push, got {MAX_SAMPLES + 1}",
    ),
    (
        document(lambda d: d["samples"][0].update(processes=[{"pid": 1}] * (MAX_PROCESSES + 1))),
        f"samples[0].processes: at most {MAX_PROCESSES}, got {MAX_PROCESSES + 1}",
    ),
]


@pytest.mark.parametrize(("body", "reason"), HOSTILE_BODIES, ids=lambda v: str(v)[:40])
def test_a_signed_hostile_body_is_a_400_naming_the_problem(
    bot: IngestRig, no_tracebacks: pytest.LogCaptureFixture, body: bytes, reason: str
) -> None:
    """Signed by the node, so it gets past the signature to the parser: still only a 400."""
    status, message = bot.push(body)
    assert (400, True) == (status, reason in message), message
    assert message.startswith("malformed samples: ")
    assert len(message) < 300
    assert {} == bot.telemetry.readings(START)


HOSTILE_RESULTS: list[tuple[object, str]] = [
    ({"order": 2**63, "results": []}, "order: expected an integer id"),
    ({"order": 0, "results": []}, "order: expected an integer id"),
    ({"order": 1.5, "results": []}, "order: expected an integer id"),
    ({"order": 1, "results": [{"pid": 0, "outcome": "gone"}]}, "results[0].pid: expected 1 to"),
    ({"order": 1, "results": [{"pid": 2**40, "outcome": "x"}]}, "results[0].pid: expected 1"),
    ({"order": 1, "results": [{"pid": 5, "outcome": 7}]}, "results[0].outcome: expected str"),
    ({"order": 1, "results": [{"pid": 5}] * 1025}, "results: at most 1024, got 1025"),
    ({"order": 1, "results": [[[[[[[[[[]]]]]]]]]]}, "nested deeper than 8"),
]


@pytest.mark.parametrize(("document", "reason"), HOSTILE_RESULTS)
def test_hostile_results_are_a_400(
    bot: IngestRig, no_tracebacks: pytest.LogCaptureFixture, document: object, reason: str
) -> None:
    recorded: list[int] = []
    bot.ingest.results = lambda node, order, results: recorded.append(order)
    status, message = bot.push(json.dumps(document).encode(), path="results")
    assert (400, True) == (status, reason in message), message
    assert [] == recorded


def test_a_body_over_the_limit_is_a_413_before_anything_is_parsed(bot: IngestRig) -> None:
    bot.ingest.max_body = 1000
    body = to_json([a_sample()] * 10)
    assert (413, "body over 1000 bytes") == bot.push(body)


def test_random_bytes_and_headers_are_always_a_refusal(
    bot: IngestRig, no_tracebacks: pytest.LogCaptureFixture
) -> None:
    """A seeded fuzz: random headers of random characters and random bodies, then genuine
    pushes with a few bytes flipped and signed again, so they reach the parser."""
    rng = random.Random(20260301)
    names = ["X-Gpubot-Node", "X-Gpubot-Timestamp", "X-Gpubot-Nonce", "X-Gpubot-Signature"]
    alphabet = [chr(c) for c in (*range(0, 128), 0xA0, 0xFF, 0xB2, 0x663, 0xDCFF, 0x1F600)]
    for _ in range(300):
        headers = {
            name: "".join(rng.choices(alphabet, k=rng.randint(0, 20)))
            for name in rng.sample(names, rng.randint(0, 4))
        }
        body = rng.randbytes(rng.randint(0, 200))
        assert bot.ingest.handle(headers, body)[0] in REFUSED
        assert bot.ingest.handle_results(headers, body)[0] in REFUSED
    genuine = bytearray(to_json([a_sample(processes=(a_process(started=1.7e9),))]))
    statuses = set()
    for k in range(300):
        mutated = bytearray(genuine)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        status, _ = bot.push(bytes(mutated), nonce=f"f{k}")
        statuses.add(status)
    assert statuses <= REFUSED | {200}
    assert 400 in statuses


def test_a_push_from_the_year_9999_is_refused_and_genuine_pushes_keep_working(
    bot: IngestRig,
) -> None:
    """Signed and well formed, but not taken near its signed timestamp: refused with the
    reason. It used to stand as the GPU's newest sample until restart."""
    far = START.replace(year=9999)
    status, message = bot.push(to_json([a_sample(taken_at=far)]), nonce="far")
    assert 400 == status
    assert message.startswith("samples[0].taken_at is +")
    assert message.endswith("s from the request's timestamp (limit 300 s)")
    for k in range(1, 4):
        bot.now = at(k)
        status, message = bot.push(nonce=f"n{k}")
        assert (200, 1) == (status, json.loads(message)["taken"])
    reading = bot.telemetry.gpu(NODE, 0, at(3))
    assert (True, at(3), 2 * timedelta(minutes=1)) == (
        reading.fresh,
        reading.last_seen,
        reading.idle_for,
    )


@pytest.mark.parametrize(
    "off", [timedelta(minutes=-5, seconds=-1), timedelta(minutes=5, seconds=1)]
)
def test_a_sample_taken_more_than_the_skew_from_its_timestamp_is_refused(
    bot: IngestRig, off: timedelta
) -> None:
    status, message = bot.push(to_json([a_sample(taken_at=START + off)]))
    assert (400, f"{off.total_seconds():+.0f} s") == (status, message.split(" is ")[1][:6])


def test_refusals_are_counted_by_reason_and_logged_once_a_minute_per_sender(
    bot: IngestRig, caplog: pytest.LogCaptureFixture
) -> None:
    """500 forged pushes as a known node and 500 as unknown ones: two log lines, not 1000;
    the next minute's first refusal says how many went unlogged. Unknown nodes all count as
    one sender, whatever names they claim."""
    caplog.set_level(logging.WARNING, logger="bot.telemetry.refusals")
    for k in range(500):
        bot.push(token="f" * 32, nonce=f"a{k}")
        bot.push(node=f"gpu-{k}", nonce=f"b{k}")
    lines = [r.getMessage() for r in caplog.records]
    assert 2 == len(lines)
    assert {"bad-signature": 500, "unknown-node": 500} == bot.ingest.refusals.totals()
    bot.now = at(1, 1)
    bot.push(token="f" * 32, nonce="c")
    bot.push(node="gpu-x", nonce="d")
    assert [
        "agent request from 'a100-node-01' refused (401): bad signature; "
        "499 more refused since its last line",
        "agent request from 'gpu-x' refused (401): unknown node; "
        "499 more refused since its last line",
    ] == [r.getMessage() for r in caplog.records][2:]
    assert 501 == len(bot.refused)  # the known node's, for the (aggregating) audit
    assert {NODE} == {node for node, _ in bot.refused}


def test_the_log_line_of_a_refusal_is_one_line_whatever_was_sent(
    bot: IngestRig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.telemetry.refusals")
    bot.push(node="evil\nINFO forged line" + "x" * 500)
    body = to_json([a_sample(), a_sample(node="l40s\nnode")])
    bot.push(body, nonce="n-2")
    messages = [r.getMessage() for r in caplog.records]
    assert 2 == len(messages)
    assert all("\n" not in m and len(m) < 500 for m in messages)


def test_a_nonce_store_that_fails_is_a_503_and_burns_nothing(bot: IngestRig) -> None:
    """The agent retries a 503; the nonce was not spent, so nothing is lost."""
    spent: set[tuple[str, str]] = set()
    broken = [True]

    def spend(node: str, nonce: str, expires_at: object) -> bool:
        if broken[0]:
            raise OSError("database is down")
        fresh = (node, nonce) not in spent
        spent.add((node, nonce))
        return fresh

    bot.ingest.spend = spend
    assert (503, "cannot record the request now; try again") == bot.push()
    assert [] == bot.refused  # our failure, not the agent's
    broken[0] = False
    assert 200 == bot.push()[0]
    bot.ingest._nonces.clear()  # a restart: only the store remembers
    assert (401, "replayed request (nonce already used)") == bot.push()


def test_a_failing_results_callback_is_a_503(bot: IngestRig) -> None:
    def broken(node: str, order: int, results: object) -> str | None:
        raise OSError("database is down")

    bot.ingest.results = broken
    body = json.dumps({"order": 9, "results": []}).encode()
    assert (503, "cannot record the results now") == bot.push(body, path="results")


def test_an_order_that_cannot_be_signed_is_left_out_and_the_rest_delivered(
    bot: IngestRig,
) -> None:
    bot.ingest.orders = lambda node: [{"id": 1, "x": float("nan")}, {"id": 2}]
    status, message = bot.push()
    assert (200, [2]) == (status, [o["id"] for o in json.loads(message)["orders"]])
    assert TOKEN not in message
