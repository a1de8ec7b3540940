"""Home tabs drawn again after every change they show: at the end of each write transaction,
the people whose Home shows a subject it audited are owed one Home row each (the deliverer
draws it when it publishes, so it shows the database as it stands then). A Home waits up to
HOME_EVERY, folding every change in between into one publish, unless its person is looking at
it (storage.homes.hurry).

lease     its holder, its team's managers, the admins (the fleet and the queue)
request   its requester, the people asked to decide, its team's managers, the admins
node, gpu, automation, inventory   the admins (the fleet summary and the pause switch)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlmodel import Session

from bot.services.context import Context
from rules.domain import RequestState
from rules.policy import Policy
from storage import homes, leases, requests
from storage.tables import RequestRow

_FLEET = ("node", "gpu", "automation", "inventory")
#: How long a Home redrawn for someone else's change may wait, folding later changes in.
HOME_EVERY = timedelta(seconds=5)


def owe_homes(session: Session, ctx: Context) -> None:
    """Owe a Home row to each person whose Home shows what this transaction touched."""
    subjects = homes.touched(session)
    if not subjects:
        return
    policy = ctx.policy
    people: set[str] = set()
    for subject in subjects:
        people |= _shown_to(session, policy, subject)
    at = ctx.now()
    for user in sorted(people):
        homes.owe_home(session, user, at=at, later=HOME_EVERY)


def _shown_to(session: Session, policy: Policy, subject: str) -> set[str]:
    kind, _, key = subject.partition(":")
    if kind in _FLEET:
        return set(policy.admins)
    if not key.isdecimal():
        return set()
    if kind == "lease":
        lease = leases.get(session, int(key))
        return set() if lease is None else _with(policy, lease.team, [lease.holder])
    if kind == "request":
        request = requests.get(session, int(key))
        if request is None or _never_open(request):
            return set()
        return _with(policy, request.team, [request.requester, *request.approvers])
    return set()


def _never_open(request: RequestRow) -> bool:
    """Denied by the rules as it was made: no Home ever listed it."""
    return request.state == RequestState.DENIED and request.decided_at in (
        None,
        request.created_at,
    )


def _with(policy: Policy, team: str, people: Iterable[str]) -> set[str]:
    """`people`, the team's managers and the admins."""
    managers = policy.teams[team].managers if team in policy.teams else frozenset()
    return {p for p in people if p} | set(managers) | set(policy.admins)
