"""Settings, read once from the environment (and an optional .env file).

Slack's standard names (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_APP_TOKEN, SLACK_API_URL)
and a GPUBOT_ prefix for the rest. Secrets are SecretStr so they never reach a log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_RULES_DIR = Path(__file__).resolve().parent.parent / "rules" / "policies"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPUBOT_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        env_ignore_empty=True,  # SLACK_APP_TOKEN= means unset, not an empty token
    )

    database_url: str = Field(
        default="sqlite:///gpubot.db",
        description="SQLAlchemy URL: sqlite:///path.db (default) or postgresql://user@host/db",
    )
    rules_dir: Path = Field(default=DEFAULT_RULES_DIR, description="directory of rule files")
    rules_engine: Literal["durable", "reference"] = Field(
        default="durable", description="durable (default) or the pure-Python reference"
    )
    telemetry: Literal["auto", "nvml", "simulated", "agents", "dcgm", "prometheus"] = Field(
        default="auto",
        description="auto: this host's GPUs when NVML finds them, else what node agents push; "
        "nvml: this host's GPUs; agents: only what node agents push; dcgm: scrape the DCGM "
        "exporters in GPUBOT_DCGM_ENDPOINTS_FILE; prometheus: query the Prometheus server at "
        "GPUBOT_PROMETHEUS_URL for the DCGM series (with GPUBOT_AGENT_TOKENS_FILE too, either "
        "is hybrid: the agents add processes and enforcement); simulated: the demo's simulated "
        "fleet, only when asked for by name",
    )
    dcgm_endpoints_file: Path | None = Field(
        default=None,
        description="YAML file of `node: URL` for GPUBOT_TELEMETRY=dcgm, each URL a DCGM "
        "exporter's /metrics",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="the Prometheus server GPUBOT_TELEMETRY=prometheus queries "
        "(e.g. http://prometheus:9090)",
    )
    fleet: Path | None = Field(
        default=None,
        description="the fleet file GPUBOT_TELEMETRY=simulated replays (default: the demo's, "
        "bot/telemetry/fleets/default.yaml in the package)",
    )
    node_name: str | None = Field(
        default=None, description="this host's node name for NVML (default: the host name)"
    )
    agent_tokens_file: Path | None = Field(
        default=None,
        description="YAML file of `node: token` for the node agents (gpubot agent); unset: none",
    )
    enforcer: Literal["notify", "signal", "signal-dry-run", "slurm", "kubernetes"] = Field(
        default="notify",
        description="what a reclaim does to running work: notify (default) tells the holder; "
        "signal has the node agent SIGTERM, then SIGKILL, the holder's processes on those GPUs; "
        "signal-dry-run records what it would signal; slurm cancels the holder's Slurm jobs "
        "(scancel); kubernetes evicts the holder's pods (or deactivates their Kueue Workload)",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig for GPUBOT_ENFORCER=kubernetes (default: the in-cluster "
        "service account, else ~/.kube/config)",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="bearer token /metrics asks for (unset: /metrics is open, like /healthz)",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="the port /metrics, /healthz, /readyz and /livez also listen on (serve "
        "--metrics-port): Socket Mode's only HTTP port; in HTTP mode /metrics is on --port too",
    )
    leader_lock: Literal["advisory", "table"] = Field(
        default="advisory",
        description="PostgreSQL: how replicas choose the one that runs the periodic jobs: "
        "advisory (a session advisory lock, default) or table (a lease row renewed every few "
        "seconds, for connection poolers that break session locks); both fence with an epoch",
    )
    advertise_url: str | None = Field(
        default=None,
        description="replicas: the URL the other replicas reach this one's HTTP server at, to "
        "forward node agents' pushes to the leader (default: http://<this host's address>:<port>)",
    )
    workers: int = Field(
        default=4,
        ge=1,
        le=64,
        description="threads that carry out acknowledged Slack requests (one person's in order)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="the least severe log records written (demo: WARNING)"
    )
    log_format: Literal["console", "json"] = Field(
        default="console", description="console (a line of text) or json (one object a line)"
    )
    slack_bot_token: SecretStr | None = Field(default=None, alias="SLACK_BOT_TOKEN")
    slack_signing_secret: SecretStr | None = Field(default=None, alias="SLACK_SIGNING_SECRET")
    slack_app_token: SecretStr | None = Field(default=None, alias="SLACK_APP_TOKEN")
    slack_api_url: str = Field(default="https://slack.com/api/", alias="SLACK_API_URL")
