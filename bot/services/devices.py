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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlmodel import Session

from bot.services import node_reporting, notices, strangers
from bot.services.context import SYSTEM, Context, record
from bot.services.device_records import new_event
from rules.domain import Observed
from rules.policy import Policy
from storage import keyvalue, nodes
from storage.audit import AuditTag
from storage.gpus import ObservedGpu, observed_gpus, set_reporting, update_gpus
from storage.leases import held_gpus
from storage.tables import DeviceEventRow

# Temperature, power and memory in use are written this often (any other change at once).
PROFILE_EVERY = timedelta(minutes=5)


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
    """What telemetry knows (bot.telemetry.window.TelemetryWindow)."""

    def gpu(self, node: str, index: int, now: datetime) -> Reading: ...
    def latest(self) -> Mapping[tuple[str, int], Seen]: ...


@dataclass
class DeviceReport:
    changed: list[str] = field(default_factory=list)  # "a100-node-02:6 occupied", ...
    events: list[str] = field(default_factory=list)  # "a100-node-09 not-reporting", ...
    intruders: list[str] = field(default_factory=list)


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
    now = ctx.now()
    with ctx.db.read() as session:
        stored = _stored(session)
    latest = fleet.latest()
    readings = {(g.node, g.index): fleet.gpu(g.node, g.index, now) for g in stored.gpus}
    report = DeviceReport()
    changes = _changes(ctx.policy, stored, readings, latest, since=since, now=now)
    for gpu in stored.gpus:
        change = changes.updates.get(gpu.id, {})
        if "observed" in change:
            report.changed.append(f"{gpu.node}:{gpu.index} {change['observed']}")
    if changes.any:
        _write(ctx, stored.gpus, changes, now, report)
    return report


@dataclass(frozen=True)
class _Stored:
    """What the database says before a pass."""

    gpus: list[ObservedGpu]
    nodes: dict[str, str]  # node -> its reporting state
    versions: dict[str, tuple[str, str]]  # node -> (driver, CUDA)
    held: dict[int, tuple[int, str, datetime]]
    told: strangers.Told


def _stored(session: Session) -> _Stored:
    rows = nodes.every_node(session)
    return _Stored(
        observed_gpus(session),
        {n.name: n.reporting for n in rows},
        {n.name: (n.driver, n.cuda) for n in rows},
        held_gpus(session),
        strangers.told(session),
    )


@dataclass
class _Changes:
    """What a pass writes, and what admins are told."""

    updates: dict[int, dict[str, Any]] = field(default_factory=dict)  # GPU id -> columns
    events: list[DeviceEventRow] = field(default_factory=list)
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # reporting before, now
    drivers: dict[str, tuple[str, str]] = field(default_factory=dict)
    strays: dict[str, int] = field(default_factory=dict)  # node -> GPUs it reported
    news: list[strangers.Intrusion] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # intrusions over: their settings go

    @property
    def any(self) -> bool:
        return bool(
            self.updates or self.nodes or self.strays or self.news or self.gone or self.drivers
        )


def _changes(
    policy: Policy,
    stored: _Stored,
    readings: Mapping[tuple[str, int], Reading],
    latest: Mapping[tuple[str, int], Seen],
    *,
    since: datetime | None,
    now: datetime,
) -> _Changes:
    out = _Changes()
    for gpu in stored.gpus:
        key = (gpu.node, gpu.index)
        change = _compare(
            policy, gpu, readings[key], latest.get(key), since=since, now=now, events=out.events
        )
        if change:
            out.updates[gpu.id] = change
    out.nodes = node_reporting.changes(
        stored.gpus, out.updates, stored.nodes, since=since, now=now, events=out.events
    )
    out.drivers = _drivers(latest, stored.versions)
    for node in sorted({node for node, _ in latest} - set(stored.nodes) - stored.told.strays):
        out.strays[node] = sum(1 for n, _ in latest if n == node)
    people = {key: occupants(reading) for key, reading in readings.items()}
    told = stored.told.intruders
    intrusions = strangers.intrusions_in(policy, stored.gpus, people, stored.held, told)
    out.gone = sorted(set(told) - set(intrusions))
    out.news = [i for i in intrusions.values() if i.strangers]
    return out


def _drivers(
    latest: Mapping[tuple[str, int], Seen], versions: Mapping[str, tuple[str, str]]
) -> dict[str, tuple[str, str]]:
    """The driver and CUDA versions of each configured node, where they changed."""
    found = {
        node: (seen.driver or "", seen.cuda or "")
        for (node, _), seen in latest.items()
        if node in versions and (seen.driver or seen.cuda)
    }
    return {n: v for n, v in found.items() if v != versions[n]}


def _write(
    ctx: Context, gpus: list[ObservedGpu], changes: _Changes, now: datetime, report: DeviceReport
) -> None:
    """GPUs with an event go first, with the events, the nodes and what admins are told; the
    rest in chunks, so the writer lock is never held for long (10,000 changed GPUs at
    start-up)."""
    updates, events = changes.updates, changes.events
    slots = {(e.node, e.gpu) for e in events}
    marked = {g.id for g in gpus if (g.node, g.index) in slots}
    order = sorted(updates, key=lambda gpu_id: gpu_id not in marked)
    head = max(_CHUNK, len(marked))
    with ctx.db.write() as session:
        update_gpus(session, {i: updates[i] for i in order[:head]})
        set_reporting(session, changes.nodes, now)
        _write_drivers(session, changes.drivers, now, events)
        for event in events:
            session.add(event)
            where = event.node if event.gpu is None else f"{event.node}:{event.gpu}"
            report.events.append(f"{where} {event.kind}")
        node_reporting.tell(ctx, session, changes.nodes, now)
        _tell_swaps(ctx, session, events, now)
        _tell_strangers(ctx, session, changes, now, report)
    for start in range(head, len(order), _CHUNK):
        with ctx.db.write() as session:
            update_gpus(session, {i: updates[i] for i in order[start : start + _CHUNK]})


def _tell_strangers(
    ctx: Context, session: Session, changes: _Changes, now: datetime, report: DeviceReport
) -> None:
    """Strays and intruders, told once; intrusions that ended are forgotten."""
    for node, count in changes.strays.items():
        strangers.stray(ctx, session, node, count, now)
        report.events.append(f"{node} unknown-node")
    for intrusion in changes.news:
        strangers.intruded(ctx, session, intrusion, now)
        report.intruders.append(f"L{intrusion.lease} {intrusion.gpu.node}:{intrusion.gpu.index}")
    for told_key in changes.gone:
        keyvalue.forget(session, told_key)


def _compare(
    policy: Policy,
    gpu: ObservedGpu,
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
            events.append(new_event(now, gpu.node, gpu.index, kind, {"was": gpu.observed}))
    people = occupants(reading) if state == Observed.OCCUPIED else []
    if people != gpu.occupants:
        change["occupants"] = people
    if seen is not None and reading.fresh:
        change |= _profile(gpu, seen, reading, now, events)
    return change


# ---- what changed ------------------------------------------------------------------------


def _profile(
    gpu: ObservedGpu, seen: Seen, reading: Reading, now: datetime, events: list[DeviceEventRow]
) -> dict[str, Any]:
    change: dict[str, Any] = {}
    if seen.uuid and seen.uuid != gpu.uuid:
        change["uuid"] = seen.uuid
        if gpu.uuid:  # the first UUID is only learnt; a different one is another card
            detail = {"was": gpu.uuid, "uuid": seen.uuid}
            events.append(new_event(now, gpu.node, gpu.index, "swapped", detail))
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


# ---- writes ------------------------------------------------------------------------------


_CHUNK = 500  # GPU rows written per transaction


def _write_drivers(
    session: Session,
    drivers: Mapping[str, tuple[str, str]],
    now: datetime,
    events: list[DeviceEventRow],
) -> None:
    """Each node's driver and CUDA versions; a driver that changed is a lifecycle event."""
    for name, (driver, cuda) in drivers.items():
        found = nodes.node(session, name)
        if found.driver and found.driver != driver:
            events.append(
                new_event(now, name, None, "driver", {"was": found.driver, "now": driver})
            )
        found.driver, found.cuda = driver, cuda
        session.add(found)


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
            actor=SYSTEM,
            tag=AuditTag.GPU_SWAPPED,
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
            now=ctx.now(),
        )
