"""The queue: requests waiting for GPUs are granted when GPUs come free, in the order of
rules.queueing (inside nominal first, then fair share, then priority, then arrival). A request
further back starts first only as `queue.backfill` allows: by default when it delays no earlier
request's expected start, computed from the leases' end times."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlmodel import Session

from bot.services import admin, notices
from bot.services.context import SYSTEM, Context, record
from bot.services.grants import decide, facts_now, grant, queue_of
from bot.services.results import LeaseView
from rules.approvals import approvers_for, route_for
from rules.decision import Decision
from rules.domain import (
    Outcome,
    RequestState,
    format_duration,
)
from rules.marks import Marks
from rules.policy import Backfill
from rules.queueing import Ending, Queued, Slot, Timeline, expected_starts
from storage import leases as storage_leases
from storage import outbox
from storage.audit import AuditTag
from storage.gpus import free_count
from storage.outbox import owe
from storage.pools import lock as lock_pool
from storage.requests import per_transaction, queued_since
from storage.tables import RequestRow


def serve_queue(ctx: Context, pools: list[str] | None = None) -> list[LeaseView]:
    """Grant what now fits, pool by pool, walking each queue in serving order.

    Requests that waited longer than the pool's `max_queue_wait` are withdrawn first, and
    their requesters told."""
    granted: list[LeaseView] = []
    for pool in pools if pools is not None else sorted(ctx.policy.pools):
        _time_out(ctx, pool)
        with ctx.db.write() as session:
            lock_pool(session, pool)
            waiting = queue_of(ctx, session, pool)
            if waiting:  # (the common case, nothing waits, needs no timeline of the pool)
                granted += _walk(ctx, session, pool, waiting)
    return granted


def _walk(
    ctx: Context, session: Session, pool: str, remaining: list[tuple[RequestRow, bool]]
) -> list[LeaseView]:
    """Settle, in serving order, each team's first request and every request that could start
    now, asking the rules again. One that waits for GPUs holds its expected start (with
    `reserve`), so those behind it start only where they delay nobody; it is asked again when
    it leads its team's queue or its GPUs come. With `none`, the first that waits stops the
    walk. `remaining`: the pool's queue in serving order."""
    backfill = ctx.policy.queue.backfill
    line = timeline(ctx, session, pool, ctx.now())
    granted: list[LeaseView] = []
    heads: set[str] = set()  # teams whose first request was asked about
    for row, inside in list(remaining):
        if line.deep:
            break  # backfill looks no deeper: those further back wait their turn
        want = timedelta(seconds=row.duration_s)
        fits = line.fits_now(row.gpus, want)
        head = row.team not in heads
        heads.add(row.team)
        if backfill != Backfill.NONE and not fits and not head:
            if backfill == Backfill.RESERVE:  # it waits for GPUs: asked again when they come
                line.reserve(row.id or 0, row.gpus, want)
            continue
        ahead = _delays(ctx, session, line, row) if backfill == Backfill.RESERVE else 0
        facts = facts_now(ctx, session, row, ahead=ahead, queue=remaining)
        lease, moved = _serve(ctx, session, row, decide(ctx, facts))
        if moved:
            remaining.remove((row, inside))
        if lease is not None:
            granted.append(lease)
            line.start(row.gpus, want)
        elif moved:
            continue
        elif backfill == Backfill.NONE:
            break
        elif backfill == Backfill.RESERVE and not fits:
            line.reserve(row.id or 0, row.gpus, want)
    return granted


def _delays(ctx: Context, session: Session, line: Timeline, row: RequestRow) -> int:
    """How many earlier requests `row` would delay by starting now (`pool.queued`)."""
    want = timedelta(seconds=row.duration_s)
    return len(set(line.delays(row.gpus, want)) | set(pushed_back(ctx, session, row)))


def pushed_back(ctx: Context, session: Session, row: RequestRow) -> list[int]:
    """The requests before `row` in the queue whose expected start would be later if `row`
    started now. Its lease counts towards its team's nominal use while it runs, so it can put
    another request of its team ahead of one waiting inside nominal: the queue is ordered and
    the expected starts computed again with the lease counted as held, and compared."""
    now = ctx.now()
    backfill = ctx.policy.queue.backfill
    rows = [r for r, _ in queue_of(ctx, session, row.pool, extra=row)]
    place = next(i for i, r in enumerate(rows) if r is row or (row.id and r.id == row.id))
    ahead = [queued(r) for r in rows[:place]]
    if not ahead:
        return []
    line = timeline(ctx, session, row.pool, now)
    if line.available(now) < row.gpus:
        return []  # it cannot start now anyway
    held = {row.team: row.gpus}
    was = expected_starts(ahead, timeline(ctx, session, row.pool, now), backfill)
    line.start(row.gpus, timedelta(seconds=row.duration_s))
    others = [
        queued(r) for r, _ in queue_of(ctx, session, row.pool, also_held=held) if r.id != row.id
    ]
    will = expected_starts(others, line, backfill)
    later = []
    for q in ahead:
        start, then = was[q.request].start, will[q.request].start if q.request in will else None
        if start is not None and q.request in will and (then is None or start < then):
            later.append(q.request)
    return later


def timeline(ctx: Context, session: Session, pool: str, now: datetime) -> Timeline:
    """The pool's GPUs over time: free now, and each active lease's usable GPUs back at its
    end, or sooner when it is being recalled (the delivered warning plus the notice). What it
    is built from is read once while the transaction changes nothing (a walk of the queue asks
    for it for each request it weighs), the leases' ends only as far as the questions asked of
    it need (`Ends`); each caller gets a timeline of its own to reserve on."""
    ends = per_transaction(session, ("timeline", pool, now), lambda: Ends(ctx, session, pool, now))
    return Timeline(now, ends.free, ends.ordered())


class Ends:
    """A pool's free GPUs and its active leases' usable GPUs with when they come back, in
    order of that time: those being recalled read whole (their marks say when), the others
    from the index of the pool's leases by expiry, a chunk at a time as a timeline asks for
    more (backfill looks about a hundred requests deep, a large pool holds thousands of
    leases). The leases are those of the moment it is made: a lease granted since (a walk of
    the queue grants, and counts each grant on its timeline) is left out by its id; the
    transactions that hold a timeline end no lease and recall none."""

    FIRST = 128  # leases in the first chunk; each further one is as long as all before it

    def __init__(self, ctx: Context, session: Session, pool: str, now: datetime) -> None:
        notice = ctx.policy.recall.notice
        self._session, self._pool = session, pool
        self._upto = storage_leases.last_id(session)
        recalled = storage_leases.pool_leases(session, pool, teams=())
        self._besides = [row.id for row in recalled]
        ending = []
        for row in recalled:
            end = row.expires_at
            if row.marks.recalled_at is not None:
                end = min(end, (taken_at(session, row.marks, notice) or now + notice))
            ending.append(Ending(row.usable, end))
        self._recalled = sorted(ending, key=lambda e: e.at)
        self.free = free_count(session, pool)
        self._read: list[Ending] = []
        self._last: tuple[datetime, int] | None = None  # the expiry and id read last
        self._seen: set[int] = set()  # the ids read
        self._done = False

    def ordered(self) -> Iterator[Ending]:
        """Every end, in order of `at`; read further only as far as it is iterated."""
        return heapq.merge(self._recalled, self._others(), key=lambda e: e.at)

    def _others(self) -> Iterator[Ending]:
        i = 0
        while i < len(self._read) or not self._done:
            if i == len(self._read):
                self._more()
                continue
            yield self._read[i]
            i += 1

    def _more(self) -> None:
        limit = max(self.FIRST, len(self._read))
        rows = storage_leases.ends_by_expiry(
            self._session,
            self._pool,
            upto=self._upto,
            besides=self._besides,
            after=self._last,
            limit=limit,
        )
        # A lease read already and extended since (PostgreSQL reads each chunk anew) comes
        # again further on: it counts once, as first read.
        self._read += [Ending(usable, at) for usable, at, i in rows if i not in self._seen]
        self._seen.update(i for _, _, i in rows)
        if rows:
            self._last = (rows[-1][1], rows[-1][2])
        self._done = len(rows) < limit


def pool_leases(session: Session, pool: str) -> list[storage_leases.PoolLease]:
    """The pool's active leases (storage.leases.pool_leases), read once while the transaction
    changes nothing: `/gpu queue` and an approval card weigh them for recall and for the
    timeline, thousands of them in a large pool. Shared: not to be changed."""
    return per_transaction(
        session, ("pool leases", pool), lambda: storage_leases.pool_leases(session, pool)
    )


def taken_at(session: Session, marks: Marks, notice: timedelta) -> datetime | None:
    """The earliest a recalled lease (with these marks) is reclaimed: its warning's delivery
    plus the notice (None until the warning is delivered)."""
    delivered = delivered_at(session, marks.warning_outbox("preempt"))
    return delivered + notice if delivered is not None else None


def delivered_at(session: Session, outbox_id: int | None) -> datetime | None:
    """When the message owed in outbox row `outbox_id` was delivered (None: not yet)."""
    owed = outbox.get(session, outbox_id) if outbox_id is not None else None
    return owed.delivered_at if owed is not None else None


def slots(ctx: Context, session: Session, pool: str) -> dict[int, Slot]:
    """Each queued request's expected start, as the queue stands (rules.queueing)."""
    now = ctx.now()
    waiting = [queued(row) for row, _ in queue_of(ctx, session, pool)]
    return expected_starts(waiting, timeline(ctx, session, pool, now), ctx.policy.queue.backfill)


def queued(row: RequestRow) -> Queued:
    return Queued(
        row.id or 0,
        row.team,
        row.gpus,
        row.priority,
        row.created_at,
        timedelta(seconds=row.duration_s),
    )


def _time_out(ctx: Context, pool: str) -> None:
    """Withdraw what waited too long; while automation is paused, only record that it would
    have (the request keeps its place and is withdrawn at the first pass after resume)."""
    limit = ctx.policy.pools[pool].limits.max_queue_wait
    now = ctx.now()
    with ctx.db.write() as session:
        stale = queued_since(session, pool, now - limit)
        paused = bool(stale) and admin.is_paused(session, ctx)
        for request in stale:
            why = f"it waited longer than {format_duration(limit)} for free GPUs"
            if paused:
                text = f"R{request.id} would have been withdrawn from the {pool} queue: {why}."
                tag, subject = AuditTag.QUEUE_WOULD_HAVE, f"request:{request.id}"
                admin.would_have(
                    session,
                    ctx,
                    tag=tag,
                    subject=subject,
                    outcome="would cancel",
                    text=text,
                    at=now,
                )
                continue
            request.state, request.decided_at = RequestState.CANCELLED, now
            request.decided_by = SYSTEM
            session.add(request)
            record(
                session,
                at=now,
                actor=SYSTEM,
                tag=AuditTag.QUEUE_TIMED_OUT,
                subject=f"request:{request.id}",
                outcome="cancelled",
                detail={"why": why},
            )
            notices.settled(session, request, by=SYSTEM, verdict="timeout", reason=why, at=now)


def _serve(
    ctx: Context, session: Session, request: RequestRow, decision: Decision
) -> tuple[LeaseView | None, bool]:
    """Settle a queued request if the rules allow it now; (lease granted, whether it left the
    queue)."""
    now = ctx.now()
    assert decision.verdict is not None
    outcome = decision.verdict.outcome
    person = request.decided_by not in (None, SYSTEM)  # a manager already said yes
    subject = f"request:{request.id}"
    if outcome == Outcome.DENY:
        request.state, request.decided_at, request.decided_by = RequestState.DENIED, now, SYSTEM
        session.add(request)
        record(
            session,
            at=now,
            actor=SYSTEM,
            tag=AuditTag.BORROW_DENIED,
            subject=subject,
            decision=decision,
            detail={"from": "queue"},
        )
        notices.settled(
            session, request, by=SYSTEM, verdict="deny", reason=decision.because, at=now
        )
        return None, True
    if outcome == Outcome.ASK and not person:
        who = decision.verdict.approvers or "managers"
        request.state = RequestState.PENDING
        request.approvers = approvers_for(ctx.policy, request.team, who)
        request.approval_route = route_for(ctx.policy, request.team, who)
        session.add(request)
        record(
            session,
            at=now,
            actor=SYSTEM,
            tag=AuditTag.BORROW_ASKED,
            subject=subject,
            decision=decision,
            detail={"from": "queue"},
        )
        notices.approval_cards(session, request, at=now)
        return None, True
    if outcome == Outcome.QUEUE or (person and decision.once_approved() == Outcome.QUEUE):
        return None, False  # still waiting
    lease = grant(ctx, session, request, now, actor=SYSTEM, decision=decision)
    if lease is None:
        return None, False
    request.state, request.decided_at = RequestState.APPROVED, now
    request.decided_by = request.decided_by or SYSTEM
    session.add(request)
    if request.approval_route:  # approved, then queued: its cards now say granted
        owe(session, notices.card_redrawn(request, by=SYSTEM), at=now)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.QUEUE_GRANTED,
        subject=subject,
        decision=decision,
        outcome="approve",
        detail={"lease": lease.id},
    )
    return lease, True
