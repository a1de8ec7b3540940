"""What the sweep tells people: warnings with their three answers, reclaims, unreserved use,
and notices for admins."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from bot.services.results import LeaseView
from bot.slack.blocks.kit import (
    EXTEND_ACTION,
    RELEASE_ACTION,
    Block,
    Message,
    actions,
    button,
    clip,
    context,
    defang,
    escape,
    header,
    lease_block,
    message,
    plural,
    section,
    slack_date,
)
from bot.slack.blocks.leases import ended_line, ended_text, placement_lines
from rules.domain import format_duration

SNOOZE_ACTION = "lease_snooze"
GIVE_BACK_IDLE_ACTION = "lease_give_back_idle"
KEEP_ALL_ACTION = "lease_keep_all"
BORROW_QUICK_ACTION = "borrow_quick"


def _minutes(value: float) -> str:
    return format_duration(timedelta(minutes=value))


def warning_message(
    lease: LeaseView,
    reason: str,
    because: str,
    *,
    grace: timedelta,
    now: datetime,
    time_left_min: float,
    idle_for_min: float,
    snoozes_left: int,
    recall: Mapping[str, Any] | None = None,
    notice: timedelta = timedelta(0),
    idle: Sequence[str] = (),
) -> Message:
    """Before anything is taken: what, why, the deadline, and Extend / Release now / Still using."""
    if reason == "partly_idle":
        return partly_idle_message(lease, idle, idle_for_min, snoozes_left=snoozes_left)
    if reason == "expiry":
        title = f"{lease.code} ends {'soon' if time_left_min else 'now'}"
        line = (
            f"Your lease *{lease.code}* ends {slack_date(lease.expires_at)}"
            f" (in {_minutes(time_left_min)})."
            if time_left_min
            else f"Your lease *{lease.code}* ended {slack_date(lease.expires_at)}."
        )
        deadline = max(lease.expires_at, now) + grace
    elif reason == "idle":
        title = f"{lease.code} looks idle"
        line = (
            f"The GPUs of *{lease.code}* have done nothing for {_minutes(idle_for_min)}. "
            "If they are really working, say so; otherwise give them back."
        )
        deadline = now + grace
    elif reason == "preempt":
        return _preempt_message(lease, because, recall or {}, now + notice, notice)
    else:
        title = f"{lease.code}: a GPU reports a fault"
        line = f"A GPU of *{lease.code}* reports a hardware fault; save your work."
        deadline = now + grace
    elements = [
        button("Extend 2h", EXTEND_ACTION, str(lease.id), style="primary"),
        _release_now(lease),
    ]
    if reason == "idle" and snoozes_left > 0:
        elements.append(button("Still using", SNOOZE_ACTION, str(lease.id)))
    # The reason is said once, in our words; the rule's `because` restates it (`/gpu why`
    # shows it with the rule that matched).
    blocks = [
        header(title),
        section(f":warning: {line}"),
        section("\n".join(placement_lines(lease))),
    ]
    if reason in ("expiry", "idle"):
        blocks.append(
            context(
                f"Nothing is taken before {slack_date(deadline)}. "
                + (
                    f"“Still using” works {plural(snoozes_left, 'more time')}."
                    if reason == "idle"
                    else "Extend to keep the GPUs longer."
                )
            )
        )
    blocks.append(actions(lease_block(lease.id), *elements))
    return message(f"{title}: {_plain(line)}", blocks)


def _plain(line: str) -> str:
    """A line's notification text: no bold, no date tokens (their fallback text instead)."""
    return re.sub(r"<!date\^[^|>]*\|([^>]*)>", r"\1", line).replace("*", "")


def partly_idle_message(
    lease: LeaseView,
    idle: Sequence[str],
    idle_for_min: float,
    *,
    snoozes_left: int,
) -> Message:
    """Some GPUs of a lease idle, at least one busy: Give back the idle ones, Still using, Keep.
    The rule's own words are left to `/gpu why`: the first line says the same."""
    count, total = len(idle), len(lease.gpus)
    them = "it" if count == 1 else "them"
    title = f"{lease.code}: {count} of {total} GPUs idle"
    line = (
        f"{count} of your {total} GPUs in *{lease.code}* "
        f"{'has' if count == 1 else 'have'} been idle for {_minutes(idle_for_min)}: "
        f"{escape(_named(idle))}. Give {them} back so others can use {them}; "
        "the busy GPUs stay yours."
    )
    elements = [
        button(
            f"Give back the {plural(count, 'idle GPU')}"
            if count != 1
            else "Give back the idle GPU",
            GIVE_BACK_IDLE_ACTION,
            str(lease.id),
            style="primary",
        )
    ]
    if snoozes_left > 0:
        elements.append(button("Still using", SNOOZE_ACTION, str(lease.id)))
    elements.append(button("Keep", KEEP_ALL_ACTION, str(lease.id)))
    blocks = [
        header(title),
        section(f":hourglass: {line}"),
        section("\n".join(placement_lines(lease))),
        context(
            "“Still using” quiets this warning for a while; “Keep” keeps every GPU and ends "
            f"these warnings for {lease.code}. `/gpu release {lease.code} keep 1` keeps one; "
            f"`/gpu why {lease.code}` shows the rule that sent this."
        ),
        actions(lease_block(lease.id), *elements),
    ]
    return message(f"{title}: give them back, or say you still need them.", blocks)


def _named(idle: Sequence[str]) -> str:
    """ "node-a GPUs 1, 2; node-b GPU 0" from ["node-a:1", "node-a:2", "node-b:0"]."""
    by_node: dict[str, list[str]] = {}
    for gpu in idle:
        node, _, index = gpu.rpartition(":")
        by_node.setdefault(node, []).append(index)
    return "; ".join(
        f"{node} GPU{'s' if len(indices) > 1 else ''} {', '.join(indices)}"
        for node, indices in by_node.items()
    )


def _release_now(lease: LeaseView) -> Block:
    """The Release now button of a warning, behind a confirmation."""
    return button(
        "Release now",
        RELEASE_ACTION,
        str(lease.id),
        style="danger",
        confirm=(
            f"Release {lease.code}?",
            "Work still running on these GPUs loses them.",
            "Release",
        ),
    )


def _preempt_message(
    lease: LeaseView,
    because: str,
    recall: Mapping[str, Any],
    deadline: datetime,
    notice: timedelta,
) -> Message:
    """A recall: whose GPUs these are, when they are taken, and Release now."""
    team = escape(str(recall.get("team") or "their lending team"))
    wanted = f" for R{recall['request']}" if recall.get("request") else ""
    title = f"{lease.code} is recalled"
    line = (
        f"The GPUs of *{lease.code}* are borrowed from team *{team}*'s guaranteed share, "
        f"and {team} needs them back{wanted}."
    )
    if recall.get("within_team"):
        title = f"{lease.code} is preempted"
        line = (
            f"The GPUs of *{lease.code}* are preempted{wanted}, a higher-priority request of "
            f"your team *{team}*."
        )
    line += (
        f" Save your work: they are taken {slack_date(deadline)}, "
        f"{format_duration(notice)} after this message."
    )
    why = str(recall.get("because") or because)
    blocks = [
        header(title),
        section(f":warning: {line}\n{clip(escape(why), 500)}"),
        section("\n".join(placement_lines(lease))),
        context(
            "A recalled lease cannot be extended. Releasing now hands the GPUs over at once; "
            f"`/gpu why {lease.code}` shows how it was chosen."
        ),
        actions(lease_block(lease.id), _release_now(lease)),
    ]
    return message(f"{title}: {clip(why, 300)}", blocks)


_WARNED_OF = {
    "expiry": "its end",
    "idle": "idle GPUs",
    "partly_idle": "some idle GPUs",
    "preempt": "a recall",
    "unhealthy": "a GPU fault",
}


def ended_warning_message(lease: LeaseView, reason: str, because: str, by: str = "") -> Message:
    """A warning DM once its lease has ended: how and when, what it warned of, no buttons."""
    warned = _WARNED_OF.get(reason, escape(reason))
    blocks = [
        header(f"{lease.code} has ended"),
        section(f":checkered_flag: {ended_line(lease, by)}"),
        context(f"This message warned of {warned}: {clip(escape(because), 500)}"),
        context(f"`/gpu why {lease.code}` shows the whole story; `/gpu borrow` asks again."),
    ]
    return message(ended_text(lease, by), blocks)


_TITLE = {
    "expiry": "{code} ends soon",
    "idle": "{code} looked idle",
    "partly_idle": "{code}: some GPUs looked idle",
    "preempt": "{code} was recalled",
    "unhealthy": "{code}: a GPU reported a fault",
}


def settled_warning_message(
    lease: LeaseView,
    reason: str,
    outcome: str,
    *,
    by: str = "",
    until: datetime | None = None,
    given: Sequence[str] = (),
) -> Message:
    """A warning of an active lease that no longer stands: what became of it, no buttons."""
    title = _TITLE.get(reason, "{code}: a warning").format(code=lease.code)
    line = _settled_line(lease, reason, outcome, by=by, until=until, given=given)
    blocks = [
        header(title),
        section(line),
        context(
            f"This warned of {_WARNED_OF.get(reason, escape(reason))}; it needs nothing from "
            f"you now. `/gpu why {lease.code}` shows the whole story."
        ),
    ]
    return message(f"{title}: {_plain(line)}", blocks)


def _settled_line(
    lease: LeaseView,
    reason: str,
    outcome: str,
    *,
    by: str,
    until: datetime | None,
    given: Sequence[str],
) -> str:
    """One line: what became of a warning (`rules.settled.Settled`)."""
    total = len(lease.gpus)
    held = [f"{g.node}:{g.index}" for g in lease.gpus]
    lines = {
        "superseded": ":arrow_down: Superseded by the warning below.",
        "extended": f":white_check_mark: Extended to {slack_date(until or lease.expires_at)}"
        + (f" by {escape(by)}'s approval." if by else "."),
        "gave_back": f":white_check_mark: You gave back {plural(len(given), 'GPU')}"
        f" ({escape(_named(given))}); {lease.code} keeps {escape(_named(held))}.",
        "kept": f":white_check_mark: You chose to keep "
        f"{f'all {total} GPUs' if total > 1 else 'the GPU'}; "
        f"no more idle-GPU warnings for {lease.code}.",
        "snoozed": ":zzz: Snoozed: no idle warnings until "
        f"{slack_date(until) if until else 'the snooze ends'}.",
        "withdrawn": f":white_check_mark: The recall was withdrawn: {lease.code} keeps its GPUs "
        "and ends as planned.",
    }
    cleared = {
        "expiry": f":white_check_mark: {lease.code} now ends {slack_date(lease.expires_at)}.",
        "unhealthy": ":white_check_mark: The GPU no longer reports a fault.",
    }
    default = ":white_check_mark: No longer stands: the GPUs are busy again."
    return lines.get(outcome) or cleared.get(reason, default)


def recall_withdrawn_message(lease: LeaseView) -> Message:
    text = (
        f"{lease.code} is no longer recalled: the GPUs it was asked to give back came free "
        "another way. Keep working; it ends as planned."
    )
    return message(text, [section(f":white_check_mark: {escape(text)}")])


def reclaimed_message(
    lease: LeaseView, reason: str, because: str, *, within_team: bool = False
) -> Message:
    what = {
        "expired": "it expired",
        "idle": "its GPUs stayed idle after the warning",
        "preempted": "its lender needs the GPUs back",
        "unhealthy": "a GPU failed",
    }.get(reason, reason)
    if within_team:
        what = "a higher-priority request of your team needs the GPUs"
    text = f"{lease.code} was reclaimed: {what}."
    blocks = [
        section(
            f":recycle: *{lease.code}* ({plural(len(lease.gpus), 'GPU')} in "
            f"{escape(lease.pool)}) was reclaimed because {what}."
        ),
        context(clip(escape(because), 500)),
        context(f"`/gpu why {lease.code}` shows the whole story; `/gpu borrow` asks again."),
    ]
    return message(text, blocks)


def unreserved_message(node: str, index: int, pool: str, unix_user: str) -> Message:
    text = f"Your process runs on {node} GPU {index} without a lease."
    blocks = [
        section(
            f":eyes: A process of `{escape(unix_user)}` runs on *{escape(node)}* GPU {index} "
            f"({escape(pool)}) without a lease. Others may be given this GPU at any moment."
        ),
        section(f"Reserve it: `/gpu borrow 1 {escape(pool)} for 4h because …`, or one click:"),
        actions(
            f"unreserved:{node}:{index}",
            button(
                f"Borrow 1 {pool} for 4h",
                BORROW_QUICK_ACTION,
                f"{pool}:1:240:{node}:{index}",
                style="primary",
            ),
        ),
    ]
    return message(text, blocks)


def admin_notice(text: str) -> Message:
    return message(defang(text), [section(f":information_source: {defang(text)}")])


def admin_digest(lines: Sequence[str], earlier: int = 0) -> Message:
    """The notices for an admin in one message, a line each, oldest first; `earlier`: older
    lines that no longer fit."""
    shown = [f"• {clip(defang(_counted(line)), 400)}" for line in lines]
    chunks: list[str] = []
    for line in shown:  # sections of at most ~2,900 characters (Slack allows 3,000)
        if chunks and len(chunks[-1]) + len(line) < 2_900:
            chunks[-1] += "\n" + line
        else:
            chunks.append(line)
    title = f":information_source: {plural(len(lines) + earlier, 'notice')} for admins"
    blocks: list[Block] = [section(f"*{title}*")]
    blocks += [section(chunk) for chunk in chunks[:45]]
    if earlier:
        blocks.append(context(f"{plural(earlier, 'older notice')} no longer shown here."))
    newest = _counted(lines[-1]) if lines else ""
    text = f"{plural(len(lines) + earlier, 'notice')} for admins, the newest: {newest}"
    return message(clip(defang(text), 300), blocks)


def _counted(line: str) -> str:
    """ "1 processes run" as people write it: "1 process runs"."""
    line = re.sub(r"\b1 processes run\b", "1 process runs", line)
    return re.sub(r"\b1 processes\b", "1 process", line)
