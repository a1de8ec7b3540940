"""Block Kit for every surface gpubot shows: pure builders from service views to Slack payloads.

One module per surface; `kit` holds the shared primitives, limits and interaction ids.
"""

from bot.slack.blocks.approval import approval_card, settle_reply, settled_card
from bot.slack.blocks.home import home_view
from bot.slack.blocks.kit import (
    APPROVE_ACTION,
    BORROW_OPEN_ACTION,
    CANCEL_ACTION,
    DENY_ACTION,
    EXTEND_ACTION,
    RELEASE_ACTION,
    Message,
    escape,
    lease_block,
    request_block,
    slack_date,
)
from bot.slack.blocks.leases import extend_reply, grant_message, release_reply
from bot.slack.blocks.modals import (
    BORROW_COUNT,
    BORROW_DURATION,
    BORROW_MODAL,
    BORROW_POOL,
    BORROW_PRIORITY,
    BORROW_REASON,
    DENY_MODAL,
    DENY_REASON,
    InputId,
    borrow_from_modal,
    borrow_modal,
    deny_modal,
    deny_reason_from_modal,
)
from bot.slack.blocks.overview import mine_message, queue_message, quota_message, status_message
from bot.slack.blocks.replies import (
    borrow_reply,
    explanation_message,
    help_message,
    problem_message,
    refused_message,
)

__all__ = [
    "APPROVE_ACTION",
    "BORROW_COUNT",
    "BORROW_DURATION",
    "BORROW_MODAL",
    "BORROW_OPEN_ACTION",
    "BORROW_POOL",
    "BORROW_PRIORITY",
    "BORROW_REASON",
    "CANCEL_ACTION",
    "DENY_ACTION",
    "DENY_MODAL",
    "DENY_REASON",
    "EXTEND_ACTION",
    "RELEASE_ACTION",
    "InputId",
    "Message",
    "approval_card",
    "borrow_from_modal",
    "borrow_modal",
    "borrow_reply",
    "deny_modal",
    "deny_reason_from_modal",
    "escape",
    "explanation_message",
    "extend_reply",
    "grant_message",
    "help_message",
    "home_view",
    "lease_block",
    "mine_message",
    "problem_message",
    "queue_message",
    "quota_message",
    "refused_message",
    "release_reply",
    "request_block",
    "settle_reply",
    "settled_card",
    "slack_date",
    "status_message",
]
