"""People: names and zones from users.info on the local Slack API, looked up once each."""

from __future__ import annotations

from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest
from slack_sdk import WebClient

from bot.localslack import BOT_TOKEN, LocalSlack
from bot.slack.people import People, Zone
from bot.workspace.launch import PROXY_VARIABLES

ALICE, VICTOR = "U0ALICE01", "U0VMGR001"


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalSlack]:
    for name in PROXY_VARIABLES:  # slack_sdk would send loopback calls to a proxy
        monkeypatch.delenv(name, raising=False)
    with LocalSlack() as server:
        yield server


def test_a_handle_is_not_a_name_so_the_full_name_is_shown(local: LocalSlack) -> None:
    """The local workspace's display names are handles ("alice"): People says "Alice Anders"."""
    people = People(WebClient(token=BOT_TOKEN, base_url=local.api_url))
    assert "Alice Anders" == people.name(ALICE)
    assert Zone(ZoneInfo("America/New_York"), True) == people.zone(VICTOR)
    assert "gpubot" == people.label("gpubot")
    assert 2 == len(local.calls.of("users.info"))  # each person once, cached


def test_known_names_never_ask_slack_and_warm_asks_once(local: LocalSlack) -> None:
    people = People(WebClient(token=BOT_TOKEN, base_url=local.api_url))
    text = f"by <@{ALICE}> and <@{VICTOR}>"
    assert text == people.known_names(text)
    assert [] == local.calls.of("users.info")
    people.warm(text + f" <@{ALICE}>")
    assert "by Alice Anders and Victor Vision" == people.known_names(text)
    assert 2 == len(local.calls.of("users.info"))


def test_a_chosen_display_name_wins_over_the_full_name() -> None:
    """A display name someone chose (not their handle) is what they are called."""

    class Directory(WebClient):
        def users_info(self, **kwargs: object) -> dict[str, object]:  # type: ignore[override]
            user = {"name": "vv", "real_name": "Victor Vision", "tz": "Europe/Paris"}
            return {"user": user | {"profile": {"display_name": "Vic"}}}

    assert "Vic" == People(Directory()).name(VICTOR)
