"""Fair share's usage summed by the database is what the rules compute from the leases read
one by one, on a generated history."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from rules.domain import LeaseState
from rules.fairshare import decay_rate, decayed_usage
from storage import decay, leases
from storage.db import Database
from storage.tables import LeaseRow

NOW = datetime(2026, 3, 2, 12, 0, 0, 123_456, tzinfo=UTC)
TEAMS = ("vision", "nlp", "platform", "robotics")


def a_history(session: Session, rng: random.Random, count: int) -> None:
    """Leases of two pools over the last 60 days with microsecond times: running ones, ones
    that ended (some before the window, some stamped after `now`), a few granted after `now`."""
    for k in range(count):
        granted = NOW - timedelta(microseconds=rng.randrange(60 * 86_400 * 10**6))
        if k % 17 == 0:
            granted = NOW + timedelta(minutes=rng.uniform(1, 90))
        ended: datetime | None = None
        state = LeaseState.ACTIVE
        if rng.random() < 0.7:
            state = rng.choice((LeaseState.RELEASED, LeaseState.RECLAIMED, LeaseState.EXPIRED))
            ended = granted + timedelta(microseconds=rng.randrange(3 * 86_400 * 10**6))
        session.add(
            LeaseRow(
                holder=f"U{k % 9}",
                team=rng.choice(TEAMS),
                pool=rng.choice(("a100", "l40s")),
                gpus=rng.randint(1, 8),
                state=state,
                granted_at=granted,
                expires_at=granted + timedelta(hours=8),
                ended_at=ended,
            )
        )
    session.flush()


@pytest.mark.parametrize("half_life", [timedelta(days=7), timedelta(hours=5, seconds=7)])
def test_usage_summed_by_the_database_is_the_rules_usage(
    database: Database, half_life: timedelta
) -> None:
    """Per team, the very same decayed GPU-hours as `decayed_usage` over `held_since`, in
    each pool (and so the same order of teams)."""
    since = NOW - 6 * half_life
    with database.write() as session:
        a_history(session, random.Random(16), 600)
        for pool in ("a100", "l40s", "h100"):
            expected = decayed_usage(leases.held_since(session, pool, since), NOW, half_life)
            summed = leases.decayed_use(session, pool, since, NOW, decay_rate(half_life))
            assert expected == summed


def test_each_lease_gives_the_rules_term_exactly(database: Database) -> None:
    """With one lease a team, each team's usage is one term: the very float `decayed_usage`
    computes (ages in whole microseconds, divided as timedeltas divide)."""
    since = NOW - timedelta(days=42)
    with database.write() as session:
        for k, team in enumerate(TEAMS):
            granted = NOW - timedelta(days=k + 1, microseconds=7_919 * k + 1)
            session.add(
                LeaseRow(
                    holder="U1",
                    team=team,
                    pool="a100",
                    gpus=k + 1,
                    state=LeaseState.RELEASED if k % 2 else LeaseState.ACTIVE,
                    granted_at=granted,
                    expires_at=granted + timedelta(days=9),
                    ended_at=granted + timedelta(hours=13, microseconds=3) if k % 2 else None,
                )
            )
        session.flush()
        week = timedelta(days=7)
        expected = decayed_usage(leases.held_since(session, "a100", since), NOW, week)
        assert expected == leases.decayed_use(session, "a100", since, NOW, decay_rate(week))


def test_a_lease_thousands_of_half_lives_old_counts_as_the_rules_count_it(
    database: Database,
) -> None:
    """A running lease granted 23 days ago under a 30-minute half-life (1,104 half-lives: an
    exp() below the smallest double, which PostgreSQL refuses) weighs what the rules say."""
    half_life = timedelta(minutes=30)
    with database.write() as session:
        session.add(
            LeaseRow(
                holder="U1",
                team="vision",
                pool="a100",
                gpus=2,
                state=LeaseState.ACTIVE,
                granted_at=NOW - timedelta(days=23),
                expires_at=NOW + timedelta(days=7),
            )
        )
        session.flush()
        since = NOW - 6 * half_life
        expected = decayed_usage(leases.held_since(session, "a100", since), NOW, half_life)
        summed = leases.decayed_use(session, "a100", since, NOW, decay_rate(half_life))
    assert expected == pytest.approx(summed, rel=1e-12)
    assert summed["vision"] > 0


def test_usage_read_again_after_each_change_is_the_rules_usage(database: Database) -> None:
    """Read after read, while leases end, shrink, start and fall out of the window, and while
    the clock goes back before the latest grant, each read is what the rules compute afresh
    (SQLite keeps what it parsed of a team's leases only while their text stays the same)."""
    week = timedelta(days=7)
    rng = random.Random(7)

    def check(session: Session, now: datetime) -> None:
        since = now - 6 * week
        for pool in ("a100", "l40s"):
            expected = decayed_usage(leases.held_since(session, pool, since), now, week)
            summed = leases.decayed_use(session, pool, since, now, decay_rate(week))
            assert list(expected.items()) == list(summed.items())

    with database.write() as session:
        a_history(session, rng, 300)
        check(session, NOW)
        check(session, NOW)
        running = session.exec(
            select(LeaseRow).where(LeaseRow.state == LeaseState.ACTIVE).order_by(col(LeaseRow.id))
        ).all()
        ending, shrinking = running[0], running[1]
        ending.state, ending.ended_at = LeaseState.RELEASED, NOW - timedelta(minutes=3)
        shrinking.gpus = max(1, shrinking.gpus - 1) if shrinking.gpus > 1 else 5
        session.add_all([ending, shrinking])
        session.flush()
        check(session, NOW)
        session.add(
            LeaseRow(
                holder="U1",
                team="robotics",
                pool="l40s",
                gpus=3,
                state=LeaseState.ACTIVE,
                granted_at=NOW - timedelta(seconds=1, microseconds=1),
                expires_at=NOW + timedelta(hours=2),
            )
        )
        session.flush()
        check(session, NOW)
        check(session, NOW + 4 * week)  # the oldest ends leave the window
        check(session, NOW - timedelta(days=2))  # before some grants and ends
    with database.read() as session:
        check(session, NOW + timedelta(microseconds=1))


class UndoneError(Exception):
    """Raised to roll a transaction back."""


def test_usage_after_a_rolled_back_end_is_the_rules_usage(database: Database) -> None:
    """A lease ended in a transaction that is rolled back counts as running again at the
    next read, however the read inside that transaction saw it."""
    week = timedelta(days=7)
    since = NOW - 6 * week

    def read(session: Session) -> tuple[dict[str, float], dict[str, float]]:
        expected = decayed_usage(leases.held_since(session, "l40s", since), NOW, week)
        return expected, leases.decayed_use(session, "l40s", since, NOW, decay_rate(week))

    with database.write() as session:
        a_history(session, random.Random(3), 200)

    def end_then_undo() -> int:
        with database.write() as session:
            lease = session.exec(
                select(LeaseRow)
                .where(LeaseRow.state == LeaseState.ACTIVE, LeaseRow.pool == "l40s")
                .order_by(col(LeaseRow.id))
            ).first()
            assert lease is not None
            lease.state, lease.ended_at = LeaseState.RELEASED, NOW - timedelta(days=1)
            session.add(lease)
            session.flush()
            expected, summed = read(session)
            assert expected == summed
            raise UndoneError(lease.id)

    with pytest.raises(UndoneError) as undone:
        end_then_undo()
    lease_id = undone.value.args[0]
    with database.read() as session:
        expected, summed = read(session)
        assert expected == summed
        lease = session.get(LeaseRow, lease_id)
        assert lease is not None
        assert lease.state == LeaseState.ACTIVE


def test_sqlite_keeps_no_lists_of_teams_that_left_the_window(tmp_path: Path) -> None:
    """What SQLite keeps of a pool's teams is dropped once a team has no lease in the window:
    the kept lists stay as many as the teams using the pool now."""
    database = Database(f"sqlite:///{tmp_path / 'window.db'}")
    database.create_all()
    week = timedelta(days=7)
    url = str(database.engine.url)
    try:
        with database.write() as session:
            a_history(session, random.Random(5), 120)
            leases.decayed_use(session, "a100", NOW - 6 * week, NOW, decay_rate(week))
            kept = {key[2] for key in decay._SEEN if key[:2] == (url, "a100")}
            assert kept == set(TEAMS)
            for lease in session.exec(select(LeaseRow).where(LeaseRow.team != "nlp")).all():
                lease.pool = "l40s"
                session.add(lease)
            session.flush()
            leases.decayed_use(session, "a100", NOW - 6 * week, NOW, decay_rate(week))
            kept = {key[2] for key in decay._SEEN if key[:2] == (url, "a100")}
            assert kept == {"nlp"}
    finally:
        database.dispose()
