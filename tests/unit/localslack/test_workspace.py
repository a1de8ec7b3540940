"""The workspace: a seed matching the rule files, Slack-shaped ts and ids, reset, snapshot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.localslack import Channel, Workspace

from .conftest import ADA, ALICE, BOB, VICTOR, Clock

ORG = Path(__file__).resolve().parents[3] / "rules" / "policies" / "org.yaml"


def test_default_seed_has_everyone_org_yaml_names() -> None:
    """Every person and approvals channel in org.yaml exists, with the bot in every channel."""
    org = yaml.safe_load(ORG.read_text(encoding="utf-8"))
    ws = Workspace.default()
    people = set(org["admins"]) | set(org["accounts"].values())
    channels = set()
    for team in org["teams"].values():
        people |= set(team["managers"]) | set(team["members"])
        if isinstance(team["approval"], dict):
            channels.add(team["approval"]["channel"])
    assert set() == people - set(ws.users)
    assert {"C0GPU", *channels} == set(ws.channels)
    assert all(ws.bot_user in channel.members for channel in ws.channels.values())


def test_approvals_channels_hold_their_managers_and_the_admin() -> None:
    """#vision-approvals is Victor's and Ada's; #gpu is everyone's."""
    ws = Workspace.default()
    vision = ws.channel("vision-approvals")
    assert vision is not None
    assert {VICTOR, ADA, ws.bot_user} == vision.members
    gpu = ws.channel("#gpu")
    assert gpu is not None
    assert set(ws.users) == gpu.members


def test_people_carry_timezones_and_admin_flags() -> None:
    """users.info needs tz, tz_offset and is_admin."""
    ws = Workspace.default()
    ada, bob = ws.user(ADA), ws.user(BOB)
    assert ada is not None
    assert bob is not None
    assert (True, "Europe/Berlin", 3600) == (ada.is_admin, ada.tz, ada.tz_offset)
    assert (False, "Europe/London", 0) == (bob.is_admin, bob.tz, bob.tz_offset)


def test_ts_is_slack_shaped_and_increases_even_on_a_stopped_clock() -> None:
    """A frozen clock still yields unique, increasing "<10 digits>.<6 digits>" stamps."""
    ws = Workspace.default(clock=Clock(1_795_966_298.5))
    stamps = [ws.post("C0GPU", f"m{n}").ts for n in range(3)]
    assert all(re.fullmatch(r"\d{10}\.\d{6}", ts) for ts in stamps)
    assert ["1795966298.500000", "1795966298.500001", "1795966298.500002"] == stamps


def test_dm_channel_is_opened_once_per_person() -> None:
    """The same D… id every time, with the person and the bot as members."""
    ws = Workspace.default()
    first = ws.dm_channel(ALICE)
    assert "D0ALICE01" == first
    assert first == ws.dm_channel(ALICE)
    dm = ws.channel(ALICE)
    assert dm is not None
    assert {ALICE, ws.bot_user} == dm.members


def test_reset_forgets_conversations_and_added_channels() -> None:
    """After reset only the seed is left."""
    ws = Workspace.default()
    ws.add_channel(Channel(id="C0EXTRA", name="extra"))
    ws.post(ws.dm_channel(ALICE), "hello")
    ws.tokens.issue_trigger(ALICE)
    ws.reset()
    assert ws.channel("C0EXTRA") is None
    assert [] == ws.messages("D0ALICE01")
    assert {} == ws.tokens.triggers


def test_records_handed_out_are_copies() -> None:
    """Changing a returned message does not change the workspace."""
    ws = Workspace.default()
    posted = ws.post("C0GPU", "original")
    posted.text = "changed"
    assert ["original"] == [m.text for m in ws.messages("C0GPU")]


def test_snapshot_is_plain_json() -> None:
    """A UI can serialise the whole state."""
    ws = Workspace.default()
    ws.post("C0GPU", "hello", [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}])
    ws.post_ephemeral("C0GPU", ALICE, "psst")
    ws.views.publish_home(ALICE, {"type": "home", "blocks": []})
    state = json.loads(json.dumps(ws.snapshot()))
    gpu = next(c for c in state["channels"] if c["id"] == "C0GPU")
    assert ["hello"] == [m["text"] for m in gpu["messages"]]
    assert ["psst"] == [e["text"] for e in state["ephemerals"]]
    assert "home" == state["homes"][ALICE]["type"]


def test_users_list_pages_through_everyone_by_id(client: WebClient) -> None:
    """limit=4: pages of four, each cursor taking up where the last page stopped; the last
    page's cursor is empty; an unknown cursor is refused as Slack refuses it."""
    seen: list[str] = []
    cursors: list[str] = []
    cursor = None
    while True:
        page = client.users_list(limit=4, cursor=cursor)
        seen += [member["id"] for member in page["members"]]
        cursor = page["response_metadata"]["next_cursor"]
        cursors.append(cursor)
        if not cursor:
            break
    everyone = sorted(u.id for u in Workspace.default().users.values())
    assert everyone == seen
    assert (len(everyone) + 3) // 4 == len(cursors)
    assert everyone == [m["id"] for m in client.users_list()["members"]]
    with pytest.raises(SlackApiError, match="invalid_cursor"):
        client.users_list(cursor="user:U0NOBODY")
