"""Ephemeral replies to `/gpu`: each borrow outcome, a refusal, text that did not parse, the
`why` / `audit` explanations, and help.
"""

from __future__ import annotations

from bot.services.results import BorrowResult, Explanation, QueueEntry, Refused
from bot.slack.blocks.kit import (
    MAX_SECTION_TEXT,
    Block,
    Message,
    clip,
    context,
    defang,
    escape,
    header,
    mention,
    message,
    plural,
    remind_button,
    section,
    slack_date,
    utc_text,
)
from bot.slack.blocks.leases import lease_buttons, placement_lines, unvouched
from bot.slack.blocks.overview import passed_over_text, recall_lines
from bot.slack.parse import ParseProblem
from bot.slack.texts import COMMANDS, FOOTER, OVERVIEW, TIMES_NOTE
from rules.domain import Outcome, format_duration

DENIED_ADVICE = (
    "Ask for fewer GPUs or less time, say why with `because …`, or wait for GPUs to come "
    "free: `/gpu status` shows pools, `/gpu quota` your team's use."
)


def _route(route: str) -> str:
    if route.startswith(("C", "G")):
        return f"in <#{route}>"
    return "by DM"


def borrow_reply(result: BorrowResult, queued: QueueEntry | None = None) -> Message:
    """Granted (what and where), asked (whom and why), queued (why and where in line), denied."""
    request, because = result.request, escape(result.because)
    size = f"{plural(request.gpus, 'GPU')} in {escape(request.pool)}"
    length = format_duration(request.duration)
    lease = result.lease
    blocks: list[Block]
    if result.outcome == Outcome.APPROVE and lease is not None:
        text = f"Granted {lease.code}: {size} for {length}, until {utc_text(lease.expires_at)}."
        granted = f"Granted *{lease.code}*: {size} until {slack_date(lease.expires_at)}."
        blocks = [
            section(f":white_check_mark: {granted}"),
            section("\n".join(placement_lines(lease))),
        ]
        if lease.unknown:
            blocks.append(unvouched(lease.unknown))
        blocks.append(lease_buttons(lease))
    elif result.outcome == Outcome.ASK:
        who = ", ".join(mention(a) for a in request.approvers[:10]) or "the approvers"
        text = f"{request.code} needs approval: I asked {who} {_route(request.approval_route)}."
        blocks = [section(f":hourglass: {text}\nYou asked for {size} for {length}.")]
        blocks.append(context("You get a DM when they decide. Why they were asked: " + because))
        blocks.append(remind_button(request.id))
    elif result.outcome == Outcome.QUEUE:
        where = f" at position {queued.position} in {escape(request.pool)}" if queued else ""
        text = f"{request.code} is queued{where}: {size} for {length}."
        blocks = [section(f":inbox_tray: {text}\nIt is granted by itself when GPUs come free.")]
        recalled = recall_lines(queued) if queued else []
        if recalled:
            blocks.append(section(recalled[0]))
        blocks.append(context(f"Why: {because} · `/gpu queue` shows the line"))
    else:
        text = f"{request.code} was denied: {size} for {length}."
        blocks = [section(f":no_entry: {text}\n*Why:* {because}"), section(DENIED_ADVICE)]
    blocks.append(
        context(f"Decided by rule `{escape(result.deciding)}` · `/gpu why {request.code}`")
    )
    return message(text, blocks)


def refused_message(refused: Refused) -> Message:
    """A use case that did nothing: its message already says why and how to go on."""
    text = defang(refused.message)
    return message(text, [section(text), context(escape(FOOTER))])


def problem_message(problem: ParseProblem) -> Message:
    """Text that did not parse: what was understood, what was not, and what to type instead."""
    blocks = []
    if problem.understood:
        understood = ", ".join(escape(u) for u in problem.understood)
        blocks.append(section(f"*I understood:* {understood}"))
    blocks.append(section(escape(problem.problem) or "I could not read that."))
    blocks.append(section(f"*Try:* `{escape(problem.example)}`"))
    blocks.append(context(escape(FOOTER)))
    return message(escape(problem.message()), blocks)


def explanation_message(explanation: Explanation, zone: str = "UTC") -> Message:
    """`why` and `audit`: the summary, the reason in full, then the recorded decisions, oldest
    first, their times in `zone` (the reader's, named in a note under them)."""
    title = explanation.title or f"Why {explanation.subject}"
    blocks = [header(title), section(defang(explanation.summary))]
    if explanation.reason:
        blocks.append(section(f"*Reason:* {escape(explanation.reason)}"))
    if explanation.passed_over:
        blocks.append(
            section(
                "It waits inside its team's nominal quota; these borrowed leases cannot be "
                "recalled for it now: " + passed_over_text(explanation.passed_over)
            )
        )
    chunk: list[str] = []
    for raw in explanation.lines:
        item = f"• {clip(defang(raw), MAX_SECTION_TEXT // 2)}"
        if len("\n".join([*chunk, item])) > MAX_SECTION_TEXT:
            blocks.append(section("\n".join(chunk)))
            chunk = []
        chunk.append(item)
    if chunk:
        blocks.append(section("\n".join(chunk)))
    if not explanation.lines:
        blocks.append(context("Nothing is recorded about it yet."))
    else:
        blocks.append(context(escape(TIMES_NOTE.format(zone=zone))))
    return message(defang(explanation.summary), blocks)


def help_message(topic: str | None = None) -> Message:
    """The overview, or the help of `topic` (an unknown topic gets the overview and a note)."""
    command = COMMANDS.get(topic or "")
    if command is None:
        lines = [f"`{escape(c.usage)}`\n{escape(c.summary)}" for c in COMMANDS.values()]
        blocks = [header("gpubot: borrow shared GPUs"), section(OVERVIEW)]
        if topic:
            blocks.append(section(f"There is no command `{escape(topic)}`; here are all of them."))
        blocks += [
            section("\n".join(lines[:6])),
            section("\n".join(lines[6:])),
            context(escape(FOOTER)),
        ]
        return message("gpubot commands: " + ", ".join(COMMANDS), blocks)
    examples = "\n".join(f"`{escape(e)}`" for e in command.examples)
    blocks = [
        header(f"/gpu {topic}"),
        section(f"`{escape(command.usage)}`\n{escape(command.summary)}"),
    ]
    if command.details:
        blocks.append(section(escape(command.details)))
    blocks += [section(f"*Examples*\n{examples}"), context(escape(FOOTER))]
    return message(f"/gpu {topic}: {command.summary}", blocks)
