"""Slack's request signing: `v0=HMAC_SHA256(secret, "v0:{timestamp}:{raw body}")`."""

from __future__ import annotations

import hashlib
import hmac
import time

FORM = "application/x-www-form-urlencoded"
JSON_CONTENT = "application/json"
USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"


def signature(body: bytes, secret: str, timestamp: int) -> str:
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def sign(
    body: bytes, secret: str, timestamp: int | None = None, *, content_type: str = FORM
) -> dict[str, str]:
    """The headers Slack sends with `body`: signature, timestamp (default: now), content type."""
    stamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": str(stamp),
        "X-Slack-Signature": signature(body, secret, stamp),
        "User-Agent": USER_AGENT,
    }
