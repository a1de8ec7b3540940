"""The key-value repository keeps each use under its own key, in the stored format."""

from __future__ import annotations

from datetime import UTC, datetime

from storage import keyvalue
from storage.db import Database
from storage.tables import SettingRow

AT = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)


def test_the_kill_switch_reads_back_as_set(database: Database) -> None:
    """Unset reads as not paused; set and reset are stored as "true" and "false"."""
    with database.write() as session:
        before = keyvalue.paused(session)
        stored = keyvalue.set_paused(session, True, at=AT, by="U1")
    with database.read() as session:
        row = session.get(SettingRow, "automation.paused")
        assert row is not None
        assert (False, "true", True, "U1") == (
            before,
            stored,
            keyvalue.paused(session),
            row.updated_by,
        )


def test_users_told_come_back_under_their_key_until_forgotten(database: Database) -> None:
    """Never told is None; told users are stored sorted; forgetting drops the key."""
    key = keyvalue.unreserved_key("n1", 2)
    with database.write() as session:
        never = keyvalue.users_told(session, key)
        keyvalue.set_users_told(session, key, {"zed", "bob"}, at=AT, by="gpubot")
    with database.read() as session:
        row = session.get(SettingRow, "unreserved:n1:2")
        assert row is not None
        assert (None, "bob,zed") == (never, row.value)
        assert {key: frozenset({"bob", "zed"})} == keyvalue.told_unreserved(session)
    with database.write() as session:
        keyvalue.forget(session, key)
    with database.read() as session:
        assert keyvalue.users_told(session, key) is None


def test_strays_and_intrusions_read_back_apart(database: Database) -> None:
    """Each prefix reads only its own keys."""
    with database.write() as session:
        keyvalue.flag_stray(session, "n9", 4, at=AT, by="gpubot")
        key = keyvalue.intruder_key(8, "n1", 6)
        keyvalue.set_users_told(session, key, ["dave"], at=AT, by="gpubot")
    with database.read() as session:
        assert {"n9": 4} == keyvalue.stray_nodes(session)
        assert {"intruder:8:n1:6": frozenset({"dave"})} == keyvalue.told_intruders(session)
        assert [("8", "n1", "6", "dave")] == keyvalue.intrusions_told(session)
