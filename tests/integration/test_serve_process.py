"""`gpubot serve --http` started exactly as the README says, as its own process, driven by signed
requests like any independent client would send; its scheduler delivers the DMs."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

from bot.localslack import APP_TOKEN, HttpTransport, LocalSlack, SlackDriver, SocketTransport
from tests.support.serve import SECRET, Served


def test_serve_http_runs_from_the_documented_environment(local: LocalSlack, tmp_path: Path) -> None:
    """Env in, a healthy server out; a borrow is answered and the grant DM is delivered."""
    served = Served(local, tmp_path)
    served.start()
    try:
        report = served.wait("/healthz")
        assert report["ok"]
        slack = SlackDriver(local, HttpTransport(served.events_url), SECRET)
        assert 200 == slack.command("U0ALICE01", "borrow 2 a100 for 6h because ablations").status
        local.wait_for("response_url", lambda a: "Granted" in json.dumps(a), timeout=10)
        dm = local.wait_for(
            "chat.postMessage", lambda a: "CUDA_VISIBLE_DEVICES" in json.dumps(a), timeout=15
        )
        assert dm.args["channel"].startswith("D")
        assert 401 == slack.command("U0ALICE01", "status", forge="signature").status
    finally:
        status = served.stop()
    # uvicorn shuts down cleanly, then re-raises the signal it caught as its exit status.
    assert status in (0, -signal.SIGTERM)
    logged = served.log_text()
    assert "Application shutdown complete" in logged
    assert "gpubot stopped" in logged  # SIGTERM let the workers and deliveries finish
    # Quiet by default: no scheduler tick lines, no misleading token warning from Bolt.
    assert "Running job" not in logged
    assert "will be unused" not in logged
    assert "will be ignored" not in logged


def test_serve_starts_and_acks_while_slack_is_down(tmp_path: Path) -> None:
    """auth.test failing (5xx, then nothing listening) does not stop the bot: it serves, acks,
    records, and answers once Slack is back."""
    with LocalSlack() as local:
        local.faults.add("auth.test", status=503, times=1000)
        served = Served(local, tmp_path)
        served.start()
        try:
            assert served.wait("/readyz")["ok"]
            slack = SlackDriver(local, HttpTransport(served.events_url), SECRET)
            reply = slack.command("U0ALICE01", "borrow 1 l40s for 1h because outage")
            assert 200 == reply.status
            local.faults.clear()  # Slack is back: the answer that waited goes out
            local.wait_for("response_url", lambda a: "Granted" in json.dumps(a), timeout=20)
        finally:
            served.stop()
    assert "serving anyway" in served.log_text()
    assert "Traceback" not in served.log_text()


def test_socket_mode_keeps_dialling_until_slack_answers(tmp_path: Path) -> None:
    """apps.connections.open failing at start-up: serve retries with backoff and connects."""
    with LocalSlack() as local:
        local.faults.add("apps.connections.open", status=503, times=4)  # past the client's retries
        served = Served(local, tmp_path, env={"SLACK_APP_TOKEN": APP_TOKEN})
        process = served.launch(["serve"])
        try:
            local.wait_for_socket(timeout=30)
            slack = SlackDriver(local, SocketTransport(local, timeout=10), SECRET)
            assert 200 == slack.command("U0ALICE01", "help").status
        finally:
            served.stop()
    assert process.returncode in (0, -signal.SIGTERM)
    assert "retrying in" in served.log_text()
    assert "Traceback" not in served.log_text()


def test_serve_stops_at_once_when_the_port_is_taken(local: LocalSlack, tmp_path: Path) -> None:
    """A second bot on a port in use says so in one line and exits 2, before it touches the
    database or starts any worker."""
    served = Served(local, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", served.port))
        taken.listen()
        served.launch(["serve", "--http", "--port", str(served.port)])
        assert served.process is not None
        assert 2 == served.process.wait(timeout=30)
    logged = served.log_text()
    assert f"cannot listen on 127.0.0.1:{served.port}" in logged
    assert "Traceback" not in logged
    assert not (tmp_path / "serve.db").exists()


def test_a_wrong_app_token_stops_socket_mode_with_one_line(tmp_path: Path) -> None:
    """Slack rejecting SLACK_APP_TOKEN is no outage to wait out: exit 2, saying what to fix."""
    with LocalSlack() as local:
        served = Served(local, tmp_path, env={"SLACK_APP_TOKEN": "xapp-not-this-one"})
        process = served.launch(["serve"])
        assert 2 == process.wait(timeout=30)
    assert "Slack refused SLACK_APP_TOKEN (invalid_auth)" in served.log_text()
    assert "Traceback" not in served.log_text()
