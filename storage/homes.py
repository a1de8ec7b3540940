"""Home tabs owed by a transaction: what it touched (the subjects of its audit rows), and one
Home row per person, however many changes that person's Home shows."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from storage import outbox
from storage.outbox import OutboxKind, Owed

_TOUCHED = "gpubot_touched"  # session.info: subjects audited in this transaction
_OWED = "gpubot_homes"  # session.info: the people a Home row is owed to in this transaction


def touch(session: Session, subject: str) -> None:
    """Note that this transaction changed `subject` ("lease:7", "request:3", "node:n1", ...)."""
    session.info.setdefault(_TOUCHED, set()).add(subject)


def touched(session: Session) -> set[str]:
    """The subjects noted since the last call (each is handed out once)."""
    found: set[str] = session.info.pop(_TOUCHED, set())
    return found


def owe_home(session: Session, user: str, *, at: datetime, subject: str = "home") -> bool:
    """Owe `user` a freshly drawn Home tab, once per transaction; False when owed already."""
    owed: set[str] = session.info.setdefault(_OWED, set())
    if user in owed:
        return False
    owed.add(user)
    outbox.owe(session, Owed(OutboxKind.HOME, subject, user, {}), at=at)
    return True
