"""Thousands of random command texts through the real app: each gets a helpful answer, none an
error page, and the app's contract with Slack (limits, fallbacks) is never broken."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.localslack import InProcessTransport, LocalSlack, SlackDriver
from bot.main import Bot, assemble
from tests.integration.conftest import settings_for

WORDS = [
    "borrow",
    "extend",
    "release",
    "mine",
    "status",
    "quota",
    "queue",
    "why",
    "audit",
    "admin",
    "help",
    "pause",
    "drain",
    "a100",
    "l40s",
    "inference",
    "2",
    "0",
    "-1",
    "999",
    "for",
    "6h",
    "2d",
    "90m",
    "until",
    "fri",
    "18:00",
    "tomorrow",
    "priority",
    "high",
    "because",
    "all",
    "L1",
    "R1",
    "A1",
    "+2h",
    "vision",
    "x",
    "🙂",
    "<@U0BOB0001>",
    "&",
]


@pytest.fixture(scope="module")
def app_and_slack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Bot, LocalSlack]]:
    tmp: Path = tmp_path_factory.mktemp("random")
    with LocalSlack() as local:
        bot = assemble(settings_for(local, tmp))
        yield bot, local
        bot.close()


texts = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join),
)


@settings(
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(text=texts)
def test_every_command_text_gets_a_helpful_answer(
    app_and_slack: tuple[Bot, LocalSlack], text: str
) -> None:
    """A 200 with words for the person: in the ack, or after it through response_url."""
    bot, local = app_and_slack
    slack = SlackDriver(local, InProcessTransport(bot.app))
    before = len(local.calls.of("response_url"))
    reply = slack.command("U0CAROL01", text)
    assert 200 == reply.status, reply.body
    if not (reply.text or reply.blocks):
        if "borrow" == text.strip().lower():
            return  # the borrow form opens instead of a reply
        local.wait_for("response_url", lambda a: len(local.calls.of("response_url")) > before)
        answer = local.calls.of("response_url")[before].args
        assert answer.get("text"), json.dumps(answer)[:300]
        assert "Something went wrong" not in answer["text"]
    else:
        assert "Something went wrong" not in (reply.text or "")
    assert [] == local.violations
