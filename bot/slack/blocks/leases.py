"""Leases: the grant DM (hosts, GPU indices, `CUDA_VISIBLE_DEVICES`, expiry), the lease rows other
surfaces reuse, and the replies to `extend` and `release`.
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.services.results import ExtendResult, LeaseView, ReleaseResult, RequestView
from bot.slack.blocks.kit import (
    EXTEND_ACTION,
    RELEASE_ACTION,
    Block,
    Message,
    actions,
    button,
    clip,
    context,
    escape,
    header,
    lease_block,
    listing,
    mention,
    message,
    plural,
    remind_button,
    section,
    slack_date,
    utc_text,
)
from rules.approvals import SHOWN_REASON
from rules.domain import Outcome, format_duration


def placement_lines(lease: LeaseView) -> list[str]:
    """One line per host: which GPUs, and the `CUDA_VISIBLE_DEVICES` to export there."""
    lines = []
    for node, indices in lease.by_node.items():
        gpus = ", ".join(str(i) for i in indices)
        label = "GPU" if len(indices) == 1 else "GPUs"
        cuda = f"CUDA_VISIBLE_DEVICES={lease.cuda_visible_devices(node)}"
        lines.append(f"*{escape(node)}* · {label} {gpus} · `{cuda}`")
    return lines or ["_No GPUs are placed on this lease yet._"]


def lease_summary(lease: LeaseView) -> str:
    """L7 · 2 a100 GPUs · ends <date>, then the hosts, then the reason."""
    head = f"*{lease.code}* · {plural(len(lease.gpus), 'GPU')} in *{escape(lease.pool)}* · "
    head += f"ends {slack_date(lease.expires_at)}"
    if lease.protected:
        head += " · protected"
    lines = [head]
    if lease.recalled_for and lease.recalled_within_team:
        lines.append(
            f":warning: Preempted for a higher-priority request of your team: "
            f"{escape(lease.recalled_for)}. `/gpu why {lease.code}` says how it was chosen."
        )
    elif lease.recalled_for:
        lines.append(
            f":warning: Recalled: team {escape(lease.recalled_for)} needs these borrowed GPUs "
            f"back. `/gpu why {lease.code}` says how it was chosen."
        )
    lines += placement_lines(lease)
    if lease.reason:
        lines.append(f"_{clip(escape(lease.reason), SHOWN_REASON)}_")
    return "\n".join(lines)


def lease_buttons(lease: LeaseView) -> Block:
    """Extend and Release for one lease, in a block of its own so ids never clash."""
    value = str(lease.id)
    question = f"Give back {lease.code} now? Work still running on these GPUs loses them."
    extend = (
        () if lease.recalled_for else (button("Extend", EXTEND_ACTION, value, style="primary"),)
    )
    return actions(
        lease_block(lease.id),
        *extend,  # a recalled lease cannot be extended
        button(
            "Release",
            RELEASE_ACTION,
            value,
            style="danger",
            confirm=(f"Release {lease.code}?", question, "Release"),
        ),
    )


def lease_rows(lease: LeaseView) -> list[Block]:
    return [section(lease_summary(lease)), lease_buttons(lease)]


def unvouched(unknown: Sequence[str]) -> Block:
    """The caveat of a grant whose GPUs ("node:index") had no fresh telemetry."""
    slots = ", ".join(f"{n} GPU {i}" for n, _, i in (u.rpartition(":") for u in unknown))
    return context(
        f":warning: No fresh telemetry from {escape(slots)} yet, so nobody can vouch that "
        "they are empty: check `nvidia-smi` there before you start."
    )


_WARNED = {
    "expiry": "a warning that it ends soon",
    "idle": "a warning that its GPUs look idle",
    "preempt": "a recall notice",
    "unhealthy": "a warning of a GPU fault",
}


def grant_status(lease: LeaseView, warned: Sequence[str] = ()) -> str:
    """The lease as it stands, for its grant DM (the thread's parent): "" when nothing has
    happened since the grant."""
    said = [f"Ends {slack_date(lease.expires_at)}"]
    if lease.extensions:
        said.append(f"extended {_times(lease.extensions)} by {format_duration(lease.extended)}")
    if lease.recalled_for:
        said.append("recall pending")
    said += [f"{_WARNED.get(w, escape(w))} sent" for w in warned if w in _WARNED]
    if len(said) == 1:
        return ""
    return " · ".join(said) + " (the thread has the details)."


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def grant_message(
    lease: LeaseView, unknown: Sequence[str] = (), warned: Sequence[str] = ()
) -> Message:
    """The DM to the holder when GPUs are granted: where to run, until when, and two buttons;
    `unknown`: its GPUs ("node:index") that had no fresh telemetry when they were chosen;
    `warned`: the warnings it stands on now. Redrawn in place as the lease changes."""
    hosts = ", ".join(lease.by_node) or "no host yet"
    length = format_duration(lease.expires_at - lease.granted_at)
    text = (
        f"{lease.code} granted: {plural(len(lease.gpus), 'GPU')} in {lease.pool} on {hosts}, "
        f"until {utc_text(lease.expires_at)}."
    )
    blocks = [
        header(f"Your GPUs are ready: {lease.code}"),
        section(
            f"You hold *{plural(len(lease.gpus), 'GPU')}* in *{escape(lease.pool)}* for {length}, "
            f"until {slack_date(lease.expires_at)}."
        ),
        section("\n".join(placement_lines(lease))),
        context(
            "Export the line for your host before you start. You get a DM before the lease "
            "ends; release early so others can use the GPUs."
        ),
        lease_buttons(lease),
    ]
    if unknown:
        blocks.insert(3, unvouched(unknown))
    status = grant_status(lease, warned)
    if status:
        blocks.insert(2, context(f":hourglass_flowing_sand: {status}"))
    return message(escape(text), blocks)


def _how(lease: LeaseView, by: str) -> str:
    """How it ended; a release names who released it when that was not the holder."""
    if lease.state == "released" and by and by != lease.holder:
        return f"{lease.ended_how} by {mention(by)}"
    return lease.ended_how


def ended_line(lease: LeaseView, by: str = "") -> str:
    """ "*L8* ended Mar 2 at 14:05: reclaimed because …": how and when a lease ended."""
    when = f" {slack_date(lease.ended_at)}" if lease.ended_at is not None else ""
    return f"*{lease.code}* ended{when}: {_how(lease, by)}."


def ended_text(lease: LeaseView, by: str = "") -> str:
    """The notification fallback of `ended_line`, with the time in UTC."""
    when = f" {utc_text(lease.ended_at)}" if lease.ended_at is not None else ""
    return f"{lease.code} ended{when}: {_how(lease, by)}."


def ended_grant_message(lease: LeaseView, by: str = "") -> Message:
    """The grant DM once the lease has ended: where it ran, how and when it ended, no buttons."""
    blocks = [
        header(f"{lease.code} has ended"),
        section(f":checkered_flag: {ended_line(lease, by)}"),
        section(
            f"You held *{plural(len(lease.gpus), 'GPU')}* in *{escape(lease.pool)}* from "
            f"{slack_date(lease.granted_at)}."
        ),
        section("\n".join(placement_lines(lease))),
        context(
            f"These GPUs are no longer yours. `/gpu why {lease.code}` shows the whole story; "
            "`/gpu borrow` asks again."
        ),
    ]
    return message(ended_text(lease, by), blocks)


def extend_reply(result: ExtendResult) -> Message:
    """What became of `/gpu extend`: extended, waiting for a manager, queued, or refused."""
    lease, because = result.lease, escape(result.because)
    request = result.request
    if result.outcome == Outcome.APPROVE:
        text = f"{lease.code} now ends {slack_date(lease.expires_at)}."
    elif result.outcome == Outcome.ASK and request is not None:
        who = ", ".join(mention(a) for a in request.approvers) or "an approver"
        text = (
            f"Asked {who} to extend {lease.code} by {format_duration(request.duration)} "
            f"({request.code}). It still ends {slack_date(lease.expires_at)} until they agree."
        )
    elif result.outcome == Outcome.QUEUE:
        text = f"The extension of {lease.code} waits. It ends {slack_date(lease.expires_at)}."
    else:
        text = (
            f"{lease.code} was not extended; it still ends {slack_date(lease.expires_at)}. "
            "Ask for less time, or release it and borrow again."
        )
    blocks = [section(text)]
    if because:
        blocks.append(context(f"Because {because} (rule `{escape(result.deciding)}`)"))
    if result.outcome == Outcome.ASK and request is not None:
        blocks.append(remind_button(request.id))
    why = f" Because {result.because}." if result.because else ""
    return message(escape(f"{lease.code}: {_SAID[result.outcome]}.{why}"), blocks)


_SAID = {
    Outcome.APPROVE: "extended",
    Outcome.ASK: "waiting for approval",
    Outcome.QUEUE: "extension queued",
    Outcome.DENY: "not extended",
}


def release_reply(result: ReleaseResult) -> Message:
    """What `/gpu release` gave back and which open requests it withdrew."""
    if not result.released and not result.cancelled:
        text = "You held no leases and had no open requests, so nothing changed."
        return message(text, [section(text)])

    def released(lease: LeaseView) -> list[Block]:
        hosts = ", ".join(escape(node) for node in lease.by_node) or "no host"
        size = f"{plural(len(lease.gpus), 'GPU')} in *{escape(lease.pool)}*"
        return [section(f"Released *{lease.code}*: {size} on {hosts}.")]

    def withdrawn(request: RequestView) -> list[Block]:
        size = f"{plural(request.gpus, 'GPU')} in *{escape(request.pool)}*"
        return [section(f"Withdrew *{request.code}*: {size}.")]

    blocks = listing(list(result.released), released, 20, "lease")
    blocks += listing(list(result.cancelled), withdrawn, 20, "request")
    codes = ", ".join([x.code for x in result.released] + [r.code for r in result.cancelled])
    return message(f"Released or withdrew {codes}. Thank you.", blocks)
