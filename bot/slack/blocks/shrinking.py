"""The replies to a shrink (`/gpu release L7 gpus …`, `keep 1`, the Give back button) and to
Keep on a partly-idle warning."""

from __future__ import annotations

from bot.services.results import GpuSlot, LeaseView, ShrinkResult
from bot.slack.blocks.kit import Message, context, escape, message, plural, section, slack_date
from bot.slack.blocks.leases import placement_lines


def _gpu_list(slots: tuple[GpuSlot, ...]) -> str:
    by_node: dict[str, list[int]] = {}
    for slot in sorted(slots):
        by_node.setdefault(slot.node, []).append(slot.index)
    return "; ".join(
        f"{escape(node)} GPU{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
        for node, indices in by_node.items()
    )


def shrink_reply(result: ShrinkResult) -> Message:
    """What went back, what the lease keeps (and where to run now), and who the GPUs served."""
    lease = result.lease
    back = _gpu_list(result.given_back)
    text = (
        f"{lease.code} gave back {plural(len(result.given_back), 'GPU')} ({back}) and keeps "
        f"{plural(len(lease.gpus), 'GPU')}."
    )
    blocks = [
        section(
            f":leftwards_arrow_with_hook: *{lease.code}* gave back "
            f"{plural(len(result.given_back), 'GPU')} ({back}). It keeps "
            f"{plural(len(lease.gpus), 'GPU')} in *{escape(lease.pool)}* until "
            f"{slack_date(lease.expires_at)}:"
        ),
        section("\n".join(placement_lines(lease))),
    ]
    if result.started:
        codes = ", ".join(started.code for started in result.started)
        blocks.append(context(f"The freed GPUs went to the queue at once: {codes} started."))
    blocks.append(
        context(
            "Stop anything still running on the GPUs you gave back: others may be given them. "
            f"`/gpu why {lease.code}` shows the whole story."
        )
    )
    return message(text, blocks)


def kept_reply(lease: LeaseView) -> Message:
    """Keep on a partly-idle warning: every GPU stays, and no more such warnings."""
    text = (
        f"Noted: {lease.code} keeps all {plural(len(lease.gpus), 'GPU')}. You will not be told "
        "about its idle GPUs again; the lease ends as planned."
    )
    return message(text, [section(text)])
