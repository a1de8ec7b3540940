"""`gpubot serve --http` started exactly as the README says, as its own process, driven by signed
requests like any independent client would send; its scheduler delivers the DMs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bot.server import free_port
from bot.settings import DEFAULT_RULES_DIR
from bot.slack.localapi import BOT_TOKEN, HttpTransport, LocalSlack, SlackDriver
from tests.integration.conftest import SECRET

GPUBOT = Path(sys.executable).parent / "gpubot"


def wait_healthy(
    url: str, process: subprocess.Popen[bytes], timeout: float = 30
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gpubot serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as answer:  # noqa: S310
                report: dict[str, object] = json.loads(answer.read())
                return report
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gpubot serve did not become healthy")


def test_serve_http_runs_from_the_documented_environment(local: LocalSlack, tmp_path: Path) -> None:
    """Env in, a healthy server out; a borrow is answered and the grant DM is delivered."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": local.api_url,
        "GPUBOT_DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}",
        "GPUBOT_RULES_DIR": str(DEFAULT_RULES_DIR),
    }
    env.pop("SLACK_APP_TOKEN", None)
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(  # noqa: S603 - our own console script
        [str(GPUBOT), "serve", "--http", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        report = wait_healthy(url, process)
        assert report["ok"]
        slack = SlackDriver(local, HttpTransport(url + "/slack/events"), SECRET)
        assert 200 == slack.command("U0ALICE01", "borrow 2 a100 for 6h because ablations").status
        local.wait_for("response_url", lambda a: "Granted" in json.dumps(a), timeout=10)
        dm = local.wait_for(
            "chat.postMessage", lambda a: "CUDA_VISIBLE_DEVICES" in json.dumps(a), timeout=15
        )
        assert dm.args["channel"].startswith("D")
        assert 401 == slack.command("U0ALICE01", "status", forge="signature").status
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
        log.close()
    # uvicorn shuts down cleanly, then re-raises the signal it caught as its exit status.
    assert process.returncode in (0, -signal.SIGTERM)
    logged = (tmp_path / "serve.log").read_text()
    assert "Application shutdown complete" in logged
    # Quiet by default: no scheduler tick lines, no misleading token warning from Bolt.
    assert "Running job" not in logged
    assert "will be unused" not in logged
