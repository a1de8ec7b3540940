"""What the bot has marked on a lease: the warnings owed to its holder, a lender recall, and
the one-time notices and "would have" records of the sweep.

A lease's marks are one JSON object in the database (`lease.warnings`), keyed by what each
mark is:

    expiry | idle | unhealthy | preempt   a warning owed: {"outbox", "owed_at", "lead_min"}
    partly_idle                           a warning owed as above, with "gpus": the idle GPUs
                                          it names, as "node:index"
    kept                                  the holder chose Keep on a partly-idle warning: {"at"}
    recall                                a lender recall: {"at", "request", "team", "because"}
    notice:<reason>                       the admins were told once: {"at"}
    would:<rule>:<verdict>                what a paused or observe-only rule would have done:
                                          {"at", "why"}

`Marks` is that object as a frozen value with typed reads and `with_...`/`without...`
changes; the stored JSON is exactly the mapping it wraps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RECALL = "recall"
PREEMPT = "preempt"
PARTLY_IDLE = "partly_idle"
KEPT = "kept"


def notice_key(reason: str) -> str:
    """The mark of a one-time notice to the admins for `reason`."""
    return f"notice:{reason}"


def would_have_key(rule: str, verdict: object) -> str:
    """The mark of what `rule` would have done (`verdict`) had it been enforced."""
    return f"would:{rule}:{verdict}"


@dataclass(frozen=True)
class Marks:
    """A lease's marks, by key; see the module docstring for the keys and their shapes."""

    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Marks | Mapping[str, Any] | None) -> Marks:
        """Marks from what the database holds (a mapping), or marks as they are."""
        if isinstance(value, Marks):
            return value
        return cls(dict(value or {}))

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored for these marks."""
        return dict(self.raw)

    def _entry(self, key: str) -> Mapping[str, Any] | None:
        entry = self.raw.get(key)
        return entry if isinstance(entry, Mapping) else None

    # ---- warnings owed to the holder -----------------------------------------------------

    def warned(self, reason: str) -> bool:
        """Was a warning for `reason` owed (whether or not it was delivered yet)?"""
        return self.raw.get(reason) is not None

    def warning(self, reason: str) -> Mapping[str, Any] | None:
        """The warning owed for `reason`: its outbox id, when it was owed, its lead time."""
        return self._entry(reason)

    def warning_outbox(self, reason: str) -> int | None:
        """The outbox row of the warning owed for `reason`, if any."""
        sent = self._entry(reason)
        return int(sent["outbox"]) if sent is not None and "outbox" in sent else None

    def outboxes(self) -> dict[str, int]:
        """The outbox row of every warning owed, by its key."""
        return {
            key: int(entry["outbox"])
            for key, entry in self.raw.items()
            if isinstance(entry, Mapping) and "outbox" in entry
        }

    def expiry_lead(self) -> float | None:
        """The lead time (minutes) of the expiry warning owed, None when none was."""
        sent = self._entry("expiry")
        return None if sent is None else float(sent.get("lead_min", 0.0))

    def with_warning(
        self, reason: str, *, outbox: int | None, owed_at: datetime, lead_min: float
    ) -> Marks:
        sent = {"outbox": outbox, "owed_at": owed_at.isoformat(), "lead_min": lead_min}
        return Marks({**self.raw, reason: sent})

    def idle_slots(self) -> tuple[tuple[str, int], ...]:
        """The idle GPUs the standing partly-idle warning names (none: no such warning)."""
        sent = self._entry(PARTLY_IDLE)
        named = sent.get("gpus", []) if sent is not None else []
        slots = []
        for gpu in named:
            node, _, index = str(gpu).rpartition(":")
            if node and index.isdecimal():
                slots.append((node, int(index)))
        return tuple(slots)

    def with_idle_slots(self, slots: tuple[tuple[str, int], ...]) -> Marks:
        """The partly-idle warning owed, naming the idle GPUs it offers to give back."""
        sent = self._entry(PARTLY_IDLE)
        assert sent is not None
        gpus = [f"{node}:{index}" for node, index in slots]
        return Marks({**self.raw, PARTLY_IDLE: {**sent, "gpus": gpus}})

    @property
    def kept(self) -> bool:
        """Did the holder choose Keep on a partly-idle warning?"""
        return KEPT in self.raw

    def with_kept(self, *, at: datetime) -> Marks:
        """Keep every GPU: no more partly-idle warnings, and the standing one is answered."""
        return Marks({**self.without(PARTLY_IDLE).raw, KEPT: {"at": at.isoformat()}})

    def without(self, *keys: str) -> Marks:
        return Marks({k: v for k, v in self.raw.items() if k not in keys})

    def without_expiry(self) -> Marks:
        """Without the expiry warnings (an extension made them moot)."""
        return Marks({k: v for k, v in self.raw.items() if not k.startswith("expiry")})

    # ---- a lender recall -----------------------------------------------------------------

    @property
    def recalled(self) -> bool:
        """Is the lease being recalled?"""
        return RECALL in self.raw

    @property
    def recall(self) -> Mapping[str, Any] | None:
        """The recall: when it began, for which request and team, and why."""
        return self._entry(RECALL)

    @property
    def recalled_at(self) -> datetime | None:
        mark = self._entry(RECALL)
        if mark is None or "at" not in mark:
            return None
        return datetime.fromisoformat(str(mark["at"]))

    @property
    def recalled_for(self) -> int:
        """The request the recall serves (0: none recorded)."""
        mark = self._entry(RECALL)
        return int(mark.get("request") or 0) if mark is not None else 0

    @property
    def recalled_within_team(self) -> bool:
        """Is the recall for a higher-priority request of the lease's own team?"""
        mark = self._entry(RECALL)
        return bool(mark.get("within_team")) if mark is not None else False

    def with_recall(
        self, *, at: datetime, request: int, team: str, because: str, within_team: bool = False
    ) -> Marks:
        mark: dict[str, Any] = {
            "at": at.isoformat(),
            "request": request,
            "team": team,
            "because": because,
        }
        if within_team:
            mark["within_team"] = True
        return Marks({**self.raw, RECALL: mark})

    def with_recall_for(self, *, request: int, team: str) -> Marks:
        """The recall, now serving another waiting request."""
        mark = self._entry(RECALL)
        assert mark is not None
        return Marks({**self.raw, RECALL: {**mark, "request": request, "team": team}})

    def without_recall(self) -> Marks:
        """Without the recall and the preemption warning it brought."""
        return self.without(RECALL, PREEMPT)

    # ---- one-time records of the sweep ---------------------------------------------------

    def has(self, key: str) -> bool:
        """Is there a mark under `key` (a `notice_key` or a `would_have_key`)?"""
        return key in self.raw

    def with_notice(self, key: str, *, at: datetime) -> Marks:
        return Marks({**self.raw, key: {"at": at.isoformat()}})

    def with_would_have(self, key: str, *, at: datetime, why: str) -> Marks:
        return Marks({**self.raw, key: {"at": at.isoformat(), "why": why}})
