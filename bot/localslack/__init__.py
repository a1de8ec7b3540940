"""A local Slack for gpubot's tests and demo: the Web API, response_urls, Socket Mode and a
stateful workspace on 127.0.0.1, plus a driver that acts as a person using Slack.
"""

from .calls import Call
from .driver import Forge, Reply, SlackDriver
from .faults import Fault
from .model import Channel, Ephemeral, File, Message, User
from .server import APP_TOKEN, BOT_TOKEN, LocalSlack
from .signing import sign
from .transports import HttpTransport, InProcessTransport, SocketTransport, Transport
from .workspace import Workspace

__all__ = [
    "APP_TOKEN",
    "BOT_TOKEN",
    "Call",
    "Channel",
    "Ephemeral",
    "Fault",
    "File",
    "Forge",
    "HttpTransport",
    "InProcessTransport",
    "LocalSlack",
    "Message",
    "Reply",
    "SlackDriver",
    "SocketTransport",
    "Transport",
    "User",
    "Workspace",
    "sign",
]
