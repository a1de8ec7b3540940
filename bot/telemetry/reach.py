"""How much of the fleet a scraping telemetry source (DCGM exporters, a Prometheus server) reads
right now, and how /healthz reports it.

One node's exporter failing leaves that node's GPUs unknown and the rest of the fleet read: the
bot works on, degraded, and /healthz names the node. Only when nothing answers (every exporter,
or the Prometheus server) is telemetry not ok. Neither makes the process unhealthy or unready:
restarting the bot mends no exporter, and Slack requests are still taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Failing nodes named in /healthz; a larger outage shows as the count.
NAMED = 20


@dataclass(frozen=True)
class Reach:
    """`failing`: what cannot be read now, by name (nodes; for a Prometheus server that does not
    answer, every node it last answered for). `whole`: nothing at all is read."""

    failing: tuple[str, ...] = ()
    whole: bool = False
    why: str = ""  # with `whole`: in status words, for /healthz's note


def health_fields(reach: Reach | None, problem: str, note: str) -> dict[str, Any]:
    """/healthz's telemetry words: `telemetry_ok` false when the source cannot be read at all
    (`problem`, or every endpoint failing), `telemetry_degraded` when only some nodes fail, and
    the failing nodes (the first NAMED of them, sorted) with their count."""
    reach = reach or Reach()
    ok = not problem and not reach.whole
    return {
        "telemetry_note": problem or (reach.why if reach.whole else "") or note,
        "telemetry_ok": ok,
        "telemetry_degraded": ok and bool(reach.failing),
        "telemetry_failing_nodes": sorted(reach.failing)[:NAMED],
        "telemetry_failing_count": len(reach.failing),
    }
