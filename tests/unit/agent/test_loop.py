"""The node agent end to end: `gpubot agent --once --simulated ...` pushes over real HTTP to the
real ASGI app (uvicorn on loopback), and the samples land in the TelemetryWindow; wrong tokens and
replayed requests are refused and reported; the bot's signed orders are carried out on real
child processes, and unsigned, forged, expired, other-node and malformed ones never are."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slack_bolt import App
from typer.testing import CliRunner

from bot.agent.loop import Agent, AgentError, run_agent
from bot.cli.app import app as cli
from bot.server import Background, SlackAsgi, free_port
from bot.telemetry.agent_push import Ingest
from bot.telemetry.fleet_file import load_fleet
from bot.telemetry.model import sign, sign_order, to_json
from bot.telemetry.procs import Owner, ProcReader
from bot.telemetry.simulated import SimulatedSource
from bot.telemetry.window import TelemetryWindow
from tests.unit.agent.builders import AGENT_MIN_UID, sleeper
from tests.unit.telemetry.builders import FLEETS, a_sample

NODE = "a100-node-01"
TOKEN = "9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"  # noqa: S105 - a test fixture, not a credential
FLEET = FLEETS / "a100-node.yaml"


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib would send even loopback requests to a proxy from the environment."""
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


def slack_app() -> App:
    # Any Bolt app will do: these tests are about the agent route next to it.
    return App(token="xoxb-test", signing_secret="not-a-secret", token_verification_enabled=False)


@dataclass
class Served:
    url: str
    telemetry: TelemetryWindow
    ingest: Ingest
    refused: list[tuple[str, str]] = field(default_factory=list)
    results: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)

    def post(self, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        # The URL is the loopback server of this test: http, never file: or custom schemes.
        url = self.url + "/agent/samples"
        request = urllib.request.Request(url, body, headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode()


@pytest.fixture
def served() -> Iterator[Served]:
    telemetry = TelemetryWindow(stale_after=timedelta(minutes=3))
    refused: list[tuple[str, str]] = []
    ingest = Ingest({NODE: TOKEN}, telemetry, on_refused=lambda n, r: refused.append((n, r)))
    served = Served("", telemetry, ingest, refused)

    def record(node: str, order: int, results: list[dict[str, Any]]) -> None:
        served.results.append((order, results))

    ingest.results = record
    http = Background(SlackAsgi(slack_app(), lambda: {"ok": True}, ingest=ingest))
    served.url = http.url
    yield served
    http.stop()


def token_file(tmp_path: Path, token: str = TOKEN) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return path


def test_agent_once_pushes_the_simulated_node_into_telemetry(
    served: Served, tmp_path: Path
) -> None:
    run_agent(served.url, token_file(tmp_path), node=NODE, once=True, simulated=FLEET)
    readings = served.telemetry.readings(datetime.now(UTC))
    assert {(NODE, i) for i in range(8)} == set(readings)
    assert all(r.fresh for r in readings.values())
    assert (94.0, "alice") == (readings[NODE, 0].util_pct, readings[NODE, 0].processes[0].user)
    assert [] == served.refused


def test_a_wrong_token_is_refused_with_401_and_reported(served: Served, tmp_path: Path) -> None:
    with pytest.raises(AgentError, match=r"refused the samples \(401\): bad signature"):
        run_agent(served.url, token_file(tmp_path, "f" * 32), node=NODE, once=True, simulated=FLEET)
    assert [(NODE, "bad signature")] == served.refused
    assert {} == served.telemetry.readings(datetime.now(UTC))


def test_a_replayed_request_is_refused(served: Served) -> None:
    body = to_json([a_sample(taken_at=datetime.now(UTC))])
    stamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Gpubot-Node": NODE,
        "X-Gpubot-Timestamp": stamp,
        "X-Gpubot-Nonce": "once-only",
        "X-Gpubot-Signature": sign(TOKEN, stamp, "once-only", body),
    }
    assert 200 == served.post(headers, body)[0]
    assert (401, "replayed request (nonce already used)") == served.post(headers, body)
    assert [(NODE, "replayed request (nonce already used)")] == served.refused


def test_a_rotated_token_file_is_picked_up_at_the_next_poll(served: Served, tmp_path: Path) -> None:
    path = token_file(tmp_path, "f" * 32)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        path.write_text(TOKEN)  # the operator fixes the token between two polls

    run_agent(served.url, path, node=NODE, simulated=FLEET, sleep=sleep, cycles=2)
    assert [(NODE, "bad signature")] == served.refused
    assert 1 == len(sleeps)
    assert served.telemetry.gpu(NODE, 0, datetime.now(UTC)).fresh


def test_an_unreachable_bot_is_retried_with_backoff_then_reported(tmp_path: Path) -> None:
    sleeps: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.raises(AgentError, match=r"\(no answer\): cannot reach"):
        run_agent(
            url, token_file(tmp_path), node=NODE, once=True, simulated=FLEET, sleep=sleeps.append
        )
    assert [1.0, 2.0, 4.0] == sleeps


@pytest.mark.parametrize(
    ("url", "options", "words"),
    [
        ("ftp://bot", {"node": NODE, "simulated": FLEET}, "must be an http:// or https:// URL"),
        ("http://bot", {"simulated": FLEETS / "lab-4-nodes.yaml"}, "several nodes: name one"),
        ("http://bot", {"node": "gpu-9", "simulated": FLEET}, "'gpu-9' is not in the fleet"),
        (
            "http://bot",
            {"node": NODE, "simulated": FLEETS / "no.yaml"},
            "cannot read the fleet file",
        ),
    ],
)
def test_a_misconfigured_agent_says_what_is_wrong(
    tmp_path: Path, url: str, options: dict[str, Any], words: str
) -> None:
    with pytest.raises(AgentError, match=re.escape(words)):
        run_agent(url, token_file(tmp_path), once=True, **options)


def test_the_cli_reports_a_missing_token_file_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["agent", "--bot-url", "http://127.0.0.1:9", "--token-file", str(tmp_path / "none"),
         "--once", "--simulated", str(FLEET), "--node", NODE],
    )  # fmt: skip
    assert 2 == result.exit_code
    assert (
        f"error: cannot read the token file {tmp_path / 'none'}: No such file or directory\n"
        == (result.stderr)
    )


def test_the_cli_refuses_an_interval_that_is_not_a_duration(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["agent", "--bot-url", "http://127.0.0.1:9", "--token-file", str(token_file(tmp_path)),
         "--interval", "often"],
    )  # fmt: skip
    assert (2, "error: --interval: expected a duration like 30s or 1m, got 'often'\n") == (
        result.exit_code,
        result.stderr,
    )


async def _asgi_post(asgi: SlackAsgi, path: str) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await asgi({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send)
    return int(sent[0]["status"])


def test_without_an_ingest_the_agent_route_does_not_exist() -> None:
    """The Slack-only server keeps its old shape: everything but Slack and health is 404."""
    assert 404 == asyncio.run(
        _asgi_post(SlackAsgi(slack_app(), lambda: {"ok": True}), "/agent/samples")
    )


def test_the_agent_route_answers_through_the_ingest() -> None:
    ingest = Ingest({NODE: TOKEN}, TelemetryWindow(stale_after=timedelta(minutes=3)))
    asgi = SlackAsgi(slack_app(), lambda: {"ok": True}, ingest=ingest)
    assert 401 == asyncio.run(_asgi_post(asgi, "/agent/samples"))


# ---- enforcement orders --------------------------------------------------------------------


def order_for(
    child: subprocess.Popen[bytes],
    *,
    token: str | None = TOKEN,
    node: str = NODE,
    expires_in: timedelta = timedelta(minutes=10),
    **fields: Any,
) -> dict[str, Any]:
    """Order 5 against `child` as the bot sends it: signed with `token` (None: unsigned)."""
    owner = ProcReader().owner(child.pid)
    target = {"gpu": 0, "pid": child.pid, "started": owner.started, "user": owner.user}
    order = {
        "id": 5,
        "lease": 1,
        "targets": [target],
        "term_grace_s": 5,
        "dry_run": False,
        "node": node,
        "expires": int((datetime.now(UTC) + expires_in).timestamp()),
        **fields,
    }
    return sign_order(token, order) if token is not None else order


@pytest.fixture
def agent(served: Served, tmp_path: Path) -> Iterator[Agent]:
    source = SimulatedSource(load_fleet(FLEET), datetime.now(UTC), node=NODE)
    yield Agent(served.url, token_file(tmp_path), NODE, source, min_uid=AGENT_MIN_UID)
    source.close()


def answer(*orders: object) -> str:
    return json.dumps({"ok": True, "taken": 8, "orders": list(orders)})


def running(child: subprocess.Popen[bytes]) -> bool:
    time.sleep(0.05)
    return child.poll() is None


def test_the_bots_signed_order_is_carried_out_and_its_results_reach_the_bot(
    served: Served, tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    """Push -> the bot answers with the pending order, signed for this node -> SIGTERM ->
    the results posted back, signed."""
    child = sleeper(children)
    pending = [{k: v for k, v in order_for(child).items() if k not in ("node", "signature")}]
    served.ingest.orders = lambda node: pending
    run_agent(
        served.url, token_file(tmp_path), node=NODE, once=True, simulated=FLEET,
        min_uid=AGENT_MIN_UID,
    )  # fmt: skip
    assert -15 == child.wait(timeout=5)
    assert [(5, [{"pid": child.pid, "outcome": "terminated"}])] == served.results


def tampered(order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "term_grace_s": 0}


REFUSED_ORDERS: list[tuple[Callable[[subprocess.Popen[bytes]], dict[str, Any]], str]] = [
    (lambda c: order_for(c, token=None), "refused: unsigned order"),
    (lambda c: {**order_for(c), "signature": 5}, "refused: unsigned order"),
    (lambda c: order_for(c, token="f" * 32), "refused: bad order signature"),
    (lambda c: tampered(order_for(c)), "refused: bad order signature"),
    (lambda c: {**order_for(c), "signature": "v1=é"}, "refused: bad order signature"),
    (
        lambda c: order_for(c, node="l40s-node-01"),
        "refused: order for another node ('l40s-node-01')",
    ),
    (lambda c: order_for(c, expires_in=timedelta(seconds=-1)), "refused: order expired"),
    (
        lambda c: order_for(c, expires_in=timedelta(days=2)),
        "refused: malformed order: expiry too far ahead",
    ),
    (
        lambda c: order_for(c, term_grace_s="30"),
        "refused: malformed order: term_grace_s: expected a number, got '30'",
    ),
]


@pytest.mark.parametrize(("make", "outcome"), REFUSED_ORDERS)
def test_an_order_the_bot_did_not_sign_for_this_node_now_is_refused_never_carried_out(
    agent: Agent,
    served: Served,
    children: list[subprocess.Popen[bytes]],
    make: Callable[[subprocess.Popen[bytes]], dict[str, Any]],
    outcome: str,
) -> None:
    """Refused and reported to the bot under the pids it names; the process runs on."""
    child = sleeper(children)
    posted = agent.enforce(answer(make(child)))
    assert [200] == [status for status, _ in posted]
    assert [(5, [{"pid": child.pid, "outcome": outcome}])] == served.results
    assert running(child)


def test_an_order_is_carried_out_once_however_often_it_comes(
    agent: Agent, served: Served, children: list[subprocess.Popen[bytes]]
) -> None:
    """A replayed answer (or a bot resending) does not signal twice."""
    child = sleeper(children)
    order = order_for(child, dry_run=True)
    agent.enforce(answer(order, order))
    agent.enforce(answer(order))
    assert [(5, [{"pid": child.pid, "outcome": "would signal"}])] == served.results


@pytest.mark.parametrize(
    "text",
    [
        "ok",
        "",
        "[]",
        '{"orders": 5}',
        '{"orders": [5, null, "x", {"id": true}, {"id": 1e30}, {"id": -1}, {"id": 2147483648}]}',
        '{"orders": [{"id": 3, "x": NaN}]}',
        "[" * 100_000,
        '{"orders": [{"id": 3, "signature": "v1=00", "targets": 7}]}',
        '{"orders": [{"id": 3, "targets": [{"pid": 99999999999}]}]}',
    ],
)
def test_no_answer_from_the_bot_makes_the_agent_fail(
    agent: Agent, served: Served, text: str
) -> None:
    """Nothing to carry out and nothing to report: logged, never raised."""
    assert [] == agent.enforce(text)
    assert [] == served.results


class FailingProcs(ProcReader):
    """A /proc reader that breaks on its first read, as a bug in it would."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def owner(self, pid: int) -> Owner:
        self.reads += 1
        if self.reads == 1:
            raise RuntimeError("a bug")
        return super().owner(pid)


def test_an_order_that_fails_is_reported_and_the_next_one_still_carried_out(
    served: Served, tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    source = SimulatedSource(load_fleet(FLEET), datetime.now(UTC), node=NODE)
    broken = Agent(
        served.url, token_file(tmp_path), NODE, source, procs=FailingProcs(),
        min_uid=AGENT_MIN_UID,
    )  # fmt: skip
    first, second = sleeper(children), sleeper(children)
    orders = order_for(first), order_for(second, id=6, dry_run=True)
    assert [200, 200] == [status for status, _ in broken.enforce(answer(*orders))]
    failed = "failed: the agent hit an error carrying it out; see its log"
    assert [
        (5, [{"pid": first.pid, "outcome": failed}]),
        (6, [{"pid": second.pid, "outcome": "would signal"}]),
    ] == served.results
    assert running(first)


def test_a_negative_min_uid_is_refused(tmp_path: Path) -> None:
    source = SimulatedSource(load_fleet(FLEET), datetime.now(UTC), node=NODE)
    with pytest.raises(AgentError, match="--min-uid must be 0 or more"):
        Agent("http://127.0.0.1:9", token_file(tmp_path), NODE, source, min_uid=-1)


def test_the_cli_takes_a_minimum_uid_and_refuses_a_negative_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["agent", "--bot-url", "http://127.0.0.1:9", "--token-file", str(token_file(tmp_path)),
         "--min-uid", "-1"],
    )  # fmt: skip
    assert (2, True) == (result.exit_code, "Invalid value for '--min-uid'" in result.stderr)
