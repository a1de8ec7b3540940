"""`gpubot demo` from the command line: it prints its database's URL, which the admin
commands then read, and a taken port's hint is in the words the person typed (`make demo
PORT=…` under make, `gpubot demo --port …` otherwise)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from bot.workspace.launch import PROXY_VARIABLES, run
from tests.unit.bot.cli.builders import ROOT, gpubot


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_taken_port_run_directly_suggests_the_gpubot_option(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpubot demo --port N` on a taken port: exit 2, one line with `--port N+1`."""
    monkeypatch.delenv("GPUBOT_STARTED_BY", raising=False)
    result = gpubot("demo", "--port", str(taken_port))
    assert 2 == result.exit_code
    assert result.stderr.startswith(f"error: cannot serve the page on 127.0.0.1:{taken_port}: ")
    assert result.stderr.endswith(f"; try `gpubot demo --port {taken_port + 1}`\n")
    assert 1 == len(result.stderr.splitlines())


def test_a_taken_port_under_make_suggests_the_make_variable(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started by `make demo` (which sets GPUBOT_STARTED_BY=make): `make demo PORT=N+1`."""
    monkeypatch.setenv("GPUBOT_STARTED_BY", "make")
    result = gpubot("demo", "--port", str(taken_port))
    assert 2 == result.exit_code
    assert result.stderr.endswith(f"; try `make demo PORT={taken_port + 1}`\n")


def test_make_demo_tells_gpubot_that_make_started_it() -> None:
    """The Makefile's demo recipe sets the marker the hint reads (a dry run: nothing starts)."""
    done = subprocess.run(
        ["make", "-n", "demo", "PORT=8123"],  # noqa: S607  (make from PATH, as a person runs it)
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "GPUBOT_STARTED_BY=make .venv/bin/gpubot demo --port 8123" in done.stdout


def test_the_demo_prints_its_database_url_and_the_admin_commands_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The banner's database line is a URL `gpubot leases` reads: the opening leases, by name."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GPUBOT_TELEMETRY", raising=False)
    monkeypatch.setenv("TZ", "UTC")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    said: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(port, said.append), kwargs={"stop": stop})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
        assert said, "no banner"
        lines = said[0].splitlines()
        database = next(line for line in lines if line.startswith("  database: "))
        url = database.removeprefix("  database: ").split(" ", 1)[0]
        assert url.startswith("sqlite:///")
        assert url.endswith("/gpubot-demo.db")
        assert f"  the admin commands read it: GPUBOT_DATABASE_URL={url} gpubot leases" in lines
        monkeypatch.setenv("GPUBOT_DATABASE_URL", url)
        leases = gpubot("leases")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert 0 == leases.exit_code, leases.output
    assert "Alice Anders" in leases.stdout
    assert "granted (UTC)" in leases.stdout
