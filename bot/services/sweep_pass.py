"""One pass of the sweep: what it works with (readings read once per GPU) and what it did."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bot.services.context import Context
from bot.telemetry.window import TelemetryWindow
from rules.lease_facts import Reading, Readings

UNREAD: object = object()  # not read yet in this pass (a reading may itself be None)


@dataclass
class SweepReport:
    warned: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    shrunk: list[str] = field(default_factory=list)  # leases that gave back their idle GPUs
    notified: list[str] = field(default_factory=list)
    would_have: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)  # reclaims the invariants refused
    recalled: list[str] = field(default_factory=list)  # leases chosen for a lender recall
    recall_withdrawn: list[str] = field(default_factory=list)
    chased: list[str] = field(default_factory=list)  # "R4 remind": the approval lifecycle
    decided: int = 0  # subjects decided in the pass
    evaluated: int = 0  # of them, those the engine evaluated (the others: rules.memo)

    @property
    def changed(self) -> bool:
        return bool(
            self.warned
            or self.reclaimed
            or self.shrunk
            or self.notified
            or self.would_have
            or self.recalled
            or self.recall_withdrawn
            or self.chased
        )


@dataclass
class Pass:
    """One sweep: what it works with and what it did."""

    ctx: Context
    readings: Readings
    now: datetime
    paused: bool
    report: SweepReport = field(default_factory=SweepReport)
    # GPUs whose unreserved use was told, and to which Unix users (read with the snapshot).
    unreserved: Mapping[str, frozenset[str]] = field(default_factory=dict)
    _seen: dict[tuple[str, int], Reading | None] = field(
        default_factory=dict, init=False, repr=False
    )
    _read_every: bool = field(default=False, init=False, repr=False)

    def reading(self, node: str, index: int) -> Reading | None:
        """What telemetry says about one GPU at this pass's `now`; read once per pass."""
        key = (node, index)
        try:
            return self._seen[key]
        except KeyError:
            if not self._read_every:
                self._read_every = True
                self._read_all()
                if key in self._seen:
                    return self._seen[key]
            found = self._seen[key] = self.readings.gpu(node, index, self.now)
            return found

    def every_reading(self) -> Mapping[tuple[str, int], Reading | None]:
        """The readings read so far, by (node, index), after reading every GPU in one read where
        the telemetry offers that: a GPU not named there is read with `reading`."""
        if not self._read_every:
            self._read_every = True
            self._read_all()
        return self._seen

    def of_slots(self, slots: Sequence[tuple[str, int]]) -> list[Reading | None]:
        """`reading` of each GPU of `slots`, in order (a lease's GPUs, as (node, index))."""
        if not self._read_every:
            return [self.reading(node, index) for node, index in slots]
        seen = self._seen
        found = [seen.get(slot, UNREAD) for slot in slots]
        for i, reading in enumerate(found):
            if reading is UNREAD:  # not in the window's read: read on its own, as before
                found[i] = self.reading(*slots[i])
        return found  # type: ignore[return-value]  # UNREAD replaced above

    def _read_all(self) -> None:
        """Every GPU's reading in one read, where the telemetry offers that (the window does):
        a pass reads every GPU, and one read takes the window's lock once, not once per GPU.
        A GPU it does not name is then read on its own, as before."""
        if isinstance(self.readings, TelemetryWindow):
            self._seen.update(self.readings.readings(self.now))
