"""Fair share's decayed usage on SQLite (`storage.leases.decayed_use`): the pool's leases of the
window read as one list of numbers and times per team, each list parsed once while it stays
the same, and every lease's term computed here exactly as `rules.fairshare.decayed_usage`
computes it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from itertools import repeat
from operator import add, mul, sub, truediv
from threading import Lock
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from rules.domain import LeaseState
from storage.tables import LeaseRow

_MICROS_AN_HOUR = 3_600_000_000
_EPOCH = datetime(1970, 1, 1)  # noqa: DTZ001 -- SQLite's text has no offset: it is UTC
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


_Lease = tuple[int, int, int, int | None]  # grant and end in microseconds, id, GPUs


@dataclass(frozen=True)
class _Held:
    """One team's leases of the window in the order `decayed_usage` adds them (grant, then
    id), parsed from `text`: what the database gave for them."""

    text: tuple[Any, ...]
    parts: dict[tuple[str, ...], list[_Lease]]  # each part of `text`, parsed
    first: tuple[int, int]  # the first lease's grant (microseconds) and id: the teams' order
    gpus: list[int]
    granted: list[int]  # microseconds since the epoch
    ended: list[int | None]  # None: still held
    latest: int  # the latest grant or end
    starts: list[int]  # when each interval starts, clipped at any instant from `latest` on


# The last lists seen per database, pool and team. Each is a pure function of its text, which
# every read compares in full, so a list is reused only where the database gave that very
# text: nothing here can be stale.
_SEEN: dict[tuple[str, str, str], _Held] = {}
_SEEN_MOST = 512
_LOCK = Lock()


def decayed_use_sqlite(
    session: Session, pool: str, since: datetime, now: datetime, rate_per_hour: float
) -> dict[str, float]:
    """Each team's decayed GPU-hours in `pool` from its leases held since `since` (see
    `storage.leases.decayed_use`). SQLite sends each team's leases as comma-separated lists
    (ids, GPUs, grants, ends), cheaper by far than a row a lease; a team's lists are parsed
    again only when their text changed since the last read."""
    if session.new or session.dirty or session.deleted:
        session.flush()
    rows = session.connection().execute(_WINDOW, {"pool": pool, "since": since}).all()
    texts: dict[str, list[tuple[str, ...]]] = {}
    for team, *lists in rows:
        texts.setdefault(team, []).append(tuple(lists))
    url = str(session.get_bind().engine.url)
    _forget_others(url, pool, texts)
    held = [_held((url, pool, team), tuple(sorted(parts))) for team, parts in texts.items()]
    at = (now - _UTC_EPOCH) // _MICROSECOND
    usage: dict[str, float] = {}
    for team, team_held in sorted(zip(texts, held, strict=True), key=lambda th: th[1].first):
        usage[team] = _summed(team_held, at, rate_per_hour)
    return usage


def _lists(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """Per team, its leases' ids, GPUs, grants and ends ('' while held), each list in one
    order (that of the rows the aggregate is given)."""

    def joined(value: Any) -> Any:
        return sa.func.group_concat(value, type_=sa.Text)

    return (
        sa.select(
            col(LeaseRow.team),
            joined(col(LeaseRow.id)),
            joined(col(LeaseRow.gpus)),
            joined(col(LeaseRow.granted_at)),
            joined(sa.func.ifnull(col(LeaseRow.ended_at), "")),
        )
        .where(*where)
        .group_by(col(LeaseRow.team))
    )


# The same leases as `storage.leases.held_since`, from two seeks of ix_lease_pool_state_ended
# (built once: a read per borrow).
_HERE = col(LeaseRow.pool) == sa.bindparam("pool")
_WINDOW = sa.union_all(
    _lists(_HERE, col(LeaseRow.state) == LeaseState.ACTIVE),
    _lists(
        _HERE,
        col(LeaseRow.state).in_([s.value for s in LeaseState if s != LeaseState.ACTIVE]),
        col(LeaseRow.ended_at) >= sa.bindparam("since"),
    ),
)


def _forget_others(url: str, pool: str, teams: dict[str, Any]) -> None:
    """Drop the lists kept for the pool's teams that no longer have a lease in the window."""
    with _LOCK:
        gone = [key for key in _SEEN if key[:2] == (url, pool) and key[2] not in teams]
        for key in gone:
            del _SEEN[key]


def _held(key: tuple[str, str, str], text: tuple[Any, ...]) -> _Held:
    seen = _SEEN.get(key)
    if seen is not None and seen.text == text:
        return seen
    # a part (the team's held leases, those that ended) is parsed again only if it changed
    before = seen.parts if seen is not None else {}
    parts = {part: before[part] if part in before else _parsed(part) for part in text}
    leases = sorted(lease for part in parts.values() for lease in part)  # two sorted runs
    held = _Held(
        text=text,
        parts=parts,
        first=(leases[0][0], leases[0][1]),
        gpus=[gpus for _, _, gpus, _ in leases],
        granted=[granted for granted, _, _, _ in leases],
        ended=[ended for _, _, _, ended in leases],
        latest=max(max(g, e or g) for g, _, _, e in leases),
        starts=[g if e is None else min(g, e) for g, _, _, e in leases],
    )
    with _LOCK:
        if len(_SEEN) >= _SEEN_MOST:
            _SEEN.clear()
        _SEEN[key] = held
    return held


def _parsed(part: tuple[str, ...]) -> list[_Lease]:
    """One part's leases (grant, id, GPUs, end), sorted."""
    ids, gpus, grants, ends = part
    return sorted(
        zip(
            map(_micros, grants.split(",")),
            map(int, ids.split(",")),
            map(int, gpus.split(",")),
            (_micros(end) if end else None for end in ends.split(",")),
            strict=True,
        )
    )


def _micros(text: str) -> int:
    """A stored timestamp (`YYYY-MM-DD HH:MM:SS.ffffff`, UTC) in whole microseconds since the
    epoch: exact."""
    return (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND


def _summed(held: _Held, at: int, rate: float) -> float:
    """`decayed_usage`'s sum for one team, term by term the same floats in the same order:
    ages in whole microseconds divided as two timedeltas divide (int by int), each interval
    clipped at `at`, its GPUs times the integral of exp(-rate * hours ago), added from 0.0."""
    ends = [at if end is None or end > at else end for end in held.ended]
    if at >= held.latest:  # every end is its own or `at`, after every grant
        starts = held.starts
    else:
        starts = [min(start, end) for start, end in zip(held.granted, ends, strict=True)]
    fall = -rate
    newer = map(truediv, map(sub, repeat(at), ends), repeat(_MICROS_AN_HOUR))
    older = map(truediv, map(sub, repeat(at), starts), repeat(_MICROS_AN_HOUR))
    recent = map(math.exp, map(mul, repeat(fall), newer))
    early = map(math.exp, map(mul, repeat(fall), older))
    hours = map(truediv, map(sub, recent, early), repeat(rate))
    return float(reduce(add, map(mul, held.gpus, hours), 0.0))
