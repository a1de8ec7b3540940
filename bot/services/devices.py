"""What the fleet really shows, written down: each GPU's observed state (empty, occupied, unknown,
not reporting), each device's profile, its lifecycle events, and intruders on leased GPUs.

`observe` runs after every poll (the poll job, every 30 s, agents' pushes included). It reads
the newest telemetry, compares it with what the database says, and writes only what changed
(events and what admins are told together, plain GPU updates in short chunks): so placement,
`/gpu status`, Home and the rules' `pool.free` all read one truth from one table (see
`storage.gpus.gpu_lines`). Admins hear once per episode: a node stops reporting, comes
back, reports without being configured, or a GPU's UUID changes (the card was swapped).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlmodel import Session, col, select

from bot.services import notices
from bot.services.context import Context, record
from rules.domain import Observed, Reporting
from rules.lease_facts import covers
from rules.policy import Policy
from storage.gpus import gpu_lines
from storage.tables import DeviceEventRow, GpuRow, LeaseGpuRow, LeaseRow, NodeRow, SettingRow

ACTOR = "gpubot"
# Temperature, power and memory in use are written this often (any other change at once).
PROFILE_EVERY = timedelta(minutes=5)
_STRAY = "device:unknown-node:"  # setting key: a node that reported without being configured
_INTRUDER = "intruder:"  # setting key: intruder:<lease>:<node>:<index> -> the users told


class Process(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def user(self) -> str | None: ...
    @property
    def used_mib(self) -> int | None: ...
    @property
    def started(self) -> float | None: ...


class Seen(Protocol):
    """The newest sample of a GPU (bot.telemetry.model.Sample)."""

    @property
    def driver(self) -> str | None: ...
    @property
    def cuda(self) -> str | None: ...
    @property
    def uuid(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def memory_total_mib(self) -> int: ...
    @property
    def temperature_c(self) -> float | None: ...
    @property
    def power_w(self) -> float | None: ...


class Reading(Protocol):
    @property
    def fresh(self) -> bool: ...
    @property
    def unknown(self) -> bool: ...
    @property
    def memory_used_mib(self) -> int | None: ...
    @property
    def processes(self) -> Sequence[Process]: ...
    @property
    def last_seen(self) -> datetime | None: ...


class Fleet(Protocol):
    """What telemetry knows (bot.telemetry.window.Telemetry)."""

    def gpu(self, node: str, index: int, now: datetime) -> Reading: ...
    def latest(self) -> Mapping[tuple[str, int], Seen]: ...


@dataclass
class DeviceReport:
    changed: list[str] = field(default_factory=list)  # "a100-node-02:6 occupied", ...
    events: list[str] = field(default_factory=list)  # "a100-node-09 not-reporting", ...
    intruders: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Gpu:
    id: int
    node: str
    index: int
    observed: str
    occupants: list[dict[str, Any]]
    uuid: str | None
    model: str
    memory_mib: int
    profiled_at: datetime | None


def observed_state(
    reading: Reading | None,
    *,
    floor_mib: int,
    since: datetime | None,
    after: timedelta,
    now: datetime,
) -> Observed:
    """One GPU's observed state at `now`. `since`: when samples began to be expected (None:
    nothing is expected, so nothing is ever silent); silent means no sample for `after`, counted
    from the last sample, or from `since` for a GPU that never sent one."""
    last = reading.last_seen if reading is not None else None
    if since is not None and now - (last or since) >= after:
        return Observed.SILENT
    if reading is None or not reading.fresh or reading.unknown:
        return Observed.UNKNOWN
    if reading.processes or (reading.memory_used_mib or 0) > floor_mib:
        return Observed.OCCUPIED
    return Observed.EMPTY


def occupants(reading: Reading | None) -> list[dict[str, Any]]:
    if reading is None or not reading.fresh:
        return []
    return [
        {"pid": p.pid, "user": p.user or "", "memory_mib": p.used_mib, "started": p.started}
        for p in sorted(reading.processes, key=lambda p: p.pid)
    ]


def observe(ctx: Context, fleet: Fleet, *, since: datetime | None) -> DeviceReport:
    """Bring the database's view of every device in line with telemetry at `ctx.now()`.

    `since`: when this process began to expect samples (None: no telemetry is configured, so
    nothing is ever "not reporting" and every GPU stays unknown)."""
    now, policy = ctx.now(), ctx.policy
    with ctx.db.read() as session:
        gpus = _gpus(session)
        rows = session.exec(select(NodeRow)).all()
        nodes = {n.name: n.reporting for n in rows}
        versions = {n.name: (n.driver, n.cuda) for n in rows}
        held = _held(session)
        told = _told(session)
    latest = fleet.latest()
    readings = {(g.node, g.index): fleet.gpu(g.node, g.index, now) for g in gpus}
    report = DeviceReport()
    updates: dict[int, dict[str, Any]] = {}
    events: list[DeviceEventRow] = []
    for gpu in gpus:
        key = (gpu.node, gpu.index)
        change = _compare(
            policy, gpu, readings[key], latest.get(key), since=since, now=now, events=events
        )
        if change:
            updates[gpu.id] = change
            if "observed" in change:
                report.changed.append(f"{gpu.node}:{gpu.index} {change['observed']}")
    node_changes = _nodes(gpus, updates, nodes, since=since, now=now, events=events)
    drivers = {
        seen_node: (seen.driver or "", seen.cuda or "")
        for (seen_node, _), seen in latest.items()
        if seen_node in versions and (seen.driver or seen.cuda)
    }
    drivers = {n: v for n, v in drivers.items() if v != versions[n]}
    strays = sorted({node for node, _ in latest} - set(nodes) - told.strays)
    intrusions = _intrusions(policy, gpus, readings, held, told.intruders)
    gone = sorted(set(told.intruders) - set(intrusions))
    news = [i for i in intrusions.values() if i.strangers]
    if not (updates or node_changes or strays or news or gone or drivers):
        return report
    # GPUs with an event go first, with the events, the nodes and what admins are told; the rest
    # in chunks, so the writer lock is never held for long (10,000 changed GPUs at start-up).
    slots = {(e.node, e.gpu) for e in events}
    marked = {g.id for g in gpus if (g.node, g.index) in slots}
    order = sorted(updates, key=lambda gpu_id: gpu_id not in marked)
    head = max(_CHUNK, len(marked))
    with ctx.db.write() as session:
        _write_gpus(session, {i: updates[i] for i in order[:head]})
        _write_nodes(session, node_changes, now)
        _write_drivers(session, drivers, now, events)
        for event in events:
            session.add(event)
            where = event.node if event.gpu is None else f"{event.node}:{event.gpu}"
            report.events.append(f"{where} {event.kind}")
        _tell_nodes(ctx, session, node_changes, now)
        _tell_swaps(ctx, session, events, now)
        for node in strays:
            _stray(ctx, session, node, latest, now)
            report.events.append(f"{node} unknown-node")
        for intrusion in news:
            _intruded(ctx, session, intrusion, now)
            report.intruders.append(
                f"L{intrusion.lease} {intrusion.gpu.node}:{intrusion.gpu.index}"
            )
        for told_key in gone:
            told_row = session.get(SettingRow, told_key)
            if told_row is not None:
                session.delete(told_row)
    for start in range(head, len(order), _CHUNK):
        with ctx.db.write() as session:
            _write_gpus(session, {i: updates[i] for i in order[start : start + _CHUNK]})
    return report


def _compare(
    policy: Policy,
    gpu: _Gpu,
    reading: Reading,
    seen: Seen | None,
    *,
    since: datetime | None,
    now: datetime,
    events: list[DeviceEventRow],
) -> dict[str, Any]:
    """The columns of one GPU that telemetry changed, and its lifecycle events."""
    fleet = policy.fleet
    state = observed_state(
        reading,
        floor_mib=fleet.memory_floor_mib,
        since=since,
        after=fleet.not_reporting_after,
        now=now,
    )
    quiet = gpu.observed == Observed.SILENT and reading.last_seen is None
    if state == Observed.UNKNOWN and quiet and since is not None:
        state = Observed.SILENT  # a restart forgets samples, not that the GPU went quiet
    change: dict[str, Any] = {}
    if state != gpu.observed:
        change |= {"observed": state.value, "observed_since": now}
        if Observed.SILENT in (state, gpu.observed):
            kind = "not-reporting" if state == Observed.SILENT else "back"
            events.append(_event(now, gpu.node, gpu.index, kind, {"was": gpu.observed}))
    people = occupants(reading) if state == Observed.OCCUPIED else []
    if people != gpu.occupants:
        change["occupants"] = people
    if seen is not None and reading.fresh:
        change |= _profile(gpu, seen, reading, now, events)
    return change


# ---- reads -------------------------------------------------------------------------------


def _gpus(session: Session) -> list[_Gpu]:
    """Plain columns, no ORM objects: this runs after every poll, over every GPU."""
    rows = session.connection().execute(
        sa.select(
            col(GpuRow.id),
            col(NodeRow.name),
            col(GpuRow.index),
            col(GpuRow.observed),
            col(GpuRow.occupants),
            col(GpuRow.uuid),
            col(GpuRow.model),
            col(GpuRow.memory_mib),
            col(GpuRow.profiled_at),
        )
        .join(NodeRow, col(GpuRow.node_id) == col(NodeRow.id))
        .order_by(col(NodeRow.name), col(GpuRow.index))
    )
    return [
        _Gpu(gpu_id, node, index, observed, list(occupants or []), uuid, model, memory, at)
        for gpu_id, node, index, observed, occupants, uuid, model, memory, at in rows
    ]


def _held(session: Session) -> dict[int, tuple[int, str, datetime]]:
    """{gpu id: (lease id, holder, granted at)} over active leases."""
    rows = session.exec(
        select(LeaseGpuRow.gpu_id, LeaseRow.id, LeaseRow.holder, LeaseRow.granted_at)
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
        .where(col(LeaseGpuRow.active).is_(True))
    ).all()
    return {gpu_id: (int(lease_id or 0), holder, at) for gpu_id, lease_id, holder, at in rows}


@dataclass(frozen=True)
class _Told:
    intruders: Mapping[str, frozenset[str]]  # intruder key -> the Unix users told about
    strays: frozenset[str]  # nodes flagged as reporting without being configured


def _told(session: Session) -> _Told:
    rows = session.exec(
        select(SettingRow.key, SettingRow.value).where(
            col(SettingRow.key).startswith(_INTRUDER) | col(SettingRow.key).startswith(_STRAY)
        )
    ).all()
    return _Told(
        {key: frozenset(value.split(",")) for key, value in rows if key.startswith(_INTRUDER)},
        frozenset(key.removeprefix(_STRAY) for key, _ in rows if key.startswith(_STRAY)),
    )


# ---- what changed ------------------------------------------------------------------------


def _profile(
    gpu: _Gpu, seen: Seen, reading: Reading, now: datetime, events: list[DeviceEventRow]
) -> dict[str, Any]:
    change: dict[str, Any] = {}
    if seen.uuid and seen.uuid != gpu.uuid:
        change["uuid"] = seen.uuid
        if gpu.uuid:  # the first UUID is only learnt; a different one is another card
            detail = {"was": gpu.uuid, "uuid": seen.uuid}
            events.append(_event(now, gpu.node, gpu.index, "swapped", detail))
    if seen.model and seen.model != gpu.model:
        change["model"] = seen.model
    if seen.memory_total_mib and seen.memory_total_mib != gpu.memory_mib:
        change["memory_mib"] = seen.memory_total_mib
    if change or gpu.profiled_at is None or now - gpu.profiled_at >= PROFILE_EVERY:
        change |= {
            "memory_used_mib": reading.memory_used_mib,
            "temperature_c": seen.temperature_c,
            "power_w": seen.power_w,
            "profiled_at": now,
        }
    return change


def _nodes(
    gpus: list[_Gpu],
    updates: Mapping[int, Mapping[str, Any]],
    nodes: Mapping[str, str],
    *,
    since: datetime | None,
    now: datetime,
    events: list[DeviceEventRow],
) -> dict[str, tuple[str, str]]:
    """{node: (reporting state before, now)} for the nodes whose state changed: silent when
    every GPU of it is, reporting when any of them sends."""
    states: dict[str, list[str]] = {}
    for gpu in gpus:
        states.setdefault(gpu.node, []).append(
            updates.get(gpu.id, {}).get("observed", gpu.observed)
        )
    out = {}
    for node, observed in states.items():
        if since is None:
            now_state = Reporting.UNKNOWN
        elif all(s == Observed.SILENT for s in observed):
            now_state = Reporting.SILENT
        elif any(s in (Observed.EMPTY, Observed.OCCUPIED) for s in observed):
            now_state = Reporting.REPORTING
        else:
            continue  # still waiting for its first samples
        before = nodes.get(node, Reporting.UNKNOWN)
        if now_state != before:
            out[node] = (before, now_state.value)
            if now_state == Reporting.SILENT:
                events.append(_event(now, node, None, "not-reporting", {"was": before}))
            elif before == Reporting.SILENT and now_state == Reporting.REPORTING:
                events.append(_event(now, node, None, "back", {}))
    # A whole node that went quiet (or came back) is one event, not one per GPU.
    whole = {node for node, (_, state) in out.items()}
    events[:] = [
        e for e in events if not (e.gpu is not None and e.node in whole and e.kind in _EPISODE)
    ]
    return out


_EPISODE = ("not-reporting", "back")


@dataclass(frozen=True)
class _Intrusion:
    key: str
    lease: int
    holder: str
    gpu: _Gpu
    strangers: list[dict[str, Any]]  # empty: told before, nothing new to say
    first: bool = False  # their work ran there before the lease was granted


def _intrusions(
    policy: Policy,
    gpus: list[_Gpu],
    readings: Mapping[tuple[str, int], Reading],
    held: Mapping[int, tuple[int, str, datetime]],
    told: Mapping[str, frozenset[str]],
) -> dict[str, _Intrusion]:
    """Processes on leased GPUs whose users the lease does not cover, by setting key."""
    out = {}
    for gpu in gpus:
        lease = held.get(gpu.id)
        reading = readings.get((gpu.node, gpu.index))
        if lease is None or reading is None or not reading.fresh:
            continue
        lease_id, holder, granted_at = lease
        strangers = [p for p in occupants(reading) if not covers(policy, holder, p["user"])]
        if not strangers:
            continue
        key = f"{_INTRUDER}{lease_id}:{gpu.node}:{gpu.index}"
        users = {p["user"] for p in strangers}
        new = [] if key in told and users <= told[key] else strangers
        before = [p.get("started") for p in strangers]
        first = all(t is not None and t < granted_at.timestamp() for t in before)
        out[key] = _Intrusion(key, lease_id, holder, gpu, new, first)
    return out


# ---- writes ------------------------------------------------------------------------------


def _event(
    now: datetime, node: str, gpu: int | None, kind: str, detail: dict[str, Any]
) -> DeviceEventRow:
    return DeviceEventRow(at=now, node=node, gpu=gpu, kind=kind, actor=ACTOR, detail=detail)


def event(
    session: Session,
    now: datetime,
    node: str,
    gpu: int | None,
    kind: str,
    *,
    actor: str,
    **detail: Any,
) -> None:
    """Append one lifecycle event in the caller's transaction (drains, faults, inventory)."""
    session.add(DeviceEventRow(at=now, node=node, gpu=gpu, kind=kind, actor=actor, detail=detail))


_CHUNK = 500  # GPU rows written per transaction


def _write_gpus(session: Session, updates: Mapping[int, Mapping[str, Any]]) -> None:
    """One UPDATE ... executemany per set of changed columns: plain statements, no ORM rows."""
    db = session.connection()
    table = GpuRow.__table__  # type: ignore[attr-defined]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for gpu_id, change in updates.items():
        uuid = change.get("uuid")
        if uuid:  # a card moved here from another slot: it is no longer there
            db.execute(
                sa.update(table).where(table.c.uuid == uuid, table.c.id != gpu_id).values(uuid=None)
            )
        keys = tuple(sorted(change))
        groups.setdefault(keys, []).append(
            {"gpu_id": gpu_id, **{f"new_{k}": v for k, v in change.items()}}
        )
    for keys, params in groups.items():
        values = {k: sa.bindparam(f"new_{k}", type_=table.c[k].type) for k in keys}
        stmt = sa.update(table).where(table.c.id == sa.bindparam("gpu_id")).values(values)
        db.execute(stmt, params)


def _write_drivers(
    session: Session,
    drivers: Mapping[str, tuple[str, str]],
    now: datetime,
    events: list[DeviceEventRow],
) -> None:
    """Each node's driver and CUDA versions; a driver that changed is a lifecycle event."""
    for name, (driver, cuda) in drivers.items():
        found = session.exec(select(NodeRow).where(NodeRow.name == name)).one()
        if found.driver and found.driver != driver:
            events.append(_event(now, name, None, "driver", {"was": found.driver, "now": driver}))
        found.driver, found.cuda = driver, cuda
        session.add(found)


def _write_nodes(session: Session, changes: Mapping[str, tuple[str, str]], now: datetime) -> None:
    for name, (_, state) in changes.items():
        node = session.exec(select(NodeRow).where(NodeRow.name == name)).first()
        if node is not None:
            node.reporting, node.reporting_since = state, now
            session.add(node)


def _tell_nodes(
    ctx: Context, session: Session, changes: Mapping[str, tuple[str, str]], now: datetime
) -> None:
    """Admins hear once when a node goes quiet, and once when it is back."""
    after = ctx.policy.fleet.not_reporting_after
    for node, (before, state) in sorted(changes.items()):
        if state == Reporting.SILENT:
            tag = "node:not-reporting"
            text = (
                f"{node} has sent no telemetry for {_words(after)}: its GPUs are out of service "
                "until it reports again. Check its agent (or NVML), and its name in pools.yaml."
            )
        elif before == Reporting.SILENT and state == Reporting.REPORTING:
            tag, text = "node:back", f"{node} reports again: its GPUs are back in service."
        else:
            continue
        record(session, at=now, actor=ACTOR, tag=tag, subject=f"node:{node}", outcome=state)
        notices.tell_admins(session, ctx.policy.admins, f"node:{node}", text, at=now)


def _tell_swaps(
    ctx: Context, session: Session, events: Sequence[DeviceEventRow], now: datetime
) -> None:
    for ev in events:
        if ev.kind != "swapped":
            continue
        subject = f"gpu:{ev.node}:{ev.gpu}"
        record(
            session,
            at=now,
            actor=ACTOR,
            tag="gpu:swapped",
            subject=subject,
            outcome="swapped",
            detail=ev.detail,
        )
        notices.tell_admins(
            session,
            ctx.policy.admins,
            subject,
            f"{ev.node} GPU {ev.gpu} has a new UUID ({ev.detail['uuid']}, was {ev.detail['was']}): "
            "the card was swapped or the slots renumbered. Check it before trusting its history.",
            at=now,
        )


def _stray(
    ctx: Context, session: Session, node: str, latest: Mapping[tuple[str, int], Seen], now: datetime
) -> None:
    count = sum(1 for n, _ in latest if n == node)
    configured = [n for pool in ctx.policy.pools.values() for n in pool.nodes]
    close = difflib.get_close_matches(node, configured, n=1, cutoff=0.8)
    hint = f" Is it `{close[0]}` in pools.yaml, misspelt?" if close else ""
    session.add(
        SettingRow(key=f"{_STRAY}{node}", value=str(count), updated_at=now, updated_by=ACTOR)
    )
    session.add(_event(now, node, None, "unknown-node", {"gpus": count}))
    record(
        session,
        at=now,
        actor=ACTOR,
        tag="node:unknown",
        subject=f"node:{node}",
        outcome="flagged",
        detail={"gpus": count},
    )
    notices.tell_admins(
        session,
        ctx.policy.admins,
        f"node:{node}",
        f"{node} sends telemetry for {count} GPUs but is in no pool of pools.yaml: nothing is "
        f"granted on it. Add it to a pool, or fix the name it reports under.{hint}",
        at=now,
    )


def _intruded(ctx: Context, session: Session, intrusion: _Intrusion, now: datetime) -> None:
    """Tell the holder, the process owners and the admins once; audit it."""
    key, lease_id, holder = intrusion.key, intrusion.lease, intrusion.holder
    gpu, strangers = intrusion.gpu, intrusion.strangers
    row = session.get(SettingRow, key)
    told = set(row.value.split(",")) if row and row.value else set()
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
        actor=ACTOR,
        tag="lease:intruded",
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
    )
    value = ",".join(sorted(told | set(users)))
    if row is None:
        row = SettingRow(key=key, value=value, updated_at=now, updated_by=ACTOR)
    row.value, row.updated_at = value, now
    session.add(row)


def strays(session: Session) -> dict[str, int]:
    """Nodes that sent telemetry without being in any pool: {name: GPUs reported}."""
    rows = session.exec(
        select(SettingRow.key, SettingRow.value).where(col(SettingRow.key).startswith(_STRAY))
    ).all()
    return {key.removeprefix(_STRAY): int(value or 0) for key, value in rows}


def intrusions(session: Session) -> list[str]:
    """What `/gpu status` shows admins: "L8 a100-node-02:6 by dave"."""
    rows = session.exec(
        select(SettingRow.key, SettingRow.value).where(col(SettingRow.key).startswith(_INTRUDER))
    ).all()
    out = []
    for key, value in rows:
        lease, node, index = key.removeprefix(_INTRUDER).split(":")
        out.append(f"L{lease} {node}:{index} by {value}")
    return sorted(out)


def _words(after: timedelta) -> str:
    seconds = int(after.total_seconds())
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


# ---- what admins read: `gpubot nodes`, `/gpu nodes` -------------------------------------


@dataclass(frozen=True)
class GpuProfile:
    node: str
    index: int
    pool: str
    model: str
    uuid: str
    memory_mib: int
    place: str  # storage.gpus.Place: free, leased, occupied, silent, out
    observed: str
    since: datetime | None
    lease: str  # "L8" or ""
    team: str  # the holding team, if leased
    occupants: tuple[str, ...]
    memory_used_mib: int | None
    temperature_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class NodeProfile:
    name: str
    pool: str
    drained: bool
    reporting: str
    since: datetime | None
    driver: str
    cuda: str
    gpus: tuple[GpuProfile, ...]


@dataclass(frozen=True)
class DeviceEvent:
    at: datetime
    node: str
    gpu: int | None
    kind: str
    actor: str
    detail: Mapping[str, Any]

    @property
    def device(self) -> str:
        return self.node if self.gpu is None else f"{self.node}:{self.gpu}"


def profiles(session: Session, name: str | None = None) -> list[NodeProfile]:
    """Every node (or one) with its GPUs' profile and where each stands."""
    lines = {(g.node, g.index): g for g in gpu_lines(session)}
    teams = dict(
        session.exec(select(LeaseRow.id, LeaseRow.team).where(LeaseRow.state == "active")).all()
    )
    stmt = select(NodeRow).order_by(col(NodeRow.name))
    if name is not None:
        stmt = stmt.where(NodeRow.name == name)
    out = []
    for node in session.exec(stmt).all():
        rows = session.exec(
            select(GpuRow).where(GpuRow.node_id == node.id).order_by(col(GpuRow.index))
        ).all()
        gpus = []
        for gpu in rows:
            line = lines.get((node.name, gpu.index))
            lease_id = line.lease_id if line else None
            gpus.append(
                GpuProfile(
                    node.name,
                    gpu.index,
                    gpu.pool,
                    gpu.model,
                    gpu.uuid or "",
                    gpu.memory_mib,
                    str(line.place) if line else "out",
                    gpu.observed,
                    gpu.observed_since,
                    f"L{lease_id}" if lease_id else "",
                    str(teams.get(lease_id, "")) if lease_id else "",
                    tuple(sorted({str(p.get("user") or "?") for p in gpu.occupants or []})),
                    gpu.memory_used_mib,
                    gpu.temperature_c,
                    gpu.power_w,
                )
            )
        out.append(
            NodeProfile(
                node.name,
                node.pool,
                node.drained,
                node.reporting,
                node.reporting_since,
                node.driver,
                node.cuda,
                tuple(gpus),
            )
        )
    return out


def history(
    session: Session,
    name: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> list[DeviceEvent]:
    """Lifecycle events, oldest first (the newest `limit` when given)."""
    stmt = select(DeviceEventRow).order_by(col(DeviceEventRow.id).desc())
    if name is not None:
        stmt = stmt.where(DeviceEventRow.node == name)
    if since is not None:
        stmt = stmt.where(DeviceEventRow.at >= since)
    if limit is not None:
        stmt = stmt.limit(limit)
    rows = session.exec(stmt).all()
    return [
        DeviceEvent(r.at, r.node, r.gpu, r.kind, r.actor, dict(r.detail)) for r in reversed(rows)
    ]


@dataclass(frozen=True)
class Interval:
    """One stretch of a device's life, for review and cost attribution: a lifecycle state from
    an event until the next one on the same device, or a lease holding the GPU (`team` set)."""

    node: str
    gpu: int | None
    pool: str
    state: str  # joined, not-reporting, back, drained, fault, ... or leased
    team: str
    lease: str
    start: datetime
    end: datetime | None  # None: still so
    by: str
    detail: Mapping[str, Any]


def intervals(session: Session, since: datetime | None = None) -> list[Interval]:
    """Every device's lifecycle and lease intervals that reach past `since`, by device."""
    pools = dict(session.exec(select(NodeRow.name, NodeRow.pool)).all())
    out: list[Interval] = []
    following: dict[tuple[str, int | None], datetime] = {}  # the next event's time, per device
    for ev in reversed(history(session)):
        end = following.get((ev.node, ev.gpu))
        following[(ev.node, ev.gpu)] = ev.at
        pool = pools.get(ev.node, "")
        out.append(
            Interval(ev.node, ev.gpu, pool, ev.kind, "", "", ev.at, end, ev.actor, ev.detail)
        )
    held = session.exec(
        select(NodeRow.name, GpuRow.index, GpuRow.pool, LeaseRow)
        .join(GpuRow, col(GpuRow.node_id) == col(NodeRow.id))
        .join(LeaseGpuRow, col(LeaseGpuRow.gpu_id) == col(GpuRow.id))
        .join(LeaseRow, col(LeaseRow.id) == col(LeaseGpuRow.lease_id))
    ).all()
    for node, index, pool, lease in held:
        detail = {"holder": lease.holder}
        if lease.state != "active":
            detail["ended"] = lease.end_reason or lease.state
        out.append(
            Interval(
                node,
                index,
                pool,
                "leased",
                lease.team,
                f"L{lease.id}",
                lease.granted_at,
                lease.ended_at,
                lease.holder,
                detail,
            )
        )
    if since is not None:
        out = [i for i in out if i.end is None or i.end >= since]
    return sorted(out, key=lambda i: (i.node, -1 if i.gpu is None else i.gpu, i.start))
