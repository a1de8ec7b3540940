"""Every audit tag and outbox kind the code writes is a member of its enum, read from the source."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rules.domain import RequestKind
from storage import audit, outbox
from storage.audit import AuditTag
from storage.db import Database
from storage.outbox import OutboxKind, Owed

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted(p for package in ("bot", "storage") for p in (ROOT / package).rglob("*.py"))
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

_TAG_LITERAL = re.compile(r'"([a-z_]+:[a-z_-]+)"')
_TAG_FSTRING = re.compile(r'AuditTag\((f"[^"]*")\)')
_OWED_LITERAL = re.compile(r'Owed\(\s*"([a-z_]+)"')

#: Tags built from a pattern, each with every tag it can build (a new pattern must be added).
BUILT = {
    'f"borrow:{_TAG_OF[outcome]}"': [
        f"borrow:{a}" for a in ("approved", "asked", "queued", "denied")
    ],
    'f"extend:{tag}"': [f"extend:{a}" for a in ("approved", "asked", "denied")],
    'f"lease:{state.value}"': ["lease:released", "lease:reclaimed"],
    'f"{request.kind}:denied"': [f"{kind}:denied" for kind in RequestKind],
}


def _lines() -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}:{n}", line)
        for path in SOURCES
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    ]


def test_every_tag_literal_in_the_code_is_an_audit_tag() -> None:
    """A line that speaks of a tag names only members of AuditTag."""
    unknown = [
        (where, tag)
        for where, line in _lines()
        if re.search(r"\btag\b", line)
        for tag in _TAG_LITERAL.findall(line)
        if tag not in set(AuditTag)
    ]
    assert [] == unknown


def test_every_tag_built_from_a_pattern_is_an_audit_tag() -> None:
    """Tags put together at run time are known patterns whose every value is a member."""
    patterns = {found for _, line in _lines() for found in _TAG_FSTRING.findall(line)}
    assert set(BUILT) == patterns  # each pattern in the code is listed, each listed one is used
    assert [] == [tag for tags in BUILT.values() for tag in tags if tag not in set(AuditTag)]


def test_every_outbox_kind_owed_by_a_literal_is_an_outbox_kind() -> None:
    """A message owed with a plain string names a member of OutboxKind."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    assert [] == [k for k in _OWED_LITERAL.findall(text) if k not in set(OutboxKind)]


def test_the_checker_sees_an_unknown_tag() -> None:
    """The source reader finds a literal tag and a built one."""
    line = 'record(session, tag="lease:evaporated", other=f"x") or AuditTag(f"a:{b}")'
    assert ["lease:evaporated"] == _TAG_LITERAL.findall(line)
    assert ['f"a:{b}"'] == _TAG_FSTRING.findall(line)


@pytest.mark.parametrize("tag", [AuditTag.LEASE_GRANTED, "lease:granted"])
def test_an_enum_tag_is_stored_and_hashed_as_its_plain_value(
    database: Database, tag: AuditTag | str
) -> None:
    """Whether written as a member or a string, the row and its chain hash are the same."""
    with database.write() as session:
        audit.append(session, audit.AuditEntry(actor="U1", tag=tag, subject="lease:1"), at=NOW)
    with database.read() as session:
        (row,) = audit.history(session, "lease:1")
        assert "lease:granted" == row.tag
        assert type(row.tag) is str
        assert audit.verify(session).ok


def test_an_enum_kind_is_stored_as_its_plain_value(database: Database) -> None:
    """An outbox row owed with a member reads back as the plain kind."""
    with database.write() as session:
        outbox.owe(session, Owed(OutboxKind.LEASE_GRANTED, "lease:1", "U1", {"lease": 1}), at=NOW)
    with database.read() as session:
        (row,) = outbox.due(session, NOW)
    assert "lease_granted" == row.kind
    assert type(row.kind) is str
