"""`/gpu admin reload` through signed HTTP: one more line when `gpubot rules simulate` ran on
the revision being loaded, none otherwise."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from bot.services import simulate
from rules.simulate import Summary
from tests.integration.conftest import Running

ADA = "U0ADMIN01"


def answered(running: Running, text: str) -> str:
    """Ada types `/gpu text`; what the bot answered later through response_url."""
    before = len(running.local.calls.of("response_url"))
    assert 200 == running.slack.command(ADA, text).status
    running.local.wait_for(
        "response_url", lambda a: len(running.local.calls.of("response_url")) > before
    )
    return json.dumps(running.local.calls.of("response_url")[before].args, ensure_ascii=False)


def test_reload_says_what_a_simulation_of_that_revision_found(running: Running) -> None:
    services = running.bot.services
    plain = answered(running, "admin reload")
    assert "Rules reloaded: revision" in plain
    assert "A simulation" not in plain
    until = datetime(2026, 3, 31, 9, 0, tzinfo=UTC)
    summary = Summary(
        requests=40,
        outcomes={"approve → ask": 2, "ask → deny": 1},
        reclaims_added=2,
        reclaims_removed=1,
        gpu_h_freed=12.5,
        people=("U0ALICE01", "U0BOB0001", "U0CAROL01"),
    )
    revision = services.policy.revision
    sim = simulate.Simulation(
        "0000000000000000", revision, until - timedelta(days=30), until, summary, (), (), {}
    )
    simulate.remember(services.db, sim, at=until, by="test")
    shown = answered(running, "admin reload")
    assert (
        "cases passed.\\nA simulation of this revision over the last 30 days: 3 outcomes "
        "change, 2 more reclaims, 1 fewer, 12.5 GPU-h freed, 3 people affected."
    ) in shown
