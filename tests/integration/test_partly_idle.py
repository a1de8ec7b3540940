"""Per-GPU idle, told minute by minute: a 4-GPU lease runs on one GPU, its holder is warned
about the other three, gives them back with one click, and the queue is served at once."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import col, select

from bot.services import BorrowAsk
from bot.services.results import BorrowResult, GpuSlot, SettleResult
from bot.slack.blocks.warnings import GIVE_BACK_IDLE_ACTION, KEEP_ALL_ACTION, SNOOZE_ACTION
from storage.tables import AuditRow
from tests.integration.story import ADA, ALICE, ERIN, Story, _sample

BOB, CAROL = "U0BOB0001", "U0CAROL01"


def _borrow(story: Story, user: str, gpus: int) -> BorrowResult:
    ask = BorrowAsk("a100", gpus, timedelta(hours=8), reason="training runs")
    result = story.bot.services.borrow(user, ask)
    assert isinstance(result, BorrowResult), result
    return result


def _run_on_one_gpu(story: Story, lease: int, until: int) -> None:
    """Minute by minute to `until`: the lease's first GPU works, the others do nothing."""
    view = story.bot.services.lease(lease)
    assert view is not None
    first, *rest = view.gpus
    while story.minute < until:
        for _ in range(2):
            story.clock.tick(timedelta(seconds=30))
            samples = [_sample(first.node, first.index, 85.0)]
            samples += [_sample(s.node, s.index, 0.0) for s in rest]
            story.telemetry.observe(samples)
        story.minute += 1
        story.pass_()


def _full_pool_and_a_waiting_request(story: Story) -> int:
    """The a100 pool full (16 of 16 held), and Bob's request for 2 more approved to wait."""
    for user, gpus in ((BOB, 4), (CAROL, 6), (ERIN, 2)):
        result = _borrow(story, user, gpus)
        assert result.lease is not None, result
    waiting = _borrow(story, BOB, 2)
    settled = story.bot.services.approve(ADA, waiting.request.id)
    assert isinstance(settled, SettleResult)
    assert "queued" == settled.request.state
    return waiting.request.id


def test_a_lease_busy_on_one_of_four_gpus_gives_back_three_and_the_queue_moves(
    story: Story,
) -> None:
    """Warned once the three idle GPUs pass the idle threshold; Give back leaves a 1-GPU lease
    on the busy GPU, audited as lease:shrunk, and the waiting request starts at once."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    waiting = _full_pool_and_a_waiting_request(story)
    _run_on_one_gpu(story, lease.id, 95)
    assert [(91, "warn partly_idle")] == [e for e in story.lease_events() if "warn" in e[1]]
    dm = story.dms(ALICE)[-1]
    assert "3 of your 4 GPUs in *L1* have been idle for 1h 30m" in dm
    assert "Give back the 3 idle GPUs" in dm
    assert "Still using" in dm
    assert "Keep" in dm
    busy_gpu = lease.gpus[0]

    story.click_in_dm(ALICE, GIVE_BACK_IDLE_ACTION)

    now = story.bot.services.lease(lease.id)
    assert now is not None
    assert ("active", (busy_gpu,)) == (now.state, now.gpus)
    with story.bot.db.read() as session:
        shrunk = session.exec(select(AuditRow).where(col(AuditRow.tag) == "lease:shrunk")).one()
    assert ALICE == shrunk.actor
    assert sorted(f"{s.node}:{s.index}" for s in lease.gpus[1:]) == sorted(
        shrunk.detail["gave_back"]
    )
    assert 1 == shrunk.detail["kept"]
    request = story.bot.services.request(waiting)
    assert request is not None
    assert ("approved", True) == (request.state, request.lease_id is not None)
    answer = str(story.local.calls.of("response_url")[-1].args)
    assert "gave back 3 GPUs" in answer
    assert "keeps 1 GPU" in answer
    assert "The freed GPUs went to the queue at once" in answer
    assert "Stop anything still running on the GPUs you gave back" in answer


def _all_four_on(story: Story, gpus: tuple[GpuSlot, ...], minutes: int) -> None:
    """Alice's processes stay on all four GPUs, the first one working."""
    for _ in range(minutes):
        for _ in range(2):
            story.clock.tick(timedelta(seconds=30))
            story.telemetry.observe(
                [_sample(s.node, s.index, 85.0 if s == gpus[0] else 0.0) for s in gpus]
            )
        story.minute += 1
        story.pass_()


def test_processes_left_on_given_back_gpus_are_not_offered_back_to_their_owner(
    story: Story,
) -> None:
    """The shrink reply told the holder; the admins hear whose processes stayed behind."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    _run_on_one_gpu(story, lease.id, 95)
    story.click_in_dm(ALICE, GIVE_BACK_IDLE_ACTION)
    _all_four_on(story, lease.gpus, 3)
    assert not any("without a lease" in dm for dm in story.dms(ALICE))
    told = " ".join(story.dms(ADA))
    assert "Not offered a lease: alice, whose lease gave it back." in told


def test_keep_stops_the_partly_idle_warnings_and_is_audited(story: Story) -> None:
    """Keep: every GPU stays, no second partly-idle warning after a blip, audited."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    _run_on_one_gpu(story, lease.id, 95)
    story.click_in_dm(ALICE, KEEP_ALL_ACTION)
    _run_on_one_gpu(story, lease.id, 300)
    warned = [e for _, e in story.lease_events() if e.startswith("warn")]
    assert ["warn partly_idle"] == warned
    now = story.bot.services.lease(lease.id)
    assert now is not None
    assert 4 == len(now.gpus)
    with story.bot.db.read() as session:
        tags = session.exec(select(AuditRow.tag)).all()
    assert 1 == tags.count("lease:kept")
    assert "lease:shrunk" not in tags
    assert "keeps all 4 GPUs" in str(story.local.calls.of("response_url")[-1].args)


def test_still_using_quiets_the_partly_idle_warning_until_the_snooze_ends(story: Story) -> None:
    """Still using on the partly-idle warning snoozes it like the idle warning's button."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    _run_on_one_gpu(story, lease.id, 95)
    story.click_in_dm(ALICE, SNOOZE_ACTION)
    _run_on_one_gpu(story, lease.id, 230)
    warned = [(m, e) for m, e in story.lease_events() if e.startswith("warn")]
    assert [(91, "warn partly_idle"), (215, "warn partly_idle")] == warned
    assert "No idle warning for the next 2h" in str(story.local.calls.of("response_url")[-1].args)


def test_the_slash_command_shrinks_a_lease_and_why_tells_the_story(story: Story) -> None:
    """`/gpu release L1 gpus host:i` and `keep 1` through the real app; refusals are friendly."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    last = lease.gpus[-1]
    named = story.answer(ALICE, f"release {lease.code} gpus {last.node}:{last.index}")
    assert f"{lease.code} gave back 1 GPU" in named
    assert "keeps 3 GPUs" in named
    assert "Keeping no GPUs is a release" in story.answer(ALICE, f"release {lease.code} keep 0")
    assert "does not hold nowhere:0" in story.answer(ALICE, f"release {lease.code} gpus nowhere:0")
    assert "only they or an admin may change it" in story.answer(
        BOB, f"release {lease.code} keep 1"
    )
    assert "keeps 1 GPU" in story.answer(ALICE, f"release {lease.code} keep 1")
    now = story.bot.services.lease(lease.id)
    assert now is not None
    assert (lease.gpus[0],) == now.gpus
    why = story.answer(ALICE, f"why {lease.code}")
    assert f"gave back {last.node}:{last.index}, kept 3" in why
    assert why.count("lease:shrunk") == 2


def test_a_named_gpu_that_got_busy_again_is_not_given_back(story: Story) -> None:
    """Warned about three idle GPUs; one starts working before the click: two go back."""
    lease = _borrow(story, ALICE, 4).lease
    assert lease is not None
    _run_on_one_gpu(story, lease.id, 95)
    first, second, *rest = lease.gpus
    for _ in range(2):  # a minute in which the second GPU works too
        story.clock.tick(timedelta(seconds=30))
        story.telemetry.observe(
            [_sample(s.node, s.index, 85.0) for s in (first, second)]
            + [_sample(s.node, s.index, 0.0) for s in rest]
        )
    story.minute += 1
    story.pass_()
    story.click_in_dm(ALICE, GIVE_BACK_IDLE_ACTION)
    now = story.bot.services.lease(lease.id)
    assert now is not None
    assert (first, second) == now.gpus
    assert "gave back 2 GPUs" in str(story.local.calls.of("response_url")[-1].args)
