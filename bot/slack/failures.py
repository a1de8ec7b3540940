"""A listener that failed after its ack still owes the person an answer: a reference to the log."""

from __future__ import annotations

import logging
import uuid

from slack_bolt import Respond

log = logging.getLogger("bot.slack")


def report_failure(error: BaseException, respond: Respond | None) -> None:
    reference = uuid.uuid4().hex[:8]
    log.error("listener failed (reference %s)", reference, exc_info=error)
    if respond is not None:
        respond(
            text=f":warning: Something went wrong on our side (reference `{reference}`). "
            "What was already decided stays recorded; an admin can look the reference up "
            "in the bot's log.",
            response_type="ephemeral",
            replace_original=False,
        )
