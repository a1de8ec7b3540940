"""A lease's marks as a typed value: each read and change, on the JSON shapes stored today."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from rules.marks import Marks, notice_key, would_have_key

AT = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
STORED: dict[str, dict[str, object]] = {
    "expiry": {"outbox": 11, "owed_at": "2026-03-02T10:00:00+00:00", "lead_min": 60.0},
    "idle": {"outbox": 12, "owed_at": "2026-03-02T11:00:00+00:00", "lead_min": 0.0},
    "recall": {"at": "2026-03-02T11:30:00+00:00", "request": 4, "team": "nlp", "because": "b"},
    "notice:admins": {"at": "2026-03-02T11:00:00+00:00"},
    "would:reclaim-idle:reclaim idle": {"at": "2026-03-02T11:00:00+00:00", "why": "paused"},
}


def test_reads() -> None:
    """Every typed read answers from the stored object."""
    marks = Marks.of(STORED)
    assert (True, False) == (marks.warned("expiry"), marks.warned("preempt"))
    assert {"expiry": 11, "idle": 12} == marks.outboxes()
    assert (11, None) == (marks.warning_outbox("expiry"), marks.warning_outbox("preempt"))
    assert 60.0 == marks.expiry_lead()
    assert marks.recalled
    assert (4, datetime(2026, 3, 2, 11, 30, tzinfo=UTC)) == (
        marks.recalled_for,
        marks.recalled_at,
    )
    assert marks.has(notice_key("admins"))
    assert marks.has(would_have_key("reclaim-idle", "reclaim idle"))


def test_no_marks() -> None:
    """A lease with nothing marked has no warning, no recall and no lead."""
    marks = Marks()
    assert (None, None, None, 0) == (
        marks.expiry_lead(),
        marks.recall,
        marks.recalled_at,
        marks.recalled_for,
    )
    assert not marks.recalled
    assert {} == marks.outboxes()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: m.without("idle"), {k: v for k, v in STORED.items() if k != "idle"}),
        (lambda m: m.without_expiry(), {k: v for k, v in STORED.items() if k != "expiry"}),
        (lambda m: m.without_recall(), {k: v for k, v in STORED.items() if k != "recall"}),
        (
            lambda m: m.with_warning("preempt", outbox=13, owed_at=AT, lead_min=0.0),
            {**STORED, "preempt": {"outbox": 13, "owed_at": AT.isoformat(), "lead_min": 0.0}},
        ),
        (
            lambda m: m.with_recall_for(request=9, team="vision"),
            {**STORED, "recall": {**STORED["recall"], "request": 9, "team": "vision"}},
        ),
        (
            lambda m: m.with_notice("notice:unreserved", at=AT),
            {**STORED, "notice:unreserved": {"at": AT.isoformat()}},
        ),
        (
            lambda m: m.with_would_have("would:r:warn idle", at=AT, why="observe"),
            {**STORED, "would:r:warn idle": {"at": AT.isoformat(), "why": "observe"}},
        ),
    ],
)
def test_changes_write_the_same_json_as_ever(
    change: Callable[[Marks], Marks], expected: dict[str, object]
) -> None:
    """Each change gives new marks whose JSON has the shape stored before marks were typed."""
    before = Marks.of(STORED)
    assert expected == change(before).to_json()
    assert STORED == before.to_json()  # the marks are a value: the old one is unchanged


def test_a_recall_is_written_as_before() -> None:
    """A new recall: when, for which request and team, and why."""
    marks = Marks().with_recall(at=AT, request=4, team="nlp", because="b")
    expected = {"at": AT.isoformat(), "request": 4, "team": "nlp", "because": "b"}
    assert {"recall": expected} == marks.to_json()
