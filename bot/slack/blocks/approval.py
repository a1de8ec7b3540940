"""The approval card a manager answers, the same card once settled (updated in place, no buttons),
and the reply to the manager who clicked.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from bot.services.results import ApprovalEffects, QuotaUse, RequestView, SettleResult
from bot.slack.blocks.kit import (
    APPROVE_ACTION,
    DENY_ACTION,
    Block,
    Message,
    actions,
    button,
    clip,
    context,
    defang,
    escape,
    header,
    mention,
    message,
    plural,
    request_block,
    section,
    slack_date,
)
from bot.slack.blocks.leases import lease_summary
from bot.slack.blocks.overview import quota_line
from rules.approvals import SHOWN_REASON
from rules.domain import format_duration

_SETTLED = {
    "approved": "Approved",
    "denied": "Denied",
    "cancelled": "Withdrawn",
    "queued": "Approved (waiting for GPUs)",
}


def _is_extension(request: RequestView) -> bool:
    return request.kind == "extend"


def _summary(request: RequestView, requester_name: str) -> str:
    length = format_duration(request.duration)
    if _is_extension(request):
        return f"{requester_name} asks to extend L{request.lease_id} by {length} ({request.code})"
    gpus = plural(request.gpus, "GPU")
    return f"{requester_name} asks for {gpus} in {request.pool} for {length} ({request.code})"


def _facts(request: RequestView, requester_name: str) -> list[Block]:
    """Header and the who / how many / which pool / how long / why fields."""
    kind = "Extension request" if _is_extension(request) else "GPU request"
    length = format_duration(request.duration)
    fields = [
        f"*Who*\n{mention(request.requester)}",
        f"*How many*\n{plural(request.gpus, 'GPU')}",
        f"*Which pool*\n{escape(request.pool)}",
        f"*How long*\n{'+' if _is_extension(request) else ''}{length}",
        f"*Priority*\n{escape(request.priority)}",
    ]
    if _is_extension(request) and request.lease_id is not None:
        fields.append(f"*Lease*\nL{request.lease_id}")
    fields.append(f"*Why*\n{shown_reason(request)}")
    return [header(f"{kind} {request.code}: {requester_name}"), section(fields=fields)]


def shown_reason(request: RequestView) -> str:
    """The reason as a card or DM shows it: at most `SHOWN_REASON` characters; `/gpu why`
    has it all."""
    if not request.reason:
        return "_no reason given_"
    shown = clip(escape(request.reason), SHOWN_REASON)
    if len(request.reason) > SHOWN_REASON:
        shown += f" (`/gpu why {request.code}` has it all)"
    return shown


def approval_card(
    request: RequestView,
    requester_name: str,
    quota: QuotaUse,
    effects: ApprovalEffects,
    because: str,
    *,
    escalated: str = "",
) -> Message:
    """The card for the approvers: the facts, the team's quota, the rules' reason, two buttons;
    `escalated`: the line saying who it was escalated to."""
    lines = [f"Team *{escape(quota.team)}* in *{escape(quota.pool)}*: {quota_line(quota)}"]
    if not _is_extension(request):
        after = quota.used + request.gpus
        over = max(0, after - quota.nominal)
        then = f"Approving brings the team to {plural(after, 'GPU')} of {quota.nominal} guaranteed"
        if over:
            then += f", borrowing {over} of at most {quota.borrowing_limit}"
        lines.append(then + ".")
    lines += effect_lines(request, effects)
    value = str(request.id)
    blocks = [
        *_facts(request, escape(requester_name)),
        section("\n".join(lines)),
        context(f"Rules: {escape(because)}" if because else "No rule decided; the default asks."),
        *([context(escalated)] if escalated else []),
        actions(
            request_block(request.id),
            button("Approve", APPROVE_ACTION, value, style="primary"),
            button("Deny", DENY_ACTION, value, style="danger"),
        ),
    ]
    return message(escape(_summary(request, requester_name)) + ". Approve or deny?", blocks)


def _codes(ids: tuple[int, ...]) -> str:
    shown = ", ".join(f"R{i}" for i in ids[:8])
    return shown + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")


def effect_lines(request: RequestView, effects: ApprovalEffects) -> list[str]:
    """What approving would do: go ahead of the queue, or wait in it and recall leases."""
    if _is_extension(request):
        queued = effects.queued
        return [
            f"{plural(queued, 'request')} queued in this pool."
            if queued
            else "Nothing is queued in this pool."
        ]
    if effects.refused:
        return [
            f"The rules would now refuse it ({clip(escape(effects.refused), 500)}), so "
            "approving denies it with that reason."
        ]
    if not effects.waits:
        if not effects.overtakes:
            lines = ["GPUs are free: approving grants it at once. Nothing else is queued."]
        else:
            lines = [
                f"GPUs are free: approving grants it at once, *ahead of* "
                f"{_codes(effects.overtakes)}, still waiting in this pool."
            ]
        why = "It takes GPUs that requests inside their team's nominal wait for"
    else:
        place = f"behind {_codes(effects.behind)}" if effects.behind else "at the head of the queue"
        lines = [
            f"It waits even once approved ({clip(escape(effects.waits_for), 500)}): "
            f"approving queues it {place}."
            if effects.waits_for
            else f"No GPUs are free for it now: approving queues it {place}."
        ]
        why = "It is inside the team's guarantee"
        if effects.paused:
            lines.append("Automation is paused: no borrowed lease is recalled for it meanwhile.")
    if effects.recalls:
        taken = ", ".join(
            f"L{r.lease} ({mention(r.holder)}, {plural(r.gpus, 'GPU')}, team "
            f"{escape(r.team)} borrowing)"
            for r in effects.recalls[:8]
        )
        taken = clip(taken, 1500)
        lines.append(
            f"{why}, so approving *recalls* {taken}: "
            f"warned now, taken {format_duration(effects.notice)} after the warning."
        )
    if effects.preempts:
        taken = clip(
            ", ".join(
                f"L{r.lease} ({mention(r.holder)}, {plural(r.gpus, 'GPU')})"
                for r in effects.preempts[:8]
            ),
            1500,
        )
        lines.append(
            f"It outranks these lower-priority leases of its own team, so approving *preempts* "
            f"{taken}: warned now, taken {format_duration(effects.notice)} after the warning."
        )
    lines.extend(
        f"{plural(h.gpus, 'GPU')} {'is' if h.gpus == 1 else 'are'} held for "
        f"{escape(h.team)}'s waiting request R{h.request} (inside its nominal), so they are "
        "not lent."
        for h in effects.held_for[:4]
    )
    return lines


def settled_card(
    request: RequestView,
    requester_name: str,
    *,
    because: str = "",
    note: str = "",
    by_bot: bool = False,
    decider_name: str = "",
) -> Message:
    """The card after a decision: the same facts, who settled it (by name) and when, and no
    buttons: "Approved by Victor Vision today at 1:38 PM". `by_bot`: the bot withdrew it
    (expired, or its wait ran out), and `note` says why."""
    verb = _SETTLED.get(request.state, "Settled")
    if by_bot and note:
        line = f"{clip(escape(note), 1000)}."
        if request.decided_at is not None:
            line += f" {verb} {slack_date(request.decided_at)}."
    else:
        by = escape(decider_name) if decider_name else mention(request.decided_by)
        line = f"{verb} by {by}"
        if request.decided_at is not None:
            line += f" {slack_date(request.decided_at)}"
        if note:
            line += f": {clip(escape(note), 1000)}"
    blocks = [*_facts(request, escape(requester_name))]
    if because:
        blocks.append(context(f"Rules: {escape(because)}"))
    blocks.append(context(line))
    text = f"{escape(_summary(request, requester_name))}: {verb.lower()}."
    return message(text, blocks)


def settle_reply(result: SettleResult) -> Message:
    """What the manager who clicked sees: the outcome, and the lease when GPUs were granted."""
    blocks = [section(defang(result.message))]
    if result.already_settled:
        blocks.append(context("Nothing changed: this request had already been settled."))
    if result.lease is not None:
        blocks.append(section(lease_summary(result.lease)))
    return message(defang(result.message), blocks)


def denied_message(request: RequestView, decider_name: str, reason: str) -> Message:
    """The requester's DM when a person denied their request: what was asked, who denied it,
    and why, so it reads on its own."""
    length = format_duration(request.duration)
    if _is_extension(request):
        asked = f"to extend L{request.lease_id} by {length}"
    else:
        asked = f"{request.gpus} × {escape(request.pool)} for {length}"
    if request.reason:
        asked += f", because “{clip(escape(request.reason), SHOWN_REASON)}”"
    text = f"{escape(decider_name)} denied {request.code} ({asked})."
    blocks = [section(f":no_entry: {text}")]
    if reason:
        blocks.append(section(f"*Why:* {clip(escape(reason), 1000)}"))
    blocks.append(
        context(
            "You can ask again with fewer GPUs, less time or another pool. "
            f"`/gpu why {request.code}` shows the whole story."
        )
    )
    return message(text, blocks)


def escalated_line(targets: tuple[str, ...], after: timedelta) -> str:
    """The mark on a card that was escalated: to whom, how long after it was filed, and, for a
    channel, that the admins settle it from there (`rules.approvals.escalation_settlers`)."""
    line = f"⏫ Escalated to {_people(targets)} after {format_duration(_minutes(after))}."
    channels = tuple(t for t in targets if t[:1] in ("C", "G"))
    if channels:
        line += f" In {_people(channels)}, the gpubot admins approve or deny it."
    return line


def approval_reminder(
    request: RequestView,
    requester_name: str,
    asked: tuple[str, ...],
    waited: timedelta,
    *,
    in_thread: bool,
    by: str = "",
) -> Message:
    """A reminder for the approvers: in the card's thread, or a DM."""
    what = escape(_summary(request, requester_name))
    ago = format_duration(_minutes(waited))
    lead = f"{escape(requester_name)} asked me to remind you. " if by else ""
    text = f"{lead}Still waiting for you, {_people(asked)}: {what}, filed {ago} ago."
    route = request.approval_route
    if in_thread:
        where = "Approve or deny it on the card above."
    elif route.startswith(("C", "G")):
        where = f"Approve or deny it on its card in <#{route}>."
    else:
        where = "Approve or deny it on its card in this conversation."
    where += " Home lists everything waiting for you."
    return message(text, [section(text), context(where)])


def extension_waiting(
    request: RequestView, asked: tuple[str, ...], lease_ends_at: datetime
) -> Message:
    """The holder's DM when the lease nears its end and the extension still waits."""
    lease = f"L{request.lease_id}"
    text = (
        f"Your extension request {request.code} (+{format_duration(request.duration)} for "
        f"{lease}) is still waiting for {_people(asked)}; {lease} ends at "
        f"{slack_date(lease_ends_at, '{time}')} unless it is approved before then."
    )
    blocks = [
        section(text),
        context(
            "Save your work before then. Your GPUs are taken back at the end as usual; "
            f"`/gpu borrow` asks for new ones, `/gpu why {request.code}` shows where it stands."
        ),
    ]
    return message(text, blocks)


def nudge_reply(
    request: RequestView, asked: tuple[str, ...], *, again_at: datetime, ago: timedelta | None
) -> Message:
    """What the requester sees after *Remind approvers*: done (`ago` None), or how long ago
    they did and when they can again."""
    when = slack_date(again_at, "{time}")
    if ago is None:
        text = (
            f"Reminded {_people(asked)} about {request.code}. You can remind them again at {when}."
        )
    else:
        minutes = max(1, int(ago.total_seconds() // 60))
        text = (
            f"You reminded them {minutes} min ago; you can again at {when} "
            "(at most once every 15 minutes)."
        )
    return message(text, [section(text)])


def asked_again_reply(request: RequestView, asked: tuple[str, ...]) -> Message:
    """*Ask again* clicked once more: nothing new was filed; where the first click's request
    stands."""
    if asked:
        where = f"{request.code} is waiting for {_people(asked)}."
    else:
        where = f"{request.code} is {request.state}."
    text = f"You asked again already: {where}"
    return message(
        text, [section(text), context(f"`/gpu why {request.code}` shows where it stands.")]
    )


def _people(who: tuple[str, ...]) -> str:
    """People as mentions and channels as links: "<@U1>, <@U2> and <#C1>"."""
    shown = [f"<#{w}>" if w[:1] in ("C", "G") else mention(w) for w in who[:6]]
    if len(who) > 6:
        shown.append(f"{len(who) - 6} more")
    if not shown:
        return "the approvers"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _minutes(span: timedelta) -> timedelta:
    return timedelta(minutes=max(1, round(span.total_seconds() / 60)))
