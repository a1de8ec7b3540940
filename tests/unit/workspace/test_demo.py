"""The demo without a browser: the opening leases, fast-forward, the page server's guards, and
`gpubot demo` itself."""

from __future__ import annotations

import csv
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, func, select
from typer.testing import CliRunner

from bot.cli.app import app
from bot.workspace.demo import Demo
from bot.workspace.history import MARK, PLAN
from bot.workspace.launch import run
from bot.workspace.opening import REASON
from bot.workspace.page import PageServer
from storage.tables import GpuHourRow, LeaseRow

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(
    page: PageServer, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json"} if data is not None else {}
    url = page.url.rstrip("/") + path
    request = urllib.request.Request(url, data, sent | (headers or {}))  # noqa: S310  (loopback)
    try:
        with OPENER.open(request, timeout=10) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def test_the_demo_opens_with_the_fleets_work_leased_by_its_people(demo: Demo) -> None:
    """Every opening lease is active and audited as borrowed by its holder, none refused."""
    leases = demo.bot.services.leases()
    assert 7 == len(leases)
    assert {REASON} == {lease.reason for lease in leases}
    assert "U0ERIN001" in {lease.holder for lease in leases if lease.pool == "inference"}


def test_the_demo_seeds_two_weeks_of_past_after_its_opening_leases(demo: Demo) -> None:
    """The opening keeps L1 to L7 (the tour names them); the past is ended leases after them,
    marked as demo data, with a week of hourly use behind it."""
    assert len(PLAN) == demo.seeded
    assert {f"L{n}" for n in range(1, 8)} == {lease.code for lease in demo.bot.services.leases()}
    with demo.bot.db.read() as session:
        past = session.exec(select(LeaseRow).where(col(LeaseRow.id) > 7)).all()
        hours = session.exec(select(func.count()).select_from(GpuHourRow)).one()
    assert len(PLAN) == len(past)
    assert all(lease.reason.startswith(MARK) and lease.ended_at for lease in past)
    assert hours > 0


def test_unreserved_use_is_the_exception_once_time_moves_on(demo: Demo) -> None:
    """Twenty minutes in, only the two processes the fleet runs without a lease are reported."""
    demo.forward(timedelta(minutes=20))
    assert 2 == len(demo.bot.services.unreserved())
    assert demo.clock.offset == timedelta(minutes=20)


def test_fast_forward_refuses_to_go_back_or_beyond_a_day(demo: Demo) -> None:
    for wrong in (timedelta(0), timedelta(days=2)):
        with pytest.raises(ValueError, match="fast-forward"):
            demo.forward(wrong)


def test_the_page_and_its_state_are_served(page: PageServer) -> None:
    status, html = call(page, "/")
    assert 200 == status
    assert "/static/app.js" in html
    status, state = call(page, "/ui/state?as=U0VMGR001")
    assert 200 == status
    assert "U0VMGR001" == state["me"]
    assert {"gpu", "vision-approvals"} <= {c["name"] for c in state["conversations"]}
    assert 3 == len(state["fleet"]["pools"])


@pytest.mark.parametrize(
    ("path", "body", "headers", "expected"),
    [
        ("/ui/forward", {"minutes": 10}, {"Host": "evil.example:80"}, 403),
        ("/ui/forward", {"minutes": 10}, {"Content-Type": "text/plain"}, 403),
        ("/ui/nothing", {}, {}, 404),
        ("/ui/forward", {"minutes": 0}, {}, 400),
        ("/ui/command", {"as": "U0BOB0001", "channel": "C0NAPPROV", "text": "/gpu mine"}, {}, 400),
        ("/ui/command", {"as": "U0NOBODY", "channel": "C0GPU", "text": "/gpu mine"}, {}, 400),
        ("/static/../demo.py", None, {}, 404),
    ],
)
def test_the_page_server_turns_away_what_the_page_would_never_send(
    page: PageServer, path: str, body: Any, headers: dict[str, str], expected: int
) -> None:
    """Other hosts (DNS rebinding), non-JSON posts (cross-site forms), strangers, bad input."""
    status, _ = call(page, path, body, headers)
    assert expected == status


def test_plain_text_in_the_composer_is_posted_as_the_persons_message(
    demo: Demo, page: PageServer
) -> None:
    status, _ = call(
        page, "/ui/command", {"as": "U0BOB0001", "channel": "C0GPU", "text": "hi <all>"}
    )
    assert 200 == status
    assert ["hi &lt;all&gt;"] == [m.text for m in demo.local.messages("C0GPU")]


def test_gpubot_demo_prints_where_to_look_and_serves_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpubot demo` replays the simulated fleet by itself: no GPUBOT_TELEMETRY needed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUBOT_TELEMETRY", raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    said: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(port, said.append), kwargs={"stop": stop})
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
        assert said, "no banner"
        assert f"open http://127.0.0.1:{port}/ in a browser" in said[0]
        assert "telemetry: the simulated fleet (default.yaml)" in said[0]
        assert "the two weeks before now are seeded demo data" in said[0]
        with OPENER.open(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert 200 == answer.status
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def test_gpubot_demo_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["demo", "--port", str(port)])
    assert 2 == result.exit_code
    assert f"cannot serve the page on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output


def test_gpubot_demo_with_a_missing_fleet_file_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUBOT_FLEET", str(tmp_path / "nope.yaml"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(app, ["demo", "--port", str(port)])
    assert 2 == result.exit_code
    assert "nope.yaml: cannot read the fleet file" in result.output
    assert "Traceback" not in result.output


def test_gpubot_nodes_reads_the_demos_database(demo: Demo, tmp_path: Path) -> None:
    """`gpubot nodes` and `--history` on the demo's own database: every GPU with its state,
    and each device's intervals (joined, drained with who and why, leases with their team)."""
    demo.forward(timedelta(minutes=10))
    assert isinstance(demo.bot.services.drain("U0ADMIN01", "l40s-node-02", "fan swap"), str)
    url = f"sqlite:///{tmp_path / 'gpubot-demo.db'}"
    now = CliRunner().invoke(app, ["nodes", "--format", "jsonl", "--database-url", url])
    assert 0 == now.exit_code, now.output
    gpus = {(g["node"], g["gpu"]): g for g in map(json.loads, now.output.splitlines())}
    assert 28 == len(gpus)
    assert "occupied" == gpus[("a100-node-02", 6)]["state"]
    assert "dave" == gpus[("a100-node-02", 6)]["processes_of"]
    assert ("leased", "platform") == (
        gpus[("infer-node-01", 0)]["state"],
        gpus[("infer-node-01", 0)]["team"],
    )
    assert 81920 == gpus[("a100-node-01", 0)]["memory_mib"]
    assert gpus[("a100-node-01", 0)]["uuid"]
    assert ("550.54.15", "12.4") == (
        gpus[("a100-node-01", 0)]["driver"],
        gpus[("a100-node-01", 0)]["cuda"],
    )
    table = CliRunner().invoke(app, ["nodes", "--node", "l40s-node-02", "--database-url", url])
    assert 0 == table.exit_code, table.output
    assert 4 == sum("l40s-node-02" in line for line in table.output.splitlines())
    past = CliRunner().invoke(app, ["nodes", "--history", "--format", "csv", "--database-url", url])
    assert 0 == past.exit_code, past.output
    rows = list(csv.DictReader(io.StringIO(past.output)))
    assert {"node", "gpu", "pool", "state", "team", "lease", "start", "end", "by"} <= set(rows[0])
    drained = [r for r in rows if r["state"] == "drained"]
    assert [("l40s-node-02", "", "U0ADMIN01")] == [(r["node"], r["gpu"], r["by"]) for r in drained]
    assert "fan swap" in drained[0]["detail"]
    assert 28 == sum(r["state"] == "joined" for r in rows)
    leased = [r for r in rows if r["state"] == "leased"]
    held_now = [r for r in leased if not r["end"]]  # the rest is the seeded past, ended
    assert {"vision", "nlp", "platform"} == {r["team"] for r in held_now}
    assert all(r["start"] for r in leased)
    assert len(leased) > len(held_now)
    alone = CliRunner().invoke(app, ["nodes", "--since", "2d", "--database-url", url])
    assert 2 == alone.exit_code
    assert "--since goes with --history" in alone.output
    assert "not-reporting" not in now.output  # every demo node reports
    unknown = CliRunner().invoke(app, ["nodes", "--node", "nope", "--database-url", url])
    assert 2 == unknown.exit_code
    assert "there is no node 'nope'" in unknown.output
