"""The reclaim loop as timelines a person can read: minute by minute, telemetry comes in, the
sweep runs, warnings are delivered to the local Slack, people click, and leases end.

Time is frozen and moved by the test (freezegun); the sweep and the outbox delivery are the
job functions themselves, called once a minute as the scheduler would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from slack_sdk.http_retry.builtin_handlers import ServerErrorRetryHandler
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator
from sqlmodel import col, select

from bot.localslack import LocalSlack
from bot.settings import DEFAULT_RULES_DIR
from storage import audit
from storage.tables import AuditRow, OutboxRow
from tests.integration.conftest import settings_for, story_with
from tests.integration.story import ADA, ALICE, ERIN, T0, Story, busy, idle


def test_a_two_hour_borrow_is_warned_at_60_and_10_then_reclaimed_after_grace(story: Story) -> None:
    """Busy all along: warnings at T-60 and T-10, expiry at 120, reclaim 30 minutes after the
    last delivered warning and the expiry; the processes left behind are unreserved use."""
    lease = story.borrow(ALICE, "a100", 2, hours=2)
    story.run(200, busy, lease=lease)
    assert [
        (60, "warn expiry"),
        (110, "warn expiry"),
        (150, "reclaim expired"),
        (151, "notify a100-node-01:0"),
        (151, "notify a100-node-01:1"),
    ] == story.events
    assert "reclaimed" == story.state(lease)
    posted = str([c.args.get("text") for c in story.local.calls.of("chat.postMessage")])
    assert "ends soon" in posted
    dm = str([m.text for m in story.local.messages(story.local.dm_channel(ALICE))])
    assert "was reclaimed" in dm
    assert "ends soon" not in dm  # the warnings now say how the lease ended


def test_an_idle_lease_is_warned_snoozed_warned_again_and_reclaimed(story: Story) -> None:
    """Idle from the start: warned at 90, "Still using" at 100 buys 2h, warned again when the
    snooze ends, reclaimed after the grace."""
    lease = story.borrow(ALICE, "a100", 1, hours=8)
    story.run(100, idle, lease=lease)
    story.click_in_dm(ALICE, "lease_snooze")
    story.run(300, idle, lease=lease)
    assert [
        (91, "warn idle"),  # the first sample came at 0:30, so 90 idle minutes end at 91
        (100, "U0ALICE01 lease_snooze"),
        (220, "warn idle"),
        (250, "reclaim idle"),
    ] == story.lease_events()
    assert "reclaimed" == story.state(lease)


@pytest.mark.parametrize("outage", [None, "error"], ids=["silence", "nvml-error"])
def test_stale_telemetry_or_an_nvml_error_is_never_read_as_idle(
    story: Story, outage: str | None
) -> None:
    """Warned at 90; then the samples stop (or fail) for an hour: no reclaim. Once they come
    back idle, the idle clock starts again: a fresh warning, then the reclaim."""
    lease = story.borrow(ALICE, "a100", 1, hours=8)

    def timeline(minute: int) -> float | str | None:
        return outage if 100 <= minute < 160 else 0.0

    story.run(400, timeline, lease=lease)
    assert [(91, "warn idle"), (251, "warn idle"), (281, "reclaim idle")] == story.lease_events()


def test_a_protected_lease_is_never_reclaimed(story: Story) -> None:
    """Idle and past its expiry on the protected pool: admins hear once, nothing is taken."""
    lease = story.borrow(ERIN, "inference", 1, hours=2)
    story.run(400, idle, lease=lease)
    assert "active" == story.state(lease)
    kinds = [e for _, e in story.events]
    assert "reclaim expired" not in kinds
    assert "reclaim idle" not in kinds
    assert 1 == sum(1 for e in kinds if e.startswith("notify"))
    notices = [m.text for m in story.local.messages(story.local.dm_channel(ADA))]
    assert any("protected lease" in n for n in notices)


def test_paused_automation_reclaims_nothing_and_says_what_it_would_have_done(
    story: Story,
) -> None:
    """The kill switch: "would have" records and one admin notice per action, no reclaim."""
    assert isinstance(story.bot.services.pause(ADA), str)
    lease = story.borrow(ALICE, "a100", 1, hours=1)
    story.run(300, idle, lease=lease)
    assert "active" == story.state(lease)
    would = [e for _, e in story.events if e.startswith("would")]
    assert ["would warn expiry (paused)"] == would  # idle only counts before expiry
    with story.bot.db.read() as session:
        tags = session.exec(select(AuditRow.tag)).all()
    assert 1 == tags.count("sweep:would-have")
    assert "lease:reclaimed" not in tags


def test_no_reclaim_until_the_warning_was_delivered_and_the_grace_passed(story: Story) -> None:
    """Slack fails the warning DM for an hour: the lease outlives its expiry until the warning
    lands, then the grace runs from that delivery."""
    lease = story.borrow(ALICE, "a100", 1, hours=2)
    # The client still retries each failure, only without sleeping between tries.
    story.bot.client.retry_handlers = [
        ServerErrorRetryHandler(
            max_retry_count=2, interval_calculator=FixedValueRetryIntervalCalculator(0)
        )
    ]
    story.run(59, busy, lease=lease)
    story.local.faults.add("chat.postMessage", status=500, times=10_000)
    story.run(170, busy, lease=lease)
    assert "active" == story.state(lease)  # expired at 120, warned but never delivered
    story.local.faults.clear()
    story.run(260, busy, lease=lease)
    reclaim = [m for m, e in story.events if e == "reclaim expired"]
    with story.bot.db.read() as session:
        warnings = session.exec(select(OutboxRow).where(OutboxRow.kind == "lease_warning")).all()
    # The T-60 warning, superseded by the T-10 one while Slack was down, is never sent late.
    assert ["dropped", "delivered"] == [w.state for w in warnings]
    delivered = warnings[-1].delivered_at
    assert delivered is not None
    assert delivered >= T0 + timedelta(minutes=170)
    assert reclaim, story.events
    assert T0 + timedelta(minutes=reclaim[0]) >= delivered + timedelta(minutes=30)


def test_the_sweep_run_twice_changes_nothing_the_second_time(story: Story) -> None:
    """Level-triggered and idempotent: same rows in the audit log and the outbox."""
    lease = story.borrow(ALICE, "a100", 2, hours=2)
    story.run(65, busy, lease=lease, sweep=False)
    first = story.bot.services.sweep(story.telemetry)
    assert first.changed
    with story.bot.db.read() as session:
        before = (
            len(session.exec(select(AuditRow)).all()),
            len(session.exec(select(OutboxRow)).all()),
        )
    second = story.bot.services.sweep(story.telemetry)
    with story.bot.db.read() as session:
        after = (
            len(session.exec(select(AuditRow)).all()),
            len(session.exec(select(OutboxRow)).all()),
        )
        assert audit.verify(session).ok
    assert not second.changed
    assert before == after
    assert 1 == len(story.bot.services.leases(ALICE))


def test_two_actions_in_one_pass_are_audited_each_with_its_own_rule(story: Story) -> None:
    """An expiry warning and an idle warning in the same pass: two audit rows, each naming
    the rule that asked for it and giving that rule's reason, not the other's."""
    lease = story.borrow(ALICE, "a100", 1, hours=2.5)
    story.run(95, idle, lease=lease, sweep=False)
    report = story.bot.services.sweep(story.telemetry)
    assert [f"L{lease} expiry", f"L{lease} idle"] == sorted(report.warned)
    with story.bot.db.read() as session:
        rows = session.exec(
            select(AuditRow).where(AuditRow.tag == "lease:warned").order_by(col(AuditRow.id))
        ).all()
    got = {r.outcome: (r.deciding_rule, r.matching_rules, r.detail["because"]) for r in rows}
    assert {
        "warn expiry": (
            "warn-before-expiry",
            ["warn-before-expiry"],
            f"lease {lease} ends in 55m",
        ),
        "warn idle": (
            "warn-idle",
            ["warn-idle"],
            f"the GPUs of lease {lease} have been idle for 1h 34m",
        ),
    } == got
    why = story.answer(ALICE, f"why L{lease}")
    assert "warn idle by rule `warn-idle`, because the GPUs of" in why
    assert "warn expiry by rule `warn-before-expiry`, because lease" in why


HOSTILE = """
  - id: reclaim-everything-idle-at-once
    on: lease
    when: lease.idle
    then: reclaim idle
  - id: reclaim-everything-expired-at-once
    on: lease
    when: lease.expired
    then: reclaim expired
"""


@pytest.fixture
def hostile_story(local: LocalSlack, tmp_path: Path) -> Iterator[Story]:
    """Rule files whose sweep rules reclaim with no warning and no grace, protected or not."""
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in DEFAULT_RULES_DIR.glob("*.yaml"):  # the cases would refuse these rules
        text = path.read_text()
        if path.name == "sweep.yaml":
            text = "rules:" + HOSTILE + text.split("rules:", 1)[1]
        (rules / path.name).write_text(text)
    settings = settings_for(local, tmp_path).model_copy(update={"rules_dir": rules})
    with story_with(settings, local) as told:
        yield told


def test_the_invariants_hold_whatever_the_rules_say(hostile_story: Story) -> None:
    """Rules asking to reclaim at once are held back until a warning was delivered and the
    grace passed; a protected lease is never reclaimed at all."""
    story = hostile_story
    plain = story.borrow(ALICE, "a100", 1, hours=8)
    protected = story.borrow(ERIN, "inference", 1, hours=1)
    story.run(200, idle, lease=[plain, protected])
    assert "active" == story.state(protected)
    reclaims = [(m, e) for m, e in story.events if e.startswith("reclaim")]
    warned = [m for m, e in story.events if e == "warn idle"]
    assert reclaims, story.events
    assert warned, story.events
    assert reclaims[0][0] >= warned[0] + 30  # the grace, from the delivered warning
