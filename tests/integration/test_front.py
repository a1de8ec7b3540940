"""The front door at /slack/events: a retried or replayed request is acknowledged and never run
twice, and what anyone can send unsigned is refused in one counted, rate-limited log line."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from bot.localslack import LocalSlack, payloads
from bot.localslack.signing import FORM, JSON_CONTENT, sign
from bot.main import Bot, assemble
from bot.server import Background, SlackAsgi
from storage.tables import InboxRow, RequestRow
from tests.integration.conftest import SECRET, settings_for

ALICE = "U0ALICE01"


@pytest.fixture
def front(local: LocalSlack, tmp_path: Path) -> Iterator[tuple[Bot, SlackAsgi, str]]:
    bot = assemble(settings_for(local, tmp_path))
    asgi = SlackAsgi(bot.app, bot.health, ready=bot.ready)
    http = Background(asgi)
    yield bot, asgi, http.url + "/slack/events"
    http.stop()
    bot.close()


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code)


def _signed(body: bytes, content_type: str = FORM, **extra: str) -> dict[str, str]:
    return {**sign(body, SECRET, int(time.time()), content_type=content_type), **extra}


def test_a_command_sent_again_by_slack_is_acked_and_not_run_twice(
    front: tuple[Bot, SlackAsgi, str], local: LocalSlack
) -> None:
    """The same signed bytes, again with X-Slack-Retry-Num, then replayed later: one request,
    one answer."""
    bot, _, url = front
    token = local.workspace.tokens.issue_response_url("C0GPU", ALICE)
    form = payloads.slash_command(
        ALICE,
        "borrow 1 l40s for 1h because once",
        "C0GPU",
        "/gpu",
        response_url=local.response_url(token),
        trigger_id="1.2.3",
    )
    body = urllib.parse.urlencode(form).encode()
    assert 200 == _post(url, body, _signed(body))
    assert 200 == _post(url, body, _signed(body, **{"X-Slack-Retry-Num": "1"}))
    assert 200 == _post(url, body, _signed(body))
    bot.inbox.wait_idle()
    with bot.db.read() as session:
        assert 1 == len(session.exec(select(RequestRow)).all())
        assert 1 == len(session.exec(select(InboxRow)).all())
    local.wait_for("response_url", lambda a: "R1" in json.dumps(a), timeout=10)
    time.sleep(0.2)
    assert 1 == len([c for c in local.calls.of("response_url") if c.target == token])


def test_an_event_slack_retries_is_carried_out_once(
    front: tuple[Bot, SlackAsgi, str], local: LocalSlack
) -> None:
    """app_home_opened twice with one event_id (a retry): the Home tab is published once."""
    bot, _, url = front
    event = payloads.app_home_opened(ALICE, channel=local.dm_channel(ALICE))
    body = json.dumps(event).encode()
    again = dict(event, event_time=int(event.get("event_time") or 0) + 1)  # same event_id
    again_body = json.dumps(again).encode()
    assert 200 == _post(url, body, _signed(body, JSON_CONTENT))
    assert 200 == _post(
        url, again_body, _signed(again_body, JSON_CONTENT, **{"X-Slack-Retry-Num": "1"})
    )
    bot.inbox.wait_idle()
    local.wait_for("views.publish", timeout=10)
    time.sleep(0.2)
    assert 1 == len(local.calls.of("views.publish"))


def test_unsigned_requests_are_refused_counted_and_logged_once_a_minute(
    front: tuple[Bot, SlackAsgi, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Three hundred forged requests: 401 each, one warning line, all counted, no traceback."""
    _, asgi, url = front
    body = b"command=%2Fgpu&user_id=U0ALICE01&text=status"
    forged = {**_signed(body), "X-Slack-Signature": "v0=" + "0" * 64}
    with caplog.at_level(logging.WARNING):
        statuses = {_post(url, body, forged) for _ in range(300)}
        assert {400} == {_post(url, b"\xff\xfe", _signed(b"\xff\xfe"))}
    assert {401} == statuses
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 2 == len(lines)  # one per reason: the signature, the encoding
    assert not [r for r in caplog.records if r.exc_info]
    assert {"bad-signature": 300, "not-utf-8": 1} == asgi.refused.totals()
