"""Node agents' pushes with replicas: two real `gpubot serve` processes on one PostgreSQL with
GPUBOT_TELEMETRY=agents. A push that reaches the follower is taken by the leader (its sweep is
the one that reads samples) and answered with the leader's answer; a replayed push is still
refused; a forwarded push is never sent on again; with the leader killed, the follower, once it
leads, takes the pushes itself. The election's record of the leader's address is also driven
step by step.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.forward import FORWARDED
from bot.leader import Leader
from bot.localslack import LocalSlack
from bot.telemetry.model import Sample, sign, to_json
from tests.integration.test_replicas import _await_leader, _election_db, _health
from tests.support.serve import Served

pytestmark = pytest.mark.postgres

NODE = "a100-node-01"
TOKEN = "4f1c2b9e7d3a5c6e8f0a1b2c3d4e5f60"  # noqa: S105 - a test fixture, not a credential
FORWARDING_S = 15.0  # a liveness bound: a follower reads the leader's address every 2 s


def samples_now() -> bytes:
    return to_json(
        [
            Sample(
                node=NODE,
                index=index,
                uuid=f"GPU-{NODE}-{index}",
                model="NVIDIA A100-SXM4-80GB",
                memory_total_mib=81920,
                memory_used_mib=1000,
                util_pct=0.0,
                temperature_c=35.0,
                power_w=60.0,
                health="ok",
                processes=(),
                taken_at=datetime.now(UTC),
            )
            for index in range(8)
        ]
    )


def signed(body: bytes, nonce: str | None = None) -> dict[str, str]:
    """The headers the node agent sends with `body`."""
    stamp, nonce = str(int(time.time())), nonce or secrets.token_hex(16)
    return {
        "Content-Type": "application/json",
        "X-Gpubot-Node": NODE,
        "X-Gpubot-Timestamp": stamp,
        "X-Gpubot-Nonce": nonce,
        "X-Gpubot-Signature": sign(TOKEN, stamp, nonce, body),
    }


def push(served: Served, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(  # noqa: S310 - a loopback URL
        served.url + "/agent/samples", data=body, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def forwarding(served: Served) -> dict[str, int]:
    report = _health(served) or {}
    counts = report.get("agent_forwarding", {})
    assert isinstance(counts, dict), report
    return {str(k): int(v) for k, v in counts.items()}


def refused(served: Served, reason: str) -> int:
    report = _health(served) or {}
    totals = report.get("agent_refused", {})
    assert isinstance(totals, dict), report
    return sum(int(v) for k, v in totals.items() if reason in str(k))


@pytest.fixture
def replicas(local: LocalSlack, tmp_path: Path, postgres_url: str) -> Iterator[list[Served]]:
    """Two `gpubot serve --http` taking node agents' pushes on one PostgreSQL. Each advertises
    its default address: the loopback one it listens on."""
    tokens = tmp_path / "agent-tokens.yaml"
    tokens.write_text(f"{NODE}: {TOKEN}\n")
    env = {"GPUBOT_TELEMETRY": "agents", "GPUBOT_AGENT_TOKENS_FILE": str(tokens)}
    both = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        both.append(Served(local, tmp_path / name, database_url=postgres_url, env=env))
    try:
        for served in both:
            served.launch(["serve", "--http", "--port", str(served.port)])
        for served in both:
            served.wait("/livez", 90)
        yield both
    finally:
        for served in both:
            served.stop()


@pytest.mark.slow
def test_a_push_to_the_follower_is_taken_by_the_leader(replicas: list[Served]) -> None:
    """Forwarded as signed and answered by the leader, whose ingest took the samples (its
    /healthz counts what it received); a replay is refused by the leader; a forwarded push is
    not sent on again; with the leader killed the follower, once it leads, takes the pushes
    itself."""
    leader, epoch = _await_leader(replicas)
    [follower] = [served for served in replicas if served is not leader]

    # The follower reads the leader's address within a round or two; until then it keeps.
    deadline = time.monotonic() + FORWARDING_S
    while True:
        body = samples_now()
        headers = signed(body)
        status, answer = push(follower, body, headers)
        assert 200 == status, answer
        if forwarding(follower)["forwarded"] == 1:
            break
        assert time.monotonic() < deadline, f"never forwarded: {follower.log_tail()}"
        time.sleep(0.3)
    assert (8, []) == (json.loads(answer)["taken"], json.loads(answer)["orders"])
    assert 1 == forwarding(leader)["received"]

    # The same request again, through either replica: the leader spent its nonce.
    assert 401 == push(follower, body, headers)[0]
    assert 401 == push(leader, body, headers)[0]
    assert 2 == refused(leader, "replayed")
    assert 0 == refused(follower, "replayed")

    # Marked as forwarded already: taken where it arrived, never sent on a second time.
    again = samples_now()
    before = forwarding(follower)
    marked = {**signed(again), FORWARDED: "http://127.0.0.1:1"}
    assert 200 == push(follower, again, marked)[0]
    after = forwarding(follower)
    assert (before["forwarded"], before["received"] + 1) == (after["forwarded"], after["received"])
    assert 2 == forwarding(leader)["received"]  # the replay it was sent; not the marked one

    # kill -9 the leader: the follower takes the pushes itself (while it cannot reach the
    # leader, and once it leads).
    leader.kill()
    body = samples_now()
    status, answer = push(follower, body, signed(body))
    assert (200, 8) == (status, json.loads(answer)["taken"])
    _await_leader([follower], after=epoch)
    body = samples_now()
    status, answer = push(follower, body, signed(body))
    assert (200, 8) == (status, json.loads(answer)["taken"])
    assert forwarding(follower)["forwarded"] == after["forwarded"]
    assert follower.log_text().count("cannot reach the leader") <= 1  # once, not per push


def test_a_follower_reads_where_the_leader_is_reached(postgres_url: str) -> None:
    """The leader records its address when it takes the lead and the follower reads it; a
    replica that leads forwards to nobody."""
    db = _election_db(postgres_url)
    a = Leader(db, "advisory", token="aaaa")
    b = Leader(db, "advisory", token="bbbb")
    a.address, b.address = "http://10.0.0.7:3000", "http://10.0.0.8:3000"
    try:
        a.step()
        b.step()
        assert (None, "http://10.0.0.7:3000") == (a.leader_url, b.leader_url)
        a.stop()  # a clean stop hands over (the server frees the lock as the session ends)
        for _ in range(50):
            b.step()
            if b.is_leader:
                break
            time.sleep(0.1)
        assert (True, None) == (b.is_leader, b.leader_url)
    finally:
        a.stop()
        b.stop()
        db.dispose()
