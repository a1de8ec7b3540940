"""/metrics on a real `gpubot serve`: on the HTTP port behind its bearer token, and in Socket
Mode on --metrics-port, as Prometheus would scrape them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bot.localslack import APP_TOKEN, LocalSlack
from bot.server import free_port
from tests.support.serve import Served

TOKEN = "metrics-token-for-tests"  # noqa: S105 - a test's own token, never a real one


def get(
    url: str, token: str | None = None, *, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request (a GET unless `method` says otherwise)."""
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - loopback
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return answer.status, dict(answer.headers.items()), answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers.items()), error.read()


def sample_names(body: bytes) -> set[str]:
    return {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_http_mode_serves_metrics_behind_the_bearer_token(
    local: LocalSlack, tmp_path: Path
) -> None:
    """401 with a Bearer challenge without the token or with a wrong one; with it, the text
    format, figures read from the database the bot serves from."""
    served = Served(local, tmp_path, env={"GPUBOT_METRICS_TOKEN": TOKEN})
    served.start()
    try:
        status, headers, _ = get(served.url + "/metrics")
        assert 401 == status
        assert headers["www-authenticate"].startswith("Bearer")
        assert 401 == get(served.url + "/metrics", "not-the-token")[0]
        status, headers, body = get(served.url + "/metrics", TOKEN)
        assert 200 == status
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        names = sample_names(body)
        assert {
            "gpubot_gpus",
            "gpubot_rules_info",
            "gpubot_audit_chain_ok",
            "gpubot_healthy",
            "gpubot_decision_seconds_count",
        } <= names
        assert 200 == get(served.url + "/healthz")[0]  # the probes stay open
        status, headers, _ = get(served.url + "/metrics", TOKEN, method="POST")
        assert (405, "GET") == (status, headers["allow"])
    finally:
        served.stop()


def test_socket_mode_serves_metrics_and_probes_on_the_metrics_port(tmp_path: Path) -> None:
    """Socket Mode has no HTTP port of its own: --metrics-port serves /metrics (open without
    a token), /livez and /healthz."""
    port = free_port()
    with LocalSlack() as local:
        served = Served(local, tmp_path, env={"SLACK_APP_TOKEN": APP_TOKEN})
        served.launch(["serve", "--metrics-port", str(port)])
        try:
            local.wait_for_socket(timeout=30)
            base = f"http://127.0.0.1:{port}"
            assert 200 == get(base + "/livez")[0]
            status, _, body = get(base + "/healthz")
            assert 200 == status
            assert json.loads(body)["ok"]
            status, _, body = get(base + "/metrics")
            assert 200 == status
            assert "gpubot_gpus" in sample_names(body)
            assert 404 == get(base + "/slack/events")[0]
        finally:
            served.stop()
    assert "Traceback" not in served.log_text()
