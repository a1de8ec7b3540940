"""What the local Slack received, counted the way the reliability tests judge it: answers per
response_url, and messages per outbox row (each carries its row id in its metadata)."""

from __future__ import annotations

import time
from collections import Counter

from bot.localslack import LocalSlack
from bot.localslack.calls import Call
from bot.localslack.driver import Reply


def token_of(reply: Reply) -> str:
    """The response_url token a command's answer goes to."""
    return (reply.response_url or "").rsplit("/", 1)[-1]


def answers_by_token(local: LocalSlack) -> Counter[str]:
    """How many answers each response_url took."""
    return Counter(c.target for c in local.calls.of("response_url") if c.status == 200)


def wait_for_answer(local: LocalSlack, reply: Reply, timeout_s: float = 30.0) -> Call:
    """The first answer to the command `reply` acknowledged."""
    token, deadline = token_of(reply), time.monotonic() + timeout_s
    while True:
        found = [c for c in local.calls.of("response_url") if c.target == token]
        if found:
            return found[0]
        assert time.monotonic() < deadline, "never answered"
        time.sleep(0.05)


def posted_per_outbox_row(local: LocalSlack) -> Counter[int]:
    """How often each outbox row's message is in the workspace."""
    posted: Counter[int] = Counter()
    for channel in list(local.workspace.channels):
        for message in local.workspace.messages(channel):
            payload = (message.metadata or {}).get("event_payload") or {}
            if isinstance(payload.get("outbox_id"), int):
                posted[payload["outbox_id"]] += 1
    return posted
