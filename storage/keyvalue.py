"""The key-value rows (table `setting`) the bot keeps between passes: a named read and write
per use.

The keys, as stored:
    automation.paused                      "true" / "false": the kill switch set from Slack
    device:unknown-node:<node>             GPUs a node reported without being in any pool
    intruder:<lease>:<node>:<index>        the Unix users told they run on another's lease
    unreserved:<node>:<index>              the Unix users told they run on a GPU without a lease
    health:probe                           when /healthz last proved the database takes writes
    rollup:hourly                          the first hour the hourly rollup has not rolled yet
    digest:<lab|personal>                  the period a scheduled digest was last owed for
    simulation:<revision>                  the summary (JSON) of the last `gpubot rules simulate`
                                           of a candidate revision

Callers own the session (and so the transaction).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from storage.tables import SettingRow

PAUSED = "automation.paused"
_STRAY = "device:unknown-node:"
_INTRUDER = "intruder:"
_UNRESERVED = "unreserved:"
HEALTH_PROBE = "health:probe"
ROLLED_UNTIL = "rollup:hourly"
_DIGEST = "digest:"
_SIMULATION = "simulation:"


def paused(session: Session) -> bool:
    """Whether an admin paused automation from Slack."""
    row = session.get(SettingRow, PAUSED)
    return row is not None and row.value == "true"


def paused_since(session: Session) -> datetime | None:
    """When an admin last paused automation from Slack; None when it is not paused there."""
    row = session.get(SettingRow, PAUSED)
    return row.updated_at if row is not None and row.value == "true" else None


def set_paused(session: Session, paused: bool, *, at: datetime, by: str) -> str:
    """Set the kill switch; returns the value stored ("true" or "false")."""
    row = session.get(SettingRow, PAUSED) or SettingRow(
        key=PAUSED, value="false", updated_at=at, updated_by=by
    )
    row.value, row.updated_at, row.updated_by = ("true" if paused else "false"), at, by
    session.add(row)
    return row.value


def stray_nodes(session: Session) -> dict[str, int]:
    """Nodes that sent telemetry without being in any pool: {name: GPUs reported}."""
    return {key.removeprefix(_STRAY): int(value or 0) for key, value in _under(session, _STRAY)}


def flag_stray(session: Session, node: str, count: int, *, at: datetime, by: str) -> None:
    """Note that `node` reported `count` GPUs without being configured."""
    session.add(SettingRow(key=f"{_STRAY}{node}", value=str(count), updated_at=at, updated_by=by))


def intruder_key(lease: int, node: str, index: int) -> str:
    return f"{_INTRUDER}{lease}:{node}:{index}"


def told_intruders(session: Session) -> dict[str, frozenset[str]]:
    """Every intrusion told, by intruder key, with the Unix users told about."""
    return {key: frozenset(value.split(",")) for key, value in _under(session, _INTRUDER)}


def intrusions_told(session: Session) -> list[tuple[str, str, str, str]]:
    """Every intrusion told, as stored: (lease, node, index, the users told)."""
    out = []
    for key, value in _under(session, _INTRUDER):
        lease, node, index = key.removeprefix(_INTRUDER).split(":")
        out.append((lease, node, index, value))
    return out


def unreserved_key(node: str, index: int) -> str:
    return f"{_UNRESERVED}{node}:{index}"


def told_unreserved(session: Session) -> dict[str, frozenset[str]]:
    """The GPUs whose unreserved use was told, by unreserved key, each with the users told."""
    return {key: frozenset(value.split(",")) for key, value in _under(session, _UNRESERVED)}


def users_told(session: Session, key: str) -> frozenset[str] | None:
    """The Unix users told under one intruder or unreserved key; None: never told."""
    row = session.get(SettingRow, key)
    if row is None:
        return None
    return frozenset(row.value.split(",")) if row.value else frozenset()


def set_users_told(
    session: Session, key: str, users: Iterable[str], *, at: datetime, by: str, empty: str = ""
) -> None:
    """Store the users told under `key` (sorted; `empty` when there are none). `by` is kept
    from the first write."""
    value = ",".join(sorted(users)) or empty
    row = session.get(SettingRow, key)
    if row is None:
        row = SettingRow(key=key, value=value, updated_at=at, updated_by=by)
    row.value, row.updated_at = value, at
    session.add(row)


def probe(session: Session, *, at: datetime, by: str) -> None:
    """Write the health probe's row: proves the database takes writes now."""
    row = session.get(SettingRow, HEALTH_PROBE) or SettingRow(
        key=HEALTH_PROBE, value="", updated_by=by
    )
    row.value, row.updated_at = at.isoformat(), at
    session.add(row)


def rolled_until(session: Session) -> datetime | None:
    """The first hour the hourly rollup has not rolled yet; None: it never ran."""
    row = session.get(SettingRow, ROLLED_UNTIL)
    return datetime.fromisoformat(row.value) if row is not None else None


def set_rolled_until(session: Session, hour: datetime, *, at: datetime, by: str) -> None:
    """Note that every hour before `hour` is rolled."""
    row = session.get(SettingRow, ROLLED_UNTIL) or SettingRow(
        key=ROLLED_UNTIL, value="", updated_by=by
    )
    row.value, row.updated_at, row.updated_by = hour.isoformat(), at, by
    session.add(row)


def digest_sent(session: Session, name: str) -> str | None:
    """The period the digest `name` was last owed for (None: never)."""
    row = session.get(SettingRow, f"{_DIGEST}{name}")
    return row.value if row is not None else None


def mark_digest_sent(session: Session, name: str, period: str, *, at: datetime, by: str) -> None:
    """Note that the digest `name` was owed for `period`. An upsert: two processes owing the
    same period at once both succeed (the outbox's key keeps the messages single)."""
    values = {"key": f"{_DIGEST}{name}", "value": period, "updated_at": at, "updated_by": by}
    table = SettingRow.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["key"], set_={"value": period, "updated_at": at, "updated_by": by}
    )
    session.execute(stmt)


def forget(session: Session, key: str) -> None:
    """Drop what was told under `key` (the episode is over); nothing when none was."""
    row = session.get(SettingRow, key)
    if row is not None:
        session.delete(row)


def set_simulation(session: Session, revision: str, summary: str, *, at: datetime, by: str) -> None:
    """Keep `summary` as the last simulation of the candidate `revision` (replacing any)."""
    key = f"{_SIMULATION}{revision}"
    row = session.get(SettingRow, key) or SettingRow(key=key, value="", updated_by=by)
    row.value, row.updated_at, row.updated_by = summary, at, by
    session.add(row)


def simulation(session: Session, revision: str) -> str | None:
    """The summary of the last simulation of `revision`; None when none was run."""
    row = session.get(SettingRow, f"{_SIMULATION}{revision}")
    return row.value if row is not None else None


def _under(session: Session, prefix: str) -> list[tuple[str, str]]:
    stmt = select(SettingRow.key, SettingRow.value).where(col(SettingRow.key).startswith(prefix))
    return list(session.exec(stmt).all())
