"""Home tabs owed by a transaction: what it touched (the subjects of its audit rows), and one
Home row per person, however many changes that person's Home shows.

A Home is owed a little later and folds into one already waiting, since it is drawn when it
is published; a person looking at theirs (a click on it, a form sent) gets theirs at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from storage import outbox
from storage.outbox import OutboxKind, Owed
from storage.tables import OutboxRow

_TOUCHED = "gpubot_touched"  # session.info: subjects audited in this transaction
_OWED = "gpubot_homes"  # session.info: the people a Home row is owed to in this transaction
_HURRIED = "gpubot_hurried"  # session.info: the person whose request this transaction runs


def touch(session: Session, subject: str) -> None:
    """Note that this transaction changed `subject` ("lease:7", "request:3", "node:n1", ...)."""
    session.info.setdefault(_TOUCHED, set()).add(subject)


def touched(session: Session) -> set[str]:
    """The subjects noted since the last call (each is handed out once)."""
    found: set[str] = session.info.pop(_TOUCHED, set())
    return found


def hurry(session: Session, user: str) -> None:
    """`user` is waiting on this transaction: their Home, if it changes, is sent at once."""
    session.info[_HURRIED] = user


def owe_home(
    session: Session,
    user: str,
    *,
    at: datetime,
    subject: str = "home",
    later: timedelta | None = None,
) -> bool:
    """Owe `user` a freshly drawn Home tab, once per transaction; False when owed already.
    With `later` (unless `user` is hurried): not before then, and not at all while one for
    them is still waiting to be sent."""
    owed: set[str] = session.info.setdefault(_OWED, set())
    if user in owed:
        return False
    owed.add(user)
    if later is not None and session.info.get(_HURRIED) != user:
        if _waiting(session, user):
            return False
        outbox.owe(session, Owed(OutboxKind.HOME, subject, user, {}), at=at, after=later)
        return True
    outbox.owe(session, Owed(OutboxKind.HOME, subject, user, {}), at=at)
    return True


def _waiting(session: Session, user: str) -> bool:
    stmt = select(OutboxRow.id).where(
        col(OutboxRow.state) == outbox.PENDING,
        OutboxRow.kind == OutboxKind.HOME,
        OutboxRow.recipient == user,
    )
    return session.exec(stmt.limit(1)).first() is not None
