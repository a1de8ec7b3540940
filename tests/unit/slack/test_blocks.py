"""Block Kit builders: every surface validates, stays within Slack's limits, and tells people
what they need (hosts, CUDA_VISIBLE_DEVICES, expiry, ids on the buttons)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.services.results import (
    ApprovalEffects,
    BorrowResult,
    Explanation,
    ExtendResult,
    FairShareUse,
    GpuSlot,
    HeldFor,
    PassedOver,
    QueueEntry,
    Recall,
    Recalled,
    Refused,
    ReleaseResult,
    SettleResult,
)
from bot.slack import blocks as kit
from bot.slack.blocks import Message
from bot.slack.blocks.warnings import reclaimed_message, warning_message
from bot.slack.parse import ParseProblem, parse
from bot.slack.texts import SUBCOMMANDS
from rules.domain import Outcome
from tests.unit.slack.builders import (
    ALICE,
    BOB,
    T0,
    VICTOR,
    a_home,
    a_lease,
    a_pool,
    a_quota,
    a_request,
    assert_within_limits,
    texts_of,
)

EXPIRY_DATE = "<!date^1772463600^{date_short_pretty} at {time}|2026-03-02 15:00 UTC>"
NASTY = "<!channel> & <script>alert(1)</script> `rm -rf` " * 200
FAIR_SHARE = FairShareUse(
    weight=1,
    weights=3,
    weight_share=1 / 3,
    usage=80.0,
    usage_share=0.45,
    half_life=timedelta(days=7),
)


def _borrow(outcome: Outcome, **overrides: Any) -> BorrowResult:
    lease = a_lease() if outcome == Outcome.APPROVE else None
    return BorrowResult(
        outcome, a_request(**overrides), "team over nominal", "ask-over-nominal", lease
    )


def _extend(outcome: Outcome) -> ExtendResult:
    request = a_request(id=13, kind="extend", lease_id=7, duration=timedelta(hours=2))
    return ExtendResult(outcome, a_lease(), "extensions are cheap", "extend-ok", request)


MANY_LEASES = tuple(a_lease(id=n, gpus=(GpuSlot(f"node-{n}", 0),)) for n in range(1, 41))
SETTLED = a_request(state="approved", decided_by=VICTOR, decided_at=T0 + timedelta(minutes=5))
DENIED = a_request(state="denied", decided_by=VICTOR, decided_at=T0 + timedelta(minutes=5))

NOTHING_QUEUED = ApprovalEffects(queued=0)
WAITING_2 = ApprovalEffects(queued=2, waits=True, behind=(3, 4))
OVERTAKING = ApprovalEffects(queued=2, overtakes=(3, 4))
RECALLING = ApprovalEffects(
    queued=0,
    waits=True,
    recalls=(Recalled(7, BOB, 2, "nlp"), Recalled(9, NASTY, 1, NASTY)),
    notice=timedelta(minutes=30),
)


PASSED = (
    PassedOver(Recalled(12, BOB, 2, "nlp"), "protected leases are never recalled"),
    PassedOver(Recalled(14, BOB, 1, "nlp"), "too young to recall for another 25m (minimum 1h)"),
    PassedOver(Recalled(9, ALICE, 1, "vision"), "its holder was preempted or warned (cooldown)"),
    PassedOver(Recalled(15, ALICE, 1, "vision"), "protected leases are never recalled"),
    PassedOver(Recalled(16, ALICE, 1, "vision"), "protected leases are never recalled"),
)


def _entry(
    position: int, *, recalls: int = 0, guaranteed: bool = True, passed: int = 0
) -> QueueEntry:
    """The request at `position` in the a100 queue, with `recalls` leases recalled for it
    and `passed` borrowed leases passed over."""
    return QueueEntry(
        request=a_request(id=position, state="queued"),
        position=position,
        head="R1" if position > 1 else "",
        waits_for="only 1 of 16 GPUs are free in a100 right now",
        free=1,
        guaranteed=guaranteed,
        recalls=tuple(
            Recall(Recalled(7 + n, BOB, 2, "nlp"), T0 + timedelta(minutes=30) if n == 0 else None)
            for n in range(recalls)
        ),
        withdrawn_at=T0 + timedelta(days=1),
        passed_over=PASSED[:passed],
        expected_start=T0 + timedelta(hours=2) if position == 1 else None,
        for_gpus=position == 1,
    )


def _own(position: int) -> QueueEntry:
    """A high-priority request of vision, beyond its nominal, preempting Bob's two leases."""
    return replace(
        _entry(position, guaranteed=False),
        recalls=tuple(
            Recall(Recalled(n, BOB, 3, "vision"), None, position, within_team=True)
            for n in (20, 21)
        ),
    )


MESSAGES: dict[str, Callable[[], Message]] = {
    "approval card": lambda: kit.approval_card(
        a_request(), "Alice", a_quota(), WAITING_2, "over nominal"
    ),
    "approval card, extension": lambda: kit.approval_card(
        a_request(kind="extend", lease_id=7), "Alice", a_quota(), NOTHING_QUEUED, ""
    ),
    "approval card, nasty": lambda: kit.approval_card(
        a_request(reason=NASTY), NASTY, a_quota(team=NASTY), RECALLING, NASTY
    ),
    "settled card": lambda: kit.settled_card(SETTLED, "Alice", because="over nominal"),
    "settled card, denied": lambda: kit.settled_card(DENIED, "Alice", note=NASTY),
    "settle reply": lambda: kit.settle_reply(SettleResult(SETTLED, a_lease(), "Approved R12.")),
    "settle reply, twice": lambda: kit.settle_reply(
        SettleResult(SETTLED, None, "R12 was already approved.", already_settled=True)
    ),
    "grant": lambda: kit.grant_message(a_lease()),
    "grant, many hosts": lambda: kit.grant_message(
        a_lease(gpus=tuple(GpuSlot(f"host-{n:03}", i) for n in range(200) for i in range(8)))
    ),
    **{f"borrow {o}": partial(kit.borrow_reply, _borrow(o), _entry(3)) for o in Outcome},
    "borrow nasty": lambda: kit.borrow_reply(_borrow(Outcome.DENY, reason=NASTY)),
    **{f"extend {o}": partial(kit.extend_reply, _extend(o)) for o in Outcome},
    "release": lambda: kit.release_reply(ReleaseResult((a_lease(),), (a_request(),))),
    "release nothing": lambda: kit.release_reply(ReleaseResult(())),
    "release many": lambda: kit.release_reply(ReleaseResult(MANY_LEASES)),
    "why": lambda: kit.explanation_message(
        Explanation("R12", "R12: <@U0ALICE01> asked", ("A1 `borrow:asked`", "A2 <!here>"))
    ),
    "why, long": lambda: kit.explanation_message(Explanation("L7", "L7", (NASTY,) * 300)),
    "why, empty": lambda: kit.explanation_message(Explanation("A31", "A31: nothing")),
    "refused": lambda: kit.refused_message(Refused("There is no lease L9.", "no-lease")),
    "problem": lambda: kit.problem_message(
        ParseProblem(["2 GPUs"], "I did not understand `fo`.", "/gpu borrow 2 a100")
    ),
    "help": kit.help_message,
    "help, unknown": lambda: kit.help_message("frobnicate"),
    **{f"help {c}": partial(kit.help_message, c) for c in SUBCOMMANDS},
    "mine": lambda: kit.mine_message([a_lease()], [a_request()]),
    "mine, empty": lambda: kit.mine_message([], []),
    "mine, many": lambda: kit.mine_message(MANY_LEASES, [a_request(id=n) for n in range(30)]),
    "status": lambda: kit.status_message([a_pool(), a_pool(name="l40s", protected=True)]),
    "status, many": lambda: kit.status_message([a_pool(name=f"p{n}") for n in range(80)]),
    "status, none": lambda: kit.status_message([]),
    "quota": lambda: kit.quota_message([a_quota(), a_quota(pool="l40s", used=6)], "vision"),
    "quota, none": lambda: kit.quota_message([], "nlp"),
    "quota, fair share": lambda: kit.quota_message(
        [a_quota(fair_share=FAIR_SHARE), a_quota(pool="l40s", fair_share=FAIR_SHARE)], "vision"
    ),
    "queue": lambda: kit.queue_message([_entry(n, recalls=9) for n in range(1, 61)]),
    "queue, passed over": lambda: kit.queue_message(
        [_entry(n, recalls=n % 2 * 9, passed=5) for n in range(1, 61)]
    ),
    "queue, empty": lambda: kit.queue_message([]),
    "queue, within a team": lambda: kit.queue_message([_own(n) for n in range(1, 61)]),
}
VIEWS: dict[str, Callable[[], dict[str, Any]]] = {
    "home": lambda: kit.home_view(a_home()),
    "home, paused": lambda: kit.home_view(a_home(paused=True)),
    "home, empty": lambda: kit.home_view(a_home(team=None, leases=(), requests=(), pools=())),
    "home, 40 leases": lambda: kit.home_view(
        a_home(leases=MANY_LEASES, requests=tuple(a_request(id=n) for n in range(30)))
    ),
    "borrow modal": lambda: kit.borrow_modal(["a100", "l40s", "inference"], "a100", T0),
    "borrow modal, no default": lambda: kit.borrow_modal(["a100"], None, T0),
    "deny modal": lambda: kit.deny_modal(12),
}


@pytest.mark.parametrize("build", MESSAGES.values(), ids=MESSAGES.keys())
def test_every_message_validates_and_stays_within_slack_limits(
    build: Callable[[], Message],
) -> None:
    """slack_sdk's validators pass for every block; 50 blocks, 3000-char sections, a fallback."""
    assert_within_limits(build())


@pytest.mark.parametrize("build", VIEWS.values(), ids=VIEWS.keys())
def test_every_view_validates_and_stays_within_slack_limits(
    build: Callable[[], dict[str, Any]],
) -> None:
    """Home tab and modals pass slack_sdk's View validation and the 100-block limit."""
    assert_within_limits(build())


def test_grant_dm_says_where_to_run_and_until_when() -> None:
    """Host, indices, the CUDA_VISIBLE_DEVICES line, the expiry token and two buttons."""
    grant = kit.grant_message(a_lease())
    text = texts_of(grant)
    assert "*a100-node-01* · GPUs 0, 1 · `CUDA_VISIBLE_DEVICES=0,1`" in text
    assert EXPIRY_DATE in text
    assert "2026-03-02 15:00 UTC" in grant.text
    buttons = grant.blocks[-1]
    assert "lease:7" == buttons["block_id"]
    assert [("lease_extend", "7", "primary"), ("lease_release", "7", "danger")] == [
        (b["action_id"], b["value"], b.get("style")) for b in buttons["elements"]
    ]


def test_grant_dm_gives_one_line_per_host() -> None:
    lease = a_lease(gpus=(GpuSlot("n2", 3), GpuSlot("n1", 1), GpuSlot("n1", 0)))
    text = texts_of(kit.grant_message(lease))
    assert "`CUDA_VISIBLE_DEVICES=0,1`" in text
    assert "*n2* · GPU 3 · `CUDA_VISIBLE_DEVICES=3`" in text


def test_approval_card_buttons_carry_the_request_id() -> None:
    """Approve (primary) and Deny (danger) both hold R12's id, in block `request:12`."""
    card = kit.approval_card(a_request(), "Alice", a_quota(), WAITING_2, "over nominal")
    buttons = card.blocks[-1]
    assert "request:12" == buttons["block_id"]
    assert [("request_approve", "12", "primary"), ("request_deny", "12", "danger")] == [
        (b["action_id"], b["value"], b.get("style")) for b in buttons["elements"]
    ]
    text = texts_of(card)
    for fact in (f"<@{ALICE}>", "2 GPUs", "a100", "6h", "ablations", "Rules: over nominal"):
        assert fact in text
    assert "3 in use of 4 guaranteed" in text
    assert "brings the team to 5 GPUs of 4 guaranteed, borrowing 1 of at most 4" in text
    assert "approving queues it behind R3, R4" in text


def test_the_approval_card_says_whom_approving_overtakes_and_what_it_recalls() -> None:
    now = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), OVERTAKING, "why"))
    assert "grants it at once, *ahead of* R3, R4, still waiting" in now
    later = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), RECALLING, "why"))
    assert "approving queues it at the head of the queue" in later
    assert f"*recalls* L7 (<@{BOB}>, 2 GPUs, team nlp borrowing)" in later
    assert "taken 30m after the warning" in later
    taking = ApprovalEffects(
        queued=1,
        overtakes=(3,),
        recalls=(Recalled(7, BOB, 2, "nlp"),),
        notice=timedelta(minutes=30),
    )
    both = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), taking, "why"))
    assert "It takes GPUs that requests inside their team's nominal wait for, so approving" in both
    assert f"*recalls* L7 (<@{BOB}>, 2 GPUs, team nlp borrowing)" in both


def test_the_approval_card_says_which_waiting_guarantees_hold_gpus_back() -> None:
    held = ApprovalEffects(
        queued=1,
        waits=True,
        behind=(7,),
        waits_for="other teams have no unused GPUs to lend in a100 right now",
        held_for=(HeldFor(7, "nlp", 2), HeldFor(8, "vision", 1)),
    )
    text = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), held, "why"))
    assert "2 GPUs are held for nlp's waiting request R7 (inside its nominal)" in text
    assert "1 GPU is held for vision's waiting request R8" in text
    plain = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), WAITING_2, "why"))
    assert "held for" not in plain


def test_settled_card_says_who_decided_and_when_without_buttons() -> None:
    approved = kit.settled_card(SETTLED, "Alice")
    denied = kit.settled_card(DENIED, "Alice", note="over quota <b>")
    assert all(b["type"] != "actions" for b in approved.blocks + denied.blocks)
    assert f"Approved by <@{VICTOR}> <!date^" in texts_of(approved)
    named = kit.settled_card(SETTLED, "Alice Anders", decider_name="Victor Vision")
    assert "Approved by Victor Vision <!date^" in texts_of(named)  # "… today at 1:38 PM"
    assert "@" not in texts_of(named).split("Approved by")[1]
    assert "|2026-03-02 09:05 UTC>: over quota &lt;b&gt;" in texts_of(denied)
    assert texts_of(denied).count("Denied by") == 1


def test_user_text_is_escaped_and_truncated() -> None:
    """A hostile reason can neither ping a channel nor burst a field."""
    card = kit.approval_card(a_request(reason=NASTY), "Alice", a_quota(), NOTHING_QUEUED, "")
    text = texts_of(card)
    assert "<!channel>" not in text
    assert "&lt;!channel&gt; &amp; &lt;script&gt;" in text
    assert "…" in text


def test_service_mrkdwn_keeps_mentions_but_never_broadcasts() -> None:
    why = kit.explanation_message(
        Explanation("R1", "R1 by <@U0ALICE01>", ("<!here> <!date^1^{time}|x>",))
    )
    text = texts_of(why)
    assert "<@U0ALICE01>" in text
    assert "&lt;!here>" in text
    assert "<!date^1^{time}|x>" in text


def test_borrow_replies_say_what_happens_next() -> None:
    approve, ask, queue, deny = (
        kit.borrow_reply(_borrow(o), _entry(3, recalls=1))
        for o in (Outcome.APPROVE, Outcome.ASK, Outcome.QUEUE, Outcome.DENY)
    )
    assert "CUDA_VISIBLE_DEVICES=0,1" in texts_of(approve)
    assert f"<@{VICTOR}> in <#C0APPROVE>" in texts_of(ask)
    assert "position 3 in a100" in texts_of(queue)
    assert f"borrowed GPUs are recalled: L7 (<@{BOB}>, 2 GPUs, team nlp): taken <!date^" in (
        texts_of(queue)
    )
    assert "team over nominal" in texts_of(deny)
    assert kit.replies.DENIED_ADVICE in texts_of(deny)


def test_the_queue_says_where_each_request_stands_and_why() -> None:
    head = texts_of(kit.queue_message([_entry(1, recalls=0, guaranteed=False)]))
    assert "First of team vision's requests in the a100 queue; 1 GPU free now." in head
    assert "Why it waits: only 1 of 16 GPUs are free in a100 right now" in head
    assert "Withdrawn <!date^" in head
    assert "Expected to start <!date^" in head
    assert "recalled" not in head
    behind = texts_of(kit.queue_message([_entry(2, recalls=0)]))
    assert "Behind R1 in team vision's queue for a100." in behind
    assert "nothing borrowed can be recalled yet" in behind
    recalling = texts_of(kit.queue_message([_entry(1, recalls=2)]))
    assert "L7 (<@U0BOB0001>, 2 GPUs, team nlp): taken <!date^" in recalling
    assert "L8 (<@U0BOB0001>, 2 GPUs, team nlp): warned now, taken after the notice" in recalling


def test_the_queue_explains_each_borrowed_lease_recall_passes_over_briefly() -> None:
    stuck = texts_of(kit.queue_message([_entry(1, passed=2)]))
    assert "nothing borrowed can be recalled yet" not in stuck
    assert (
        "no borrowed lease can be recalled for it now: L12 (<@U0BOB0001>, 2 GPUs, team nlp): "
        "protected leases are never recalled; L14 (<@U0BOB0001>, 1 GPU, team nlp): too young "
        "to recall for another 25m (minimum 1h)."
    ) in stuck
    many = texts_of(kit.queue_message([_entry(1, recalls=1, passed=5)]))
    assert "borrowed GPUs are recalled: L7" in many
    assert "Passed over: L12 " in many
    assert "L9 (<@U0ALICE01>, 1 GPU, team vision): its holder was preempted" in many
    assert "and 2 more leases passed over." in many
    assert "L15" not in many


def test_why_shows_what_a_waiting_guarantee_cannot_recall() -> None:
    why = texts_of(kit.explanation_message(Explanation("R3", "R3", (), passed_over=PASSED[:1])))
    assert (
        "It waits inside its team's nominal quota; these borrowed leases cannot be recalled for "
        "it now: L12 (<@U0BOB0001>, 2 GPUs, team nlp): protected leases are never recalled."
    ) in why
    assert "cannot be recalled" not in texts_of(kit.explanation_message(Explanation("R3", "R")))


def test_home_with_forty_leases_stays_within_a_hundred_blocks() -> None:
    home = kit.home_view(a_home(leases=MANY_LEASES))
    assert len(home["blocks"]) <= 100
    assert "…and 25 more leases not shown here." in texts_of(home)


def test_home_shows_the_pause_notice_only_while_paused() -> None:
    assert "Automation is paused" in texts_of(kit.home_view(a_home(paused=True)))
    assert "Automation is paused" not in texts_of(kit.home_view(a_home()))


def test_slack_date_renders_in_the_readers_zone_with_a_utc_fallback() -> None:
    assert EXPIRY_DATE == kit.slack_date(datetime(2026, 3, 2, 15, tzinfo=UTC))
    assert "<!date^1772463600^{time}|2026-03-02 15:00 UTC>" == kit.slack_date(
        datetime(2026, 3, 2, 16, tzinfo=ZoneInfo("Europe/Berlin")), "{time}"
    )


def test_clip_never_cuts_an_entity_or_a_token_in_half() -> None:
    assert "a…" == kit.kit.clip("a &amp;&amp;&amp;", 5)
    assert "x…" == kit.kit.clip("x<!date^1^{time}|fallback>", 10)


def test_quota_bar_shows_nominal_and_borrowed_use() -> None:
    assert "█████▓▓░░░" == kit.overview.quota_bar(a_quota(nominal=5, borrowing_limit=5, used=7))
    assert "░░░░░░░░░░" == kit.overview.quota_bar(a_quota(nominal=0, borrowing_limit=0, used=0))


def test_quota_shows_each_pools_fair_share_when_it_is_on() -> None:
    """One short line per pool: the weight against the pool's and the recent use."""
    shown = texts_of(kit.quota_message([a_quota(fair_share=FAIR_SHARE)], "vision"))
    assert "\nFair share: weight 1 of 3 (33%); recent use 45% of the pool's (half-life 7d)" in shown
    assert "the team whose recent use is furthest below its weight's share goes first" in shown
    off = texts_of(kit.quota_message([a_quota()], "vision"))
    assert "Fair share" not in off
    weighted = replace(FAIR_SHARE, weight=1.5, weights=4.5, usage_share=0.0)
    assert "Fair share: weight 1.5 of 4.5 (33%); recent use 0% of the pool's" in texts_of(
        kit.quota_message([a_quota(fair_share=weighted)], "vision")
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300))
def test_any_parse_problem_renders_within_limits(text: str) -> None:
    """Whatever was typed, the problem reply validates and stays within limits."""
    got = parse("borrow " + text, now=T0, tz=ZoneInfo("UTC"), pools=("a100", "l40s"))
    if isinstance(got, ParseProblem):
        assert_within_limits(kit.problem_message(got))


def test_the_queue_shows_a_teams_lower_priority_leases_preempted_for_a_request() -> None:
    text = texts_of(kit.queue_message([_own(1)]))
    assert (
        "Lower-priority leases of its own team vision are preempted for it: L20 (<@U0BOB0001>, "
        "3 GPUs, team vision): warned now, taken after the notice; L21 "
    ) in text
    assert "inside its team's nominal" not in text.lower()  # not a guarantee: no lender recall
    young = PassedOver(Recalled(22, BOB, 1, "vision"), "too young to recall for another 25m")
    stuck = replace(_own(1), recalls=(), passed_within=(young,))
    assert (
        "Lower-priority leases of its own team that cannot be preempted for it now: L22 "
        "(<@U0BOB0001>, 1 GPU, team vision): too young to recall for another 25m."
    ) in texts_of(kit.queue_message([stuck]))


def test_a_preemption_within_a_team_is_told_as_such_to_the_holder() -> None:
    recall = {
        "request": 12,
        "team": "vision",
        "because": "preempted for R12, a high-priority request of your team vision",
        "within_team": True,
    }
    warned = texts_of(
        warning_message(
            a_lease(),
            "preempt",
            "the sweep rule's reason",
            grace=timedelta(minutes=30),
            now=T0,
            time_left_min=0,
            idle_for_min=0,
            snoozes_left=0,
            recall=recall,
            notice=timedelta(minutes=30),
        )
    )
    assert "L7 is preempted" in warned
    assert (
        "The GPUs of *L7* are preempted for R12, a higher-priority request of your team "
        "*vision*. Save your work: they are taken <!date^"
    ) in warned
    assert "preempted for R12, a high-priority request of your team vision" in warned
    assert "borrowed" not in warned
    reclaimed = texts_of(reclaimed_message(a_lease(), "preempted", "", within_team=True))
    assert "reclaimed because a higher-priority request of your team needs the GPUs" in reclaimed
    mine = texts_of(
        kit.mine_message([a_lease(recalled_for="vision (R12)", recalled_within_team=True)], [])
    )
    assert "Preempted for a higher-priority request of your team: vision (R12)" in mine


def test_the_approval_card_says_which_leases_of_the_team_approving_preempts() -> None:
    effects = ApprovalEffects(
        queued=0,
        waits=True,
        preempts=(Recalled(20, BOB, 3, "vision"),),
        notice=timedelta(minutes=30),
    )
    card = texts_of(kit.approval_card(a_request(), "Alice", a_quota(), effects, ""))
    assert (
        "It outranks these lower-priority leases of its own team, so approving *preempts* "
        "L20 (<@U0BOB0001>, 3 GPUs): warned now, taken 30m after the warning."
    ) in card
    assert "recalls" not in card
