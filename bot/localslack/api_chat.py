"""chat.* and conversations.open: messages, ephemerals and DMs, with Slack's errors and limits."""

from __future__ import annotations

from collections.abc import Iterable

from .api import ApiError, Args, Context, Method
from .limits import check_blocks
from .model import JSON, Channel, Message
from .workspace import Workspace

MAX_TEXT = 40_000


def content(method: str, args: Args) -> tuple[str | None, list[JSON] | None]:
    """The message's text and blocks, after Slack's checks; blocks need a top-level `text` too."""
    raw_text = args.get("text") or args.get("markdown_text")
    text = None if raw_text is None else str(raw_text)
    blocks = args.get("blocks")
    if blocks is not None:
        problems = check_blocks(blocks)
        if problems:
            violation = f"{method}: invalid_blocks: {'; '.join(problems)}"
            messages = [f"[ERROR] {problem}" for problem in problems]
            raise ApiError("invalid_blocks", violation, response_metadata={"messages": messages})
    if not (text or "").strip():
        if blocks:
            raise ApiError("no_text", f"{method}: blocks without a top-level `text` fallback")
        raise ApiError("no_text", f"{method}: neither text nor blocks")
    if text is not None and len(text) > MAX_TEXT:
        raise ApiError("msg_too_long", f"{method}: text is {len(text)} characters")
    return text, blocks


def joined_channel(ws: Workspace, ref: object) -> Channel:
    """The channel (by id, name or a user's DM) the bot may write to."""
    channel = ws.channel(str(ref))
    if channel is None:
        raise ApiError("channel_not_found")
    if ws.bot_user not in channel.members:
        raise ApiError("not_in_channel")
    return channel


def post_message(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    text, blocks = content("chat.postMessage", args)
    thread_ts = args.get("thread_ts") or None
    metadata = _metadata(args.get("metadata"))
    try:
        message = ws.post(
            channel.id,
            text or "",
            blocks,
            thread_ts=thread_ts,
            metadata=metadata,
            reply_broadcast=args.flag("reply_broadcast"),
        )
    except LookupError:
        raise ApiError("thread_not_found") from None
    return {
        "channel": channel.id,
        "ts": message.ts,
        "message": message.as_json(ws.team_id, ws.app_id),
    }


def _metadata(raw: object) -> JSON | None:
    """Message metadata as Slack takes it: an event_type and an event_payload object."""
    if raw is None:
        return None
    if not (
        isinstance(raw, dict)
        and isinstance(raw.get("event_type"), str)
        and isinstance(raw.get("event_payload"), dict)
    ):
        raise ApiError("invalid_metadata_format")
    return {"event_type": raw["event_type"], "event_payload": raw["event_payload"]}


def history(ctx: Context, args: Args) -> JSON:
    """conversations.history: newest first, from `oldest` on; metadata only when asked for.
    Replies stay in their threads unless broadcast; a parent carries its reply_count."""
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    oldest = float(args.get("oldest") or 0)
    limit = min(int(args.get("limit") or 100), 999)
    found = [
        m
        for m in ws.messages(channel.id)
        if float(m.ts) >= oldest and (not m.is_reply or m.reply_broadcast)
    ]
    return {
        "messages": _shown(ctx, reversed(found[-limit:]), args),
        "has_more": len(found) > limit,
        "response_metadata": {"next_cursor": ""},
    }


def replies(ctx: Context, args: Args) -> JSON:
    """conversations.replies: a thread, its parent first, then its replies from `oldest` on."""
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    thread = ws.replies(channel.id, str(args.required("ts")))
    if thread is None:
        raise ApiError("thread_not_found")
    oldest = float(args.get("oldest") or 0)
    limit = min(int(args.get("limit") or 1000), 1000)
    found = thread[:1] + [m for m in thread[1:] if float(m.ts) >= oldest]
    return {
        "messages": _shown(ctx, found[:limit], args),
        "has_more": len(found) > limit,
        "response_metadata": {"next_cursor": ""},
    }


def _shown(ctx: Context, messages: Iterable[Message], args: Args) -> list[JSON]:
    """Messages as the conversations.* methods return them; metadata only when asked for."""
    ws = ctx.workspace
    with_metadata = args.flag("include_all_metadata")
    shown = []
    for message in messages:
        body = message.as_json(ws.team_id, ws.app_id)
        if not with_metadata:
            body.pop("metadata", None)
        if message.files:  # Slack shows a shared file's whole object in the message
            found = (ws.file(file_id) for file_id in message.files)
            body["files"] = [f.as_json(ctx.base_url) for f in found if f is not None]
        shown.append(body)
    return shown


def update(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    ts = str(args.required("ts"))
    old = ws.message(channel.id, ts)
    if old is None:
        raise ApiError("message_not_found")  # ephemerals too: only response_url can replace them
    if old.bot_id is None:
        raise ApiError("cant_update_message")
    text, blocks = content("chat.update", args)
    new = ws.update(channel.id, ts, text, blocks, edited=True)
    assert new is not None  # the workspace lock is held for the whole call
    body = new.as_json(ws.team_id, ws.app_id)
    return {"channel": channel.id, "ts": ts, "text": new.text, "message": body}


def post_ephemeral(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    user = str(args.required("user"))
    if ws.user(user) is None:
        raise ApiError("user_not_found")
    if user not in channel.members:
        raise ApiError("user_not_in_channel")
    text, blocks = content("chat.postEphemeral", args)
    ephemeral = ws.post_ephemeral(channel.id, user, text or "", blocks, args.get("thread_ts"))
    return {"message_ts": ephemeral.ts}


def delete(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    ts = str(args.required("ts"))
    message = ws.message(channel.id, ts)
    if message is None:
        raise ApiError("message_not_found")
    if message.bot_id is None:
        raise ApiError("cant_delete_message")
    ws.delete(channel.id, ts)
    return {"channel": channel.id, "ts": ts}


def conversations_open(ctx: Context, args: Args) -> JSON:
    """A DM with one person, or a group DM with several (`users` is "U1" or "U1,U2")."""
    ws = ctx.workspace
    if args.get("channel"):
        existing = ws.channel(str(args["channel"]))
        if existing is None:
            raise ApiError("channel_not_found")
        return {"channel": existing.as_json() if args.flag("return_im") else {"id": existing.id}}
    users = [user.strip() for user in str(args.required("users")).split(",") if user.strip()]
    if any(ws.user(user) is None for user in users):
        raise ApiError("user_not_found")
    if len(users) > 8:
        raise ApiError("too_many_users")
    already_open = len(users) == 1 and any(c.im_user == users[0] for c in ws.channels.values())
    channel_id = ws.dm_channel(users[0]) if len(users) == 1 else ws.group_dm(users)
    if not args.flag("return_im"):
        return {"channel": {"id": channel_id}}
    channel = ws.channel(channel_id)
    assert channel is not None
    return {"no_op": already_open, "already_open": already_open, "channel": channel.as_json()}


def get_permalink(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = joined_channel(ws, args.required("channel"))
    ts = str(args.required("message_ts"))
    if ws.message(channel.id, ts) is None:
        raise ApiError("message_not_found")
    link = f"https://gpubot-local.slack.com/archives/{channel.id}/p{ts.replace('.', '')}"
    return {"channel": channel.id, "permalink": link}


def conversations_info(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    channel = ws.channel(str(args.required("channel")))
    joined = channel is not None and ws.bot_user in channel.members
    if channel is None or (channel.is_private and not joined):  # hidden from the bot
        raise ApiError("channel_not_found")
    shown = channel.as_json()
    return {"channel": shown if channel.is_im else shown | {"is_member": joined}}


def conversations_members(ctx: Context, args: Args) -> JSON:
    channel = ctx.workspace.channel(str(args.required("channel")))
    if channel is None:
        raise ApiError("channel_not_found")
    return {"members": sorted(channel.members), "response_metadata": {"next_cursor": ""}}


METHODS: dict[str, Method] = {
    "chat.getPermalink": get_permalink,
    "conversations.info": conversations_info,
    "conversations.members": conversations_members,
    "chat.postMessage": post_message,
    "conversations.history": history,
    "conversations.replies": replies,
    "chat.update": update,
    "chat.postEphemeral": post_ephemeral,
    "chat.delete": delete,
    "conversations.open": conversations_open,
}
