"""`gpubot serve`, `demo` and `agent`: the long-running processes. Each imports what it runs
only when called, so the admin commands start without the Slack stack or NVML."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from slack_bolt.error import BoltError

from bot import logs
from bot.cli.common import database_errors, fail, read_settings
from bot.services.rule_files import RulesDirError
from bot.telemetry.errors import TelemetryError
from rules.errors import PolicyError
from rules.expr import parse_duration


def serve(
    http: Annotated[
        bool, typer.Option("--http", help="HTTP mode even when SLACK_APP_TOKEN is set")
    ] = False,
    host: Annotated[
        str, typer.Option(help="address to listen on in HTTP mode, and for --metrics-port")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on in HTTP mode")] = 3000,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="serve /metrics, /healthz, /readyz and /livez on this port too (Socket Mode "
            "has no other HTTP port; HTTP mode serves /metrics on --port); default: "
            "GPUBOT_METRICS_PORT, else none",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the bot: Socket Mode when SLACK_APP_TOKEN is set, else HTTP on /slack/events (with
    /healthz, /readyz, /livez and /metrics). It migrates the database first and carries out
    what an earlier run acknowledged and did not finish."""
    from bot.main import SetupError  # noqa: PLC0415 - the Slack stack loads only to serve
    from bot.main import serve as run  # noqa: PLC0415
    from bot.server import MetricsPortError  # noqa: PLC0415 - the HTTP stack, only to serve

    settings = read_settings()
    if metrics_port is not None:
        settings = settings.model_copy(update={"metrics_port": metrics_port})
    logs.setup(settings.log_level, settings.log_format)
    try:
        with database_errors(settings.database_url):
            run(settings, http=http, host=host, port=port)
    except (SetupError, MetricsPortError) as exc:
        fail(str(exc))
    except (PolicyError, RulesDirError) as exc:
        fail(f"the rules in {settings.rules_dir} cannot be loaded:\n{exc}")
    except BoltError as exc:
        fail(f"Slack refused the bot token at {settings.slack_api_url}: {exc}")
    except TelemetryError as exc:
        fail(str(exc).splitlines()[0])


def demo(
    port: Annotated[int, typer.Option(help="port of the page, on 127.0.0.1 only")] = 8080,
) -> None:
    """Run the local Slack workspace: the real bot and a Slack-like page, no Slack needed."""
    from bot.main import SetupError  # noqa: PLC0415 - the Slack stack loads only to serve
    from bot.workspace.launch import PortTakenError, run  # noqa: PLC0415

    settings = read_settings()
    quiet = "WARNING" if "GPUBOT_LOG_LEVEL" not in os.environ else settings.log_level
    logs.setup(quiet, settings.log_format)  # the page is the demo's output, not the log
    try:
        run(port, typer.echo)
    except PortTakenError as exc:
        fail(f"{exc}{another_port(exc.port)}")
    except SetupError as exc:
        fail(str(exc))
    except (PolicyError, RulesDirError) as exc:
        fail(f"the default rules cannot be loaded:\n{exc}")
    except TelemetryError as exc:  # GPUBOT_FLEET naming a missing or malformed fleet file
        fail(str(exc).splitlines()[0])
    except KeyboardInterrupt:
        typer.echo("demo stopped", err=True)


# `make demo` sets it, so a hint names what the person typed: `make demo PORT=…`.
STARTED_BY = "GPUBOT_STARTED_BY"


def another_port(port: int) -> str:
    """What to type for the next port: in the words of `make demo` when make started the
    demo, else of `gpubot demo`."""
    if not 0 < port < 65535:
        return ""
    if os.environ.get(STARTED_BY) == "make":
        return f"; try `make demo PORT={port + 1}`"
    return f"; try `gpubot demo --port {port + 1}`"


def agent(
    *,
    bot_url: Annotated[
        str, typer.Option("--bot-url", help="the bot's base URL, e.g. https://gpubot.lab:3000")
    ],
    token_file: Annotated[
        Path, typer.Option("--token-file", help="file holding this node's token (one line)")
    ],
    node: Annotated[
        str | None,
        typer.Option(help="node name as in pools.yaml; default: the host name", show_default=False),
    ] = None,
    interval: Annotated[str, typer.Option(help="time between polls, e.g. 30s or 1m")] = "30s",
    once: Annotated[bool, typer.Option("--once", help="push one poll, then exit")] = False,
    simulated: Annotated[
        Path | None,
        typer.Option(
            metavar="FLEET", help="replay a fleet file instead of reading NVML (tests, demo)"
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="report what enforcement orders would signal; signal nothing"
        ),
    ] = False,
    min_uid: Annotated[
        int,
        typer.Option(
            "--min-uid",
            min=0,
            help="never signal a process with any uid below this one (system accounts are "
            "never signalled either)",
        ),
    ] = 1000,
) -> None:
    """Run the node agent: poll this node's GPUs and push the samples to the bot, signed."""
    from bot.agent.loop import AgentError, run_agent  # noqa: PLC0415 - NVML loads only for the agent

    minutes = parse_duration(interval)
    if minutes is None or minutes <= 0:
        fail(f"--interval: expected a duration like 30s or 1m, got {interval!r}")
    settings = read_settings()
    logs.setup(settings.log_level, settings.log_format)
    try:
        run_agent(
            bot_url,
            token_file,
            node=node,
            interval=timedelta(minutes=minutes),
            once=once,
            simulated=simulated,
            dry_run=dry_run,
            min_uid=min_uid,
        )
    except AgentError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("agent stopped", err=True)
