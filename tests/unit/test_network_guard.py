"""The test suite's network guard (pytest-socket, configured in pyproject.toml): loopback and Unix
sockets work, every other address is refused before a packet leaves."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
from pytest_socket import SocketConnectBlockedError

OUTSIDE = "10.255.255.1"  # a private address that answers nothing: without the guard, a timeout


def echo_once(server: socket.socket, client: socket.socket) -> bytes:
    """Send a few bytes from `client` through `server`'s accepted connection and back."""
    client.sendall(b"ping")
    peer, _ = server.accept()
    with peer:
        peer.sendall(peer.recv(4))
    return client.recv(4)


def test_a_connection_outside_loopback_is_refused_by_the_guard() -> None:
    """A connect() to a non-loopback address fails at once with the guard's error."""
    with socket.socket() as client:
        client.settimeout(1)
        with pytest.raises(SocketConnectBlockedError, match=OUTSIDE):
            client.connect((OUTSIDE, 80))


def test_a_name_that_is_not_loopback_is_refused_too() -> None:
    """An allowed name does not open the door to the address behind another name."""
    with socket.socket() as client, pytest.raises(SocketConnectBlockedError):
        client.connect(("gpubot.invalid", 80))


@pytest.mark.parametrize(
    ("family", "host"),
    [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "localhost"), (socket.AF_INET6, "::1")],
)
def test_loopback_connections_work(family: socket.AddressFamily, host: str) -> None:
    """The local Slack API, the bot's HTTP server and PostgreSQL listen on loopback."""
    bind = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    try:
        server = socket.socket(family)
        server.bind((bind, 0))
    except OSError as problem:
        pytest.skip(f"no {bind} on this machine: {problem}")
    with server, socket.socket(family) as client:
        server.listen(1)
        client.settimeout(5)
        client.connect((host, server.getsockname()[1]))
        assert b"ping" == echo_once(server, client)


def test_unix_sockets_work() -> None:
    """PostgreSQL's socket directory and other local IPC stay open."""
    with tempfile.TemporaryDirectory(prefix="gpubot-") as folder:
        path = str(Path(folder) / "s")  # short: a Unix socket path is limited to ~100 bytes
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(path)
            server.listen(1)
            client.settimeout(5)
            client.connect(path)
            assert b"ping" == echo_once(server, client)
