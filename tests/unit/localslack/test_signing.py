"""Request signing: Slack's published test vector, and what Bolt's verifier accepts."""

from __future__ import annotations

from slack_sdk.signature import SignatureVerifier

from bot.localslack import sign
from bot.localslack.signing import signature

SLACK_DOCS_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands"
    b"%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)


def test_slack_documented_vector() -> None:
    """The example from Slack's 'Verifying requests' page."""
    headers = sign(SLACK_DOCS_BODY, "8f742231b10e8888abcd99yyyzzz85a5", 1531420618)
    expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    assert expected == headers["X-Slack-Signature"]
    assert "1531420618" == headers["X-Slack-Request-Timestamp"]
    assert "application/x-www-form-urlencoded" == headers["Content-Type"]


def test_signed_headers_pass_slack_sdk_verification() -> None:
    """The verifier Bolt uses accepts a fresh signature and refuses another secret's."""
    body = b'{"type": "event_callback"}'
    headers = {
        k.lower(): v for k, v in sign(body, "s3cret", content_type="application/json").items()
    }
    assert SignatureVerifier("s3cret").is_valid_request(body, headers)
    assert not SignatureVerifier("other").is_valid_request(body, headers)
    assert "application/json" == headers["content-type"]


def test_the_signature_covers_the_timestamp() -> None:
    """Same body, another second: another signature."""
    assert signature(b"x", "s", 1) != signature(b"x", "s", 2)
