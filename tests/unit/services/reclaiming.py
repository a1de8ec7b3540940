"""A lease that the sweep reclaims while its holder's processes still run, for the enforcer
tests: borrowed, warned of its expiry, the warning delivered, then expired past the grace."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import col, select

from bot.services import BorrowAsk, Services
from bot.services.results import GpuSlot
from bot.telemetry.model import ProcessInfo, Sample
from bot.telemetry.window import TelemetryWindow
from storage import outbox
from storage.tables import AuditRow, OutboxRow
from tests.unit.bot.conftest import ALICE, Clock, borrowed

STARTED = 1_772_400_000.25


def a_sample(slot: GpuSlot, clock: Clock, processes: tuple[ProcessInfo, ...]) -> Sample:
    """A busy A100 with `processes` on it."""
    return Sample(
        node=slot.node,
        index=slot.index,
        uuid=f"GPU-{slot.node}-{slot.index}",
        model="NVIDIA A100-SXM4-80GB",
        memory_total_mib=81920,
        memory_used_mib=30000,
        util_pct=90.0,
        temperature_c=40.0,
        power_w=250.0,
        health="ok",
        processes=processes,
        taken_at=clock.now,
    )


def reclaimed(services: Services, clock: Clock, processes: tuple[ProcessInfo, ...]) -> GpuSlot:
    """alice's one-GPU lease, reclaimed as expired with `processes` on its GPU: its slot."""
    window = TelemetryWindow(timedelta(minutes=3))
    lease = borrowed(services, ALICE, BorrowAsk("a100", 1, timedelta(hours=1), reason="run"))
    assert lease.lease is not None
    (slot,) = lease.lease.gpus

    def run(minutes: int) -> None:
        for _ in range(minutes * 2):
            clock.advance(timedelta(seconds=30))
            window.observe([a_sample(slot, clock, processes)], now=clock.now)

    run(1)
    assert [f"L{lease.lease.id} expiry"] == services.sweep(window).warned
    with services.db.write() as session:
        for row in session.exec(select(OutboxRow)).all():
            if row.delivered_at is None:
                outbox.delivered(session, row.id or 0, at=clock.now, channel="D0ALICE", ts="1.0")
    run(95)
    assert [f"L{lease.lease.id} expired"] == services.sweep(window).reclaimed
    return slot


def audit(services: Services, tag: str) -> list[AuditRow]:
    """The audit rows with `tag`, oldest first."""
    with services.db.read() as session:
        stmt = select(AuditRow).where(col(AuditRow.tag) == tag).order_by(col(AuditRow.id))
        return list(session.exec(stmt).all())
