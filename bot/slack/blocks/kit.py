"""Block Kit primitives every surface shares: mrkdwn escaping, Slack's size limits, the
`<!date^…>` token, interaction ids, and `Message` (fallback text plus blocks).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from rules.domain import plural as plural  # noqa: PLC0414 - re-exported: one helper for counts

Block = dict[str, Any]
T = TypeVar("T")

# Slack's limits (docs.slack.dev, and the validators in slack_sdk.models).
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_SECTION_TEXT = 3000
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_HEADER_TEXT = 150
MAX_BUTTON_TEXT = 75
MAX_CONTEXT_ELEMENTS = 10
MAX_MODAL_TITLE = 24  # also submit and close
MAX_TEXT = 3000  # the fallback text; Slack truncates far later, people stop reading sooner

# Interaction ids the listeners match on. Buttons carry the request or lease id as `value`;
# several leases may share an action_id because each sits in its own block (`lease:<id>`).
APPROVE_ACTION = "request_approve"
DENY_ACTION = "request_deny"
CANCEL_ACTION = "request_cancel"
EXTEND_ACTION = "lease_extend"
RELEASE_ACTION = "lease_release"
BORROW_OPEN_ACTION = "borrow_open"
REMIND_ACTION = "request_remind"  # the requester's "Remind approvers"
ASK_AGAIN_ACTION = "request_ask_again"  # file an expired request once more


def request_block(request_id: int) -> str:
    return f"request:{request_id}"


def lease_block(lease_id: int) -> str:
    return f"lease:{lease_id}"


@dataclass(frozen=True)
class Message:
    """A message to post, update or respond with: `text` is the notification fallback."""

    text: str
    blocks: list[Block]

    def as_kwargs(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


def message(text: str, blocks: list[Block]) -> Message:
    return Message(clip(text, MAX_TEXT) or "gpubot", fit(blocks, MAX_MESSAGE_BLOCKS))


def escape(text: str) -> str:
    """A person's words made safe for mrkdwn: only &, < and > need it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_BROADCAST = re.compile(r"<!(?!date\^)")


def defang(text: str) -> str:
    """Mrkdwn composed by the services: keep its mentions, but never ping @here or @channel."""
    return _BROADCAST.sub("&lt;!", text)


_TAIL = re.compile(r"(?:&[A-Za-z#0-9]{0,7}|<[^>]*)$")


def clip(text: str, limit: int) -> str:
    """At most `limit` characters; never ends inside an entity or a `<…>` token."""
    if len(text) <= limit:
        return text
    return _TAIL.sub("", text[: max(limit - 1, 0)]).rstrip() + "…"


def utc_text(at: datetime) -> str:
    return _aware(at).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def slack_date(at: datetime, fmt: str = "{date_short_pretty} at {time}") -> str:
    """A time every reader sees in their own zone, with a UTC fallback for old clients."""
    return f"<!date^{int(_aware(at).timestamp())}^{fmt}|{utc_text(at)}>"


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")


def mention(user: str | None) -> str:
    """`<@U…>` for a Slack user id; anything else (the bot itself, a name) as plain text."""
    if not user:
        return "nobody"
    return f"<@{user}>" if _USER_ID.fullmatch(user) else escape(user)


def plain(text: str, limit: int = MAX_SECTION_TEXT) -> dict[str, Any]:
    return {"type": "plain_text", "text": clip(text, limit) or " ", "emoji": True}


def mrkdwn(text: str, limit: int = MAX_SECTION_TEXT) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": clip(text, limit) or " "}


def header(text: str) -> Block:
    return {"type": "header", "text": plain(text, MAX_HEADER_TEXT)}


def section(
    text: str = "",
    *,
    fields: Sequence[str] = (),
    accessory: dict[str, Any] | None = None,
    block_id: str | None = None,
) -> Block:
    block: Block = {"type": "section"}
    if text or not fields:
        block["text"] = mrkdwn(text)
    if fields:
        block["fields"] = [mrkdwn(f, MAX_FIELD_TEXT) for f in fields[:MAX_FIELDS]]
    if accessory is not None:
        block["accessory"] = accessory
    if block_id is not None:
        block["block_id"] = block_id
    return block


def context(*texts: str) -> Block:
    elements = [mrkdwn(t, MAX_SECTION_TEXT) for t in texts if t][:MAX_CONTEXT_ELEMENTS]
    return {"type": "context", "elements": elements or [mrkdwn(" ")]}


def divider() -> Block:
    return {"type": "divider"}


def button(
    text: str,
    action_id: str,
    value: str,
    *,
    style: str | None = None,
    confirm: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """A button; `confirm` is (title, question, yes) for a dialog before the click counts."""
    element: dict[str, Any] = {
        "type": "button",
        "text": plain(text, MAX_BUTTON_TEXT),
        "action_id": action_id,
        "value": value,
    }
    if style is not None:
        element["style"] = style
    if confirm is not None:
        title, question, yes = confirm
        element["confirm"] = {
            "title": plain(title, 100),
            "text": mrkdwn(question, 300),
            "confirm": plain(yes, 30),
            "deny": plain("Cancel", 30),
        }
        if style == "danger":  # Slack draws the dialog's confirm button red too
            element["confirm"]["style"] = "danger"
    return element


def actions(block_id: str, *elements: dict[str, Any]) -> Block:
    return {"type": "actions", "block_id": block_id, "elements": list(elements)}


def listing(
    items: Sequence[T], render: Callable[[T], Iterable[Block]], limit: int, noun: str
) -> list[Block]:
    """The first `limit` items, then one context line saying how many more there are."""
    blocks = [block for item in items[:limit] for block in render(item)]
    if len(items) > limit:
        more = len(items) - limit
        blocks.append(context(f"…and {plural(more, 'more ' + noun)} not shown here."))
    return blocks


def fit(blocks: list[Block], limit: int) -> list[Block]:
    """At most `limit` blocks: what does not fit becomes a note that it was left out."""
    if len(blocks) <= limit:
        return blocks
    return [*blocks[: limit - 1], context(f"…and {len(blocks) - limit + 1} more not shown here.")]


def remind_button(request_id: int) -> Block:
    """The requester's *Remind approvers* button, under their "waiting for approval" answer."""
    return actions(
        f"remind:{request_id}", button("Remind approvers", REMIND_ACTION, str(request_id))
    )


def ask_again_button(request_id: int) -> Block:
    """*Ask again* under an expired request: the same request filed once more."""
    return actions(
        f"again:{request_id}",
        button("Ask again", ASK_AGAIN_ACTION, str(request_id), style="primary"),
    )
