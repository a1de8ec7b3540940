"""response_url semantics: what Slack does with a JSON body POSTed to `/response/<token>`.

Default: a new ephemeral for the invoking person. `response_type: in_channel` posts for everyone;
`replace_original` / `delete_original` act on the message the button sat on (ephemeral ones too),
or, for a command, on the latest ephemeral answer. Five uses in 30 minutes, then 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .limits import check_blocks
from .model import ResponseUrl
from .tokens import RESPONSE_URL_USES
from .workspace import Workspace


def respond(
    ws: Workspace, token: str, raw: bytes, violate: Callable[[str], None]
) -> tuple[int, str, dict[str, Any]]:
    """HTTP status, plain-text answer and the parsed body of one response_url POST."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return 400, "invalid_payload", {}
    if not isinstance(body, dict):
        return 400, "invalid_payload", {}
    with ws.lock:
        known = ws.tokens.response_url(token)
        url = ws.tokens.use_response_url(token)
        if url is None:
            if known is None:
                return 404, "no_service", body
            return 404, "used_url" if known.uses >= RESPONSE_URL_USES else "expired_url", body
        return (*_apply(ws, url, body, violate), body)


def _apply(
    ws: Workspace, url: ResponseUrl, body: dict[str, Any], violate: Callable[[str], None]
) -> tuple[int, str]:
    original_ts, ephemeral = url.source_ts, url.source_ephemeral
    if original_ts is None:
        original_ts, ephemeral = url.last_ts, True
    if body.get("delete_original"):
        return _delete(ws, url, original_ts, ephemeral=ephemeral)
    text, blocks = str(body.get("text") or ""), body.get("blocks")
    refused = _refused(text, blocks, violate)
    if refused is not None:
        return refused
    if body.get("replace_original"):
        return _replace(ws, url, original_ts, text, blocks or [], ephemeral=ephemeral)
    thread_ts = body.get("thread_ts") or None
    if body.get("response_type") == "in_channel":
        try:
            ws.post(url.channel, text, blocks, thread_ts=thread_ts)
        except LookupError:
            return 404, "thread_not_found"
    else:
        posted = ws.post_ephemeral(url.channel, url.user, text, blocks, thread_ts)
        ws.tokens.note_response(url.token, posted.ts)
    return 200, "ok"


def _refused(text: str, blocks: Any, violate: Callable[[str], None]) -> tuple[int, str] | None:
    """Why a message body is refused (bad blocks, nothing to show); None when it is fine."""
    if blocks is not None:
        problems = check_blocks(blocks)
        if problems:
            violate(f"response_url: invalid_blocks: {'; '.join(problems)}")
            return 400, "invalid_blocks"
    if not text.strip() and not blocks:
        violate("response_url: neither text nor blocks")
        return 400, "no_text"
    return None


def _delete(
    ws: Workspace, url: ResponseUrl, original_ts: str | None, *, ephemeral: bool
) -> tuple[int, str]:
    if original_ts is None:
        deleted = False
    elif ephemeral:
        deleted = ws.delete_ephemeral(original_ts)
    else:
        deleted = ws.delete(url.channel, original_ts)
    return (200, "ok") if deleted else (404, "message_not_found")


def _replace(
    ws: Workspace,
    url: ResponseUrl,
    original_ts: str | None,
    text: str,
    blocks: list[Any],
    *,
    ephemeral: bool,
) -> tuple[int, str]:
    if original_ts is None:
        return 404, "message_not_found"
    if ephemeral:
        replaced = ws.replace_ephemeral(original_ts, text, blocks)
    else:
        replaced = ws.update(url.channel, original_ts, text, blocks, edited=False) is not None
    return (200, "ok") if replaced else (404, "message_not_found")
