"""The digests as Slack draws them: the lab's week with its text bars, idle leases and cost, and
a person's own week, every figure checked by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, date, datetime

from bot.services.digests import IdleLease, LabDigest, PersonalDigest
from bot.slack.blocks.digests import lab_digest, personal_digest
from rules.reports import Counts, Figures, Line, Report, Scope, ScopeKind, Usage, Window
from tests.unit.slack.builders import assert_within_limits

H = 3600.0
CAROL = "U0CAROL01"
WEEK = Window(
    datetime(2026, 11, 23, 8, tzinfo=UTC), datetime(2026, 11, 30, 8, tzinfo=UTC), "week of Nov 23"
)
# what every reader sees in their own time zone (Monday 23 to Monday 30 November, 08:00 UTC)
SINCE = "<!date^1795420800^{date_short_pretty} at {time}|2026-11-23 08:00 UTC>"
UNTIL = "<!date^1796025600^{date_short_pretty} at {time}|2026-11-30 08:00 UTC>"


def a_report(usage: Usage, lines: tuple[Line, ...], *, scope: Scope, **figures: object) -> Report:
    return Report(
        scope=scope,
        window=WEEK,
        figures=Figures(usage=usage, **figures),  # type: ignore[arg-type]
        lines=lines,
        by="team" if scope.kind == ScopeKind.LAB else "pool",
        currency="USD",
        priced=True,
    )


LAB = a_report(
    Usage(6 * H, 2 * H, 3 * H, 3 * H, 0.5 * H, 1 * H, cost=14.4),
    (Line("vision", Usage(4 * H, 2 * H, cost=9.6)), Line("nlp", Usage(2 * H, cost=4.8))),
    scope=Scope(ScopeKind.LAB),
    wait_p50_s=240.0,
    wait_p90_s=3720.0,
    granted=23,
    counts=Counts(reclaims=3, extensions=5, recalls=1),
)


def test_the_lab_digest_says_the_weeks_figures_per_team_and_the_idle_leases() -> None:
    """Posted in a channel: the idle leases by code, team and pool, nobody's name or id."""
    idle = (IdleLease("L2", "nlp", "a100", Usage(allocated_s=2 * H, idle_s=2 * H)),)
    drawn = lab_digest(LabDigest(LAB, idle, date(2026, 11, 23), 7))
    assert_within_limits(drawn)
    summary = (
        "*6.0 GPU-h* held, 33 % efficiency (2.0 GPU-h used); 3.0 GPU-h held idle, 0.5 GPU-h "
        "with no readings (never counted as idle); 1.0 GPU-h used without a lease. "
        "Cost: 14.40 USD."
    )
    assert [
        "GPU use, week of Nov 23",
        summary,
        "23 requests granted, after 4m (median) and 1h 2m (90 %). "
        "3 reclaimed, 5 extended, 1 recalled.",
        "*By team*\n"
        "`██████░░░░░░  50 %`  *vision*  2.0 of 4.0 GPU-h used\n"
        "`░░░░░░░░░░░░   0 %`  *nlp*  0.0 of 2.0 GPU-h used",
        "*Held but idle the most*\n• L2 (nlp, a100): 2.0 of 2.0 GPU-h idle",
        f"From the hourly usage records, {SINCE} to {UNTIL}. `/gpu report lab` shows more.",
    ] == [_text(block) for block in drawn.blocks]
    assert f"GPU use, week of Nov 23: {summary}" == drawn.text
    assert CAROL not in json.dumps(drawn.blocks)


def test_a_week_without_use_says_so() -> None:
    empty = a_report(Usage(), (), scope=Scope(ScopeKind.LAB))
    drawn = lab_digest(LabDigest(empty, (), date(2026, 11, 23), 7))
    assert "GPU use, week of Nov 23: no GPU was held or used in the 7 days." == drawn.text


def test_the_personal_digest_says_the_persons_week_and_each_pool() -> None:
    """41 GPU-h held, 25.83 of them used (63 %), 9 idle; 30 h of a100 at 2.40 and 11 h of
    l40s at 1.10 cost 72.00 + 12.10 = 84.10. l40s: 3.33 of 11 h is 30 %, 3.6 of 12 bars: 4."""
    mine = a_report(
        Usage(41 * H, 0.63 * 41 * H, idle_s=9 * H, cost=84.1),
        (
            Line("a100", Usage(30 * H, 0.75 * 30 * H, cost=72.0)),
            Line("l40s", Usage(11 * H, 0.63 * 41 * H - 0.75 * 30 * H, cost=12.1)),
        ),
        scope=Scope(ScopeKind.ME, CAROL),
    )
    drawn = personal_digest(PersonalDigest(CAROL, mine, date(2026, 11, 23), 7))
    assert_within_limits(drawn)
    text = (
        "Your GPUs last week: 41.0 GPU-h held, 63 % efficiency (25.8 GPU-h used), "
        "9.0 GPU-h of it idle; cost 84.10 USD."
    )
    assert text == drawn.text
    assert [
        text,
        "`█████████░░░  75 %`  *a100*  22.5 of 30.0 GPU-h used\n"
        "`████░░░░░░░░  30 %`  *l40s*  3.3 of 11.0 GPU-h used",
        f"From the hourly usage records, {SINCE} to {UNTIL}. `/gpu report me` shows more.",
    ] == [_text(block) for block in drawn.blocks]


def test_requests_still_waiting_are_named_beside_the_waits() -> None:
    """The lab: 2 requests of the week still waiting, the oldest for 3h 5m; a person: 1."""
    waiting = replace(LAB, figures=replace(LAB.figures, still_waiting=2, oldest_wait_s=11100.0))
    drawn = lab_digest(LabDigest(waiting, (), date(2026, 11, 23), 7))
    assert (
        "23 requests granted, after 4m (median) and 1h 2m (90 %); 2 still waiting, the oldest "
        "for 3h 5m. 3 reclaimed, 5 extended, 1 recalled."
    ) == _text(drawn.blocks[2])
    nothing = a_report(
        Usage(), (), scope=Scope(ScopeKind.ME, CAROL), still_waiting=1, oldest_wait_s=1800.0
    )
    mine = personal_digest(PersonalDigest(CAROL, nothing, date(2026, 11, 29), 1))
    assert (
        "Your GPUs in the last day: you held none. 1 request of yours is still waiting, for 30m."
    ) == mine.text


def test_a_daily_personal_digest_of_nothing_held() -> None:
    nothing = a_report(Usage(), (), scope=Scope(ScopeKind.ME, CAROL))
    drawn = personal_digest(PersonalDigest(CAROL, nothing, date(2026, 11, 29), 1))
    assert "Your GPUs in the last day: you held none." == drawn.text


def _text(block: dict[str, object]) -> str:
    if block["type"] == "context":
        elements = block["elements"]
        assert isinstance(elements, list)
        return " ".join(e["text"] for e in elements)
    text = block["text"]
    assert isinstance(text, dict)
    return str(text["text"])
