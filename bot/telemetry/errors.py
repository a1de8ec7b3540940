"""The telemetry errors, drawn as one tree:

TelemetryError
├── TelemetryUnavailable   NVML cannot be used on this host (no library, no driver, no GPU)
├── FleetError             a fleet file cannot be loaded; the message is `file:line:col: what`
├── SampleFormatError      a samples document that is not what the agent sends (bad JSON, fields)
├── TokenFileError         the agent tokens file (GPUBOT_AGENT_TOKENS_FILE) cannot be used
└── EndpointsError         GPUBOT_DCGM_ENDPOINTS_FILE or GPUBOT_PROMETHEUS_URL is missing or wrong

Each message is one line meant for a person; none of them needs a traceback to be understood.
"""

from __future__ import annotations


class TelemetryError(Exception):
    """Base of every error raised by bot.telemetry."""


class TelemetryUnavailable(TelemetryError):  # noqa: N818 - the name says what the host lacks
    """This host cannot be read through NVML; the message says why and what to do."""


class FleetError(TelemetryError, ValueError):
    """A fleet file is malformed; `str()` is `file:line:col: message` lines."""


class SampleFormatError(TelemetryError, ValueError):
    """A samples document cannot be decoded into `Sample`s."""


class TokenFileError(TelemetryError):
    """The `node: token` file is missing, unreadable or malformed; the message says which."""


class EndpointsError(TelemetryError):
    """The DCGM endpoints file or the Prometheus URL is unset or unusable; the message says what
    to set."""
