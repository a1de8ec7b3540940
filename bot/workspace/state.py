"""What the page draws for one person: their conversations (ephemerals and threads included, with
what they have not read yet), their Home tab and open modal, the people they can act as, the demo
clock and the fleet panel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bot.localslack import Channel, Ephemeral, File, Message
from bot.main import POLL_EVERY
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


def page_state(demo: Demo, person: str, reading: str = "") -> dict[str, Any]:
    """`reading` is the conversation on the person's screen: what is in it counts as read."""
    ws = demo.local.workspace
    if ws.user(person) is None:
        person = DEFAULT_PERSON
    ws.dm_channel(person)  # the DM with the bot is there from the start, as in Slack
    with ws.lock:
        mine = [c for c in ws.channels.values() if person in c.members]
        conversations = [
            _conversation(ws.bot_user, c, ws.messages(c.id), ws.ephemerals(person, c.id), ws.files)
            for c in sorted(mine, key=_order)
        ]
    for conversation in conversations:
        _mark_unread(demo.read_up_to, person, conversation, reading)
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
            "step_s": POLL_EVERY.total_seconds(),
            "forwards_done": demo.forwards_done,
            "forward_error": demo.forward_error,
        },
        "fleet": fleet_panel(demo.bot),
    }


def _order(channel: Channel) -> tuple[int, str]:
    kind = (
        2 if channel.is_im else 3 if channel.id.startswith("G") else 1 if channel.is_private else 0
    )
    return kind, channel.name


def _mark_unread(
    read_up_to: dict[tuple[str, str], str],
    person: str,
    conversation: dict[str, Any],
    reading: str,
) -> None:
    """Count what others wrote after the person last read the conversation, thread replies
    included; the conversation on their screen is read up to its newest message."""
    everything = conversation["messages"] + [
        reply for replies in conversation["threads"].values() for reply in replies
    ]
    key = (person, conversation["id"])
    if conversation["id"] == reading and everything:
        read_up_to[key] = max([read_up_to.get(key, ""), *(m["ts"] for m in everything)])
    last = read_up_to.get(key, "")
    conversation["unread"] = sum(1 for m in everything if m["user"] != person and m["ts"] > last)


def _message(m: Message, files: Mapping[str, File]) -> dict[str, Any]:
    shared = [files[f] for f in m.files if f in files and files[f].completed]
    return {
        "ts": m.ts,
        "user": m.user,
        "text": m.text,
        "blocks": m.blocks,
        "edited": m.edited,
        "ephemeral": False,
        "thread_ts": m.thread_ts if m.thread_ts != m.ts else None,
        "broadcast": m.reply_broadcast,
        "files": [_file(f) for f in shared],
    }


def _file(f: File) -> dict[str, Any]:
    """A shared file as the page draws it: an image inline, anything else as a download."""
    shown = f.as_json()
    return shown | {"url": f.path("/"), "image": f.mimetype.startswith("image/")}


def _ephemeral(bot_user: str, e: Ephemeral) -> dict[str, Any]:
    return {
        "ts": e.ts,
        "user": bot_user,
        "text": e.text,
        "blocks": e.blocks,
        "edited": False,
        "ephemeral": True,
        "thread_ts": e.thread_ts if e.thread_ts != e.ts else None,
        "broadcast": False,
    }


def _conversation(
    bot_user: str,
    channel: Channel,
    messages: list[Message],
    ephemerals: list[Ephemeral],
    files: Mapping[str, File],
) -> dict[str, Any]:
    """The channel's main list (replies sent to the channel too) and its threads, by the
    parent's ts, each parent with Slack's reply_count and latest_reply."""
    everything = sorted(
        [_message(m, files) for m in messages] + [_ephemeral(bot_user, e) for e in ephemerals],
        key=lambda item: str(item["ts"]),
    )
    parents = {item["ts"] for item in everything if item["thread_ts"] is None}
    threads: dict[str, list[dict[str, Any]]] = {}
    for item in everything:
        if item["thread_ts"] in parents:
            threads.setdefault(item["thread_ts"], []).append(item)
    items = [item for item in everything if item["thread_ts"] not in parents or item["broadcast"]]
    for item in items:
        replies = threads.get(item["ts"]) if item["thread_ts"] is None else None
        if replies:
            item["reply_count"] = len(replies)
            item["latest_reply"] = replies[-1]["ts"]
    kind = "dm" if channel.is_im else "group" if channel.id.startswith("G") else "channel"
    return {
        "id": channel.id,
        "name": channel.name,
        "kind": kind,
        "private": channel.is_private,
        "members": sorted(channel.members),
        "messages": items,
        "threads": threads,
    }
