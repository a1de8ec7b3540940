"""The node agent end to end: `gpubot agent --once --simulated ...` pushes over real HTTP to the
real ASGI app (uvicorn on loopback), and the samples land in Telemetry; wrong tokens and
replayed requests are refused and reported."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slack_bolt import App
from typer.testing import CliRunner

from bot.agent import AgentError, run_agent
from bot.cli import app as cli
from bot.server import Background, SlackAsgi, free_port
from bot.telemetry.ingest import Ingest
from bot.telemetry.model import sign, to_json
from bot.telemetry.window import Telemetry
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
    telemetry: Telemetry
    refused: list[tuple[str, str]] = field(default_factory=list)

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
    telemetry = Telemetry(stale_after=timedelta(minutes=3))
    refused: list[tuple[str, str]] = []
    ingest = Ingest({NODE: TOKEN}, telemetry, on_refused=lambda n, r: refused.append((n, r)))
    http = Background(SlackAsgi(slack_app(), lambda: {"ok": True}, ingest=ingest))
    yield Served(http.url, telemetry, refused)
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
        ("http://bot", {"simulated": FLEETS / "default.yaml"}, "several nodes: name one"),
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
    ingest = Ingest({NODE: TOKEN}, Telemetry(stale_after=timedelta(minutes=3)))
    asgi = SlackAsgi(slack_app(), lambda: {"ok": True}, ingest=ingest)
    assert 401 == asyncio.run(_asgi_post(asgi, "/agent/samples"))
