"""Work no lease covers: processes of other people on leased GPUs (intruders), and nodes that
send telemetry without being in any pool (strays). Each is told once per episode; what was
told is kept as settings (`intruder:<lease>:<node>:<index>` -> the Unix users told,
`device:unknown-node:<node>` -> the GPUs it reported), which `/gpu status` reads back.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlmodel import Session

from bot.services import notices
from bot.services.context import SYSTEM, Context, record
from rules.domain import plural
from rules.lease_facts import covers
from rules.policy import Policy
from storage import keyvalue
from storage.audit import AuditTag
from storage.tables import DeviceEventRow


class Slot(Protocol):
    """One GPU as the observer read it."""

    @property
    def id(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def index(self) -> int: ...


@dataclass(frozen=True)
class Told:
    intruders: Mapping[str, frozenset[str]]  # intruder key -> the Unix users told about
    strays: frozenset[str]  # nodes flagged as reporting without being configured


def told(session: Session) -> Told:
    return Told(keyvalue.told_intruders(session), frozenset(keyvalue.stray_nodes(session)))


@dataclass(frozen=True)
class Intrusion:
    key: str
    lease: int
    holder: str
    gpu: Slot
    strangers: list[dict[str, Any]]  # empty: told before, nothing new to say
    first: bool = False  # their work ran there before the lease was granted


def intrusions_in(
    policy: Policy,
    gpus: Sequence[Slot],
    people: Mapping[tuple[str, int], list[dict[str, Any]]],
    held: Mapping[int, tuple[int, str, datetime]],
    told: Mapping[str, frozenset[str]],
) -> dict[str, Intrusion]:
    """Processes on leased GPUs whose users the lease does not cover, by setting key.

    `people`: the processes fresh telemetry shows on each GPU (none where it is not fresh)."""
    out = {}
    for gpu in gpus:
        lease = held.get(gpu.id)
        if lease is None:
            continue
        lease_id, holder, granted_at = lease
        strangers = [
            p
            for p in people.get((gpu.node, gpu.index), [])
            if not covers(policy, holder, p["user"])
        ]
        if not strangers:
            continue
        key = keyvalue.intruder_key(lease_id, gpu.node, gpu.index)
        users = {p["user"] for p in strangers}
        new = [] if key in told and users <= told[key] else strangers
        before = [p.get("started") for p in strangers]
        first = all(t is not None and t < granted_at.timestamp() for t in before)
        out[key] = Intrusion(key, lease_id, holder, gpu, new, first)
    return out


def stray(ctx: Context, session: Session, node: str, count: int, now: datetime) -> None:
    """Flag a node that reports `count` GPUs without being in any pool: once, to the admins."""
    configured = [n for pool in ctx.policy.pools.values() for n in pool.nodes]
    close = difflib.get_close_matches(node, configured, n=1, cutoff=0.8)
    hint = f" Is it `{close[0]}` in pools.yaml, misspelt?" if close else ""
    keyvalue.flag_stray(session, node, count, at=now, by=SYSTEM)
    event = DeviceEventRow(
        at=now, node=node, gpu=None, kind="unknown-node", actor=SYSTEM, detail={"gpus": count}
    )
    session.add(event)
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.NODE_UNKNOWN,
        subject=f"node:{node}",
        outcome="flagged",
        detail={"gpus": count},
    )
    notices.tell_admins(
        session,
        ctx.policy.admins,
        f"node:{node}",
        f"{node} sends telemetry for {plural(count, 'GPU')} but is in no pool of pools.yaml: "
        f"nothing is granted on it. Add it to a pool, or fix the name it reports under.{hint}",
        at=now,
        now=ctx.now(),
    )


def intruded(ctx: Context, session: Session, intrusion: Intrusion, now: datetime) -> None:
    """Tell the holder, the process owners and the admins once; audit it."""
    key, lease_id, holder = intrusion.key, intrusion.lease, intrusion.holder
    gpu, strangers = intrusion.gpu, intrusion.strangers
    told = set(keyvalue.users_told(session, key) or ())
    users = sorted({p["user"] for p in strangers})
    what = "; ".join(
        f"pid {p['pid']} of {p['user']}" + (f" ({p['memory_mib']} MiB)" if p["memory_mib"] else "")
        for p in strangers
    )
    where = f"{gpu.node} GPU {gpu.index}"
    subject = f"lease:{lease_id}"
    record(
        session,
        at=now,
        actor=SYSTEM,
        tag=AuditTag.LEASE_INTRUDED,
        subject=subject,
        outcome="notify",
        detail={
            "gpu": f"{gpu.node}:{gpu.index}",
            "processes": strangers,
            "ran_before_the_lease": intrusion.first,
        },
    )
    if intrusion.first:  # granted before telemetry showed their work: nobody trespassed
        to_holder = (
            f"L{lease_id} was granted {where} while {what} already ran there (no telemetry had "
            f"shown it yet). Release L{lease_id} and borrow again, or agree with them."
        )
        to_owner = (
            f"{where}, where your process runs ({what}), was granted to someone else "
            f"(L{lease_id}) before the bot had seen your work. Nothing of yours is stopped; "
            "`/gpu borrow` covers your work, or ask an admin."
        )
    else:
        to_holder = (
            f"Someone else runs on {where} of your lease L{lease_id}: {what}. "
            "They have been told; an admin can help if it stays."
        )
        to_owner = (
            f"Your process on {where} runs on GPUs leased to someone else (L{lease_id}): "
            f"{what}. Please stop it and `/gpu borrow` GPUs of your own."
        )
    notices.tell(session, holder, subject, to_holder, at=now)
    for unix_user in users:
        person = ctx.policy.accounts.get(unix_user)
        if person and person != holder:
            notices.tell(session, person, subject, to_owner, at=now)
    notices.tell_admins(
        session,
        ctx.policy.admins,
        subject,
        f"L{lease_id}: {what} on {where}, not the holder's.",
        at=now,
        now=ctx.now(),
    )
    keyvalue.set_users_told(session, key, told | set(users), at=now, by=SYSTEM)


def strays(session: Session) -> dict[str, int]:
    """Nodes that sent telemetry without being in any pool: {name: GPUs reported}."""
    return keyvalue.stray_nodes(session)


def intrusions(session: Session) -> list[str]:
    """What `/gpu status` shows admins: "L8 a100-node-02:6 by dave"."""
    told = keyvalue.intrusions_told(session)
    return sorted(f"L{lease} {node}:{index} by {users}" for lease, node, index, users in told)
