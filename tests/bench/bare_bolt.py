"""The reference server of `tests.bench.ack`: a bare Bolt app whose one `/gpu` listener acks and
then respond()s a line on the command's response_url (Bolt's defaults: the listener runs on
Bolt's thread pool while the request waits for its ack, which Bolt polls for every 10 ms, so
its acks take about 12 ms and its answers often land first), served as `gpubot serve --http`
serves the bot (uvicorn, `bot.server.SlackAsgi`, INFO logging, uvicorn's access log), so the two
differ only in what runs behind Bolt.

Run as its own process: `python -m tests.bench.bare_bolt --port N`, with Slack's variables as
gpubot reads them: SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET (required), SLACK_API_URL (the Web
API base URL; Bolt checks the token there with auth.test on start-up, as it does for gpubot).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient

from bot.server import SlackAsgi

DEFAULT_API_URL = "https://slack.com/api/"


def build(token: str, signing_secret: str, api_url: str) -> App:
    """Bolt with its defaults, its Web API client on `api_url`, a /gpu listener that acks and
    then answers on the response_url, as gpubot answers (ephemeral, a new message)."""
    app = App(
        client=WebClient(token=token, base_url=api_url),
        signing_secret=signing_secret,
        token_verification_enabled=True,  # auth.test at start-up, as gpubot's app does
        raise_error_for_unhandled_request=False,
    )

    @app.command("/gpu")
    def gpu(ack: Ack, respond: Respond, command: dict[str, Any]) -> None:
        ack()
        text = command.get("text") or ""
        respond(text=f"got `{text}`", response_type="ephemeral", replace_original=False)

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.bare_bolt",
        description="A bare Bolt app that acks /gpu and responds, served as gpubot serve --http.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    args = parser.parse_args(argv)
    token = os.environ.get("SLACK_BOT_TOKEN")
    secret = os.environ.get("SLACK_SIGNING_SECRET")
    if not token or not secret:
        print("error: SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET must be set", file=sys.stderr)
        return 2
    api_url = os.environ.get("SLACK_API_URL") or DEFAULT_API_URL
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger(__name__).info("bare Bolt: HTTP on %s:%s/slack/events", args.host, args.port)
    asgi = SlackAsgi(build(token, secret, api_url), lambda: {"ok": True})
    uvicorn.run(asgi, host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
