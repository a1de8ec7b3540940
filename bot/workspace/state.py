"""What the page draws for one person: their conversations (ephemerals included), their Home tab
and open modal, the people they can act as, the demo clock and the fleet panel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.localslack import Channel, Ephemeral, Message
from bot.workspace.fleet_panel import fleet_panel

if TYPE_CHECKING:
    from bot.workspace.demo import Demo

DEFAULT_PERSON = "U0ALICE01"


def people(demo: Demo) -> list[dict[str, Any]]:
    """Everyone but the bot, with the role the rules give them."""
    policy = demo.bot.services.policy
    ws = demo.local.workspace
    with ws.lock:
        users = sorted(ws.users.values(), key=lambda u: u.real_name)
    out = []
    for user in users:
        if user.is_bot:
            continue
        team = policy.team_of(user.id)
        manages = [t.name for t in policy.teams.values() if user.id in t.managers]
        if policy.is_admin(user.id):
            role = "admin"
        elif manages:
            role = f"{manages[0]} manager"
        else:
            role = f"{team.name} researcher" if team else "guest"
        out.append({"id": user.id, "name": user.real_name, "handle": user.name, "role": role})
    return out


def page_state(demo: Demo, person: str) -> dict[str, Any]:
    ws = demo.local.workspace
    if ws.user(person) is None:
        person = DEFAULT_PERSON
    ws.dm_channel(person)  # the DM with the bot is there from the start, as in Slack
    with ws.lock:
        mine = [c for c in ws.channels.values() if person in c.members]
        conversations = [
            _conversation(ws.bot_user, c, ws.messages(c.id), ws.ephemerals(person, c.id))
            for c in sorted(mine, key=_order)
        ]
        names = {u.id: u.real_name for u in ws.users.values()}
        modals = ws.views.modals(person)
        home = ws.views.home(person)
    return {
        "me": person,
        "bot": ws.bot_user,
        "people": people(demo),
        "names": names,
        "conversations": conversations,
        "home": home,
        "modal": modals[-1] if modals else None,
        "clock": {
            "now": demo.clock.timestamp(),
            "offset_s": demo.clock.offset.total_seconds(),
            "forwarding": list(demo.progress) if demo.progress else None,
        },
        "fleet": fleet_panel(demo.bot),
    }


def _order(channel: Channel) -> tuple[int, str]:
    kind = (
        2 if channel.is_im else 3 if channel.id.startswith("G") else 1 if channel.is_private else 0
    )
    return kind, channel.name


def _conversation(
    bot_user: str, channel: Channel, messages: list[Message], ephemerals: list[Ephemeral]
) -> dict[str, Any]:
    items = [
        {
            "ts": m.ts,
            "user": m.user,
            "text": m.text,
            "blocks": m.blocks,
            "edited": m.edited,
            "ephemeral": False,
        }
        for m in messages
        if m.thread_ts in (None, m.ts)
    ]
    items += [
        {
            "ts": e.ts,
            "user": bot_user,
            "text": e.text,
            "blocks": e.blocks,
            "edited": False,
            "ephemeral": True,
        }
        for e in ephemerals
    ]
    kind = "dm" if channel.is_im else "group" if channel.id.startswith("G") else "channel"
    return {
        "id": channel.id,
        "name": channel.name,
        "kind": kind,
        "private": channel.is_private,
        "members": sorted(channel.members),
        "messages": sorted(items, key=lambda item: item["ts"]),
    }
