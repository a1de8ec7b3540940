"""Node agents' pushes that reach a follower replica go on to the leader, whose sweep reads them.

The load balancer hands a push to any replica, but samples live in the memory of the replica
that takes them and only the leader's sweep reads them. So a follower sends the push on as it
came (the raw body and the agent's signature headers, unchanged) to the same path on the leader,
which verifies the signature, spends the nonce and answers with the node's orders; that answer
goes back to the agent. A forwarded request is marked (FORWARDED) and never sent on again. With
no leader known, or one that cannot be reached, the follower takes the push itself (its samples
then count once it leads), and says so once per change, not once per push.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

#: Marks a request one replica forwarded to another; its value says which replica sent it.
FORWARDED = "x-gpubot-forwarded-by"
#: How long a follower waits for the leader's answer: an agent's own timeout is longer.
TIMEOUT_S = 3.0
#: After the leader failed to answer, pushes are taken here this long before it is tried again,
#: so that a dead leader costs one slow push, not every one.
REST_S = 10.0
_TEXT = "text/plain; charset=utf-8"
_ANY_ADDRESS = ("", "0.0.0.0", "::")  # noqa: S104 - names what "listen everywhere" looks like
# Replica to replica traffic stays inside the cluster: never through an HTTP(S)_PROXY.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AdvertiseError(ValueError):
    """GPUBOT_ADVERTISE_URL is not a URL another replica could use; the message says why."""


class LeaderView(Protocol):
    """What forwarding needs to know of the election (bot.leader.Leader)."""

    @property
    def replicated(self) -> bool: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_url(self) -> str | None: ...


@dataclass(frozen=True)
class Answer:
    """The leader's answer to a forwarded push, passed back to the agent as it is."""

    status: int
    content_type: str
    body: bytes


#: The longest address the leader row keeps (storage.tables.LeaderRow.address).
MAX_ADDRESS = 256


def advertise_url(configured: str | None, host: str, port: int) -> str:
    """Where the other replicas reach this one's HTTP server: GPUBOT_ADVERTISE_URL when set,
    else `http://<host>:<port>` for a specific --host, else this host's primary address (the
    pod's IP in Kubernetes, the container's in compose). "" when none can be found."""
    if configured:
        parts = urlsplit(configured)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AdvertiseError(
                f"GPUBOT_ADVERTISE_URL must be an http:// or https:// URL the other replicas "
                f"can reach, such as http://10.0.0.7:3000; it is {configured!r}"
            )
        if len(configured.rstrip("/")) > MAX_ADDRESS:
            raise AdvertiseError(
                f"GPUBOT_ADVERTISE_URL is {len(configured)} characters long; the database keeps "
                f"at most {MAX_ADDRESS}: give the address and port only, such as "
                "http://10.0.0.7:3000"
            )
        return configured.rstrip("/")
    address = host
    if host in _ANY_ADDRESS:
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError as exc:
            log.warning(
                "replicas: cannot find this host's address (%s); set GPUBOT_ADVERTISE_URL so "
                "the other replicas can forward node agents' pushes here while it leads",
                exc,
            )
            return ""
        if address.startswith("127."):
            log.warning(
                "replicas: this host's name resolves to %s, which replicas on other hosts "
                "cannot reach; set GPUBOT_ADVERTISE_URL to this replica's address",
                address,
            )
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


def _copied(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers the leader needs: the body's type and the agent's signed fields."""
    return {
        name: value
        for name, value in headers.items()
        if (name == "content-type" or name.startswith("x-gpubot-")) and name != FORWARDED
    }


class Forwarder:
    """Decides, per agent request, whether it goes to the leader (`target`), and sends it
    there (`send`, blocking: run it on `pool`, off the event loop)."""

    def __init__(
        self,
        leader: LeaderView,
        *,
        own: str,
        timeout_s: float = TIMEOUT_S,
        rest_s: float = REST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.leader, self.own = leader, own
        self.timeout_s, self.rest_s, self.clock = timeout_s, rest_s, clock
        # A slow leader holds a thread per push for up to timeout_s; these are not the
        # threads the probes and the local ingest run on.
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="agent-forward")
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._resting: tuple[str, float] | None = None  # (leader URL, until when)
        self._said = ""  # the state last logged

    def target(self, headers: Mapping[str, str]) -> str | None:
        """The leader's URL when this request (headers by lower-case name) goes there; None
        when this replica takes it."""
        if FORWARDED in headers:  # sent on once already: taken here, whoever leads now
            self._count("received")
            return None
        if not self.leader.replicated or self.leader.is_leader:
            self._say("leading", "")
            return None
        url = self.leader.leader_url
        if url is None:
            self._count("kept")
            self._say(
                "none",
                "replicas: no leader's address is known; node agents' pushes are taken "
                "here until one is (the leader's sweep does not see them meanwhile)",
            )
            return None
        with self._lock:
            resting = self._resting
        if resting is not None and resting[0] == url and self.clock() < resting[1]:
            self._count("kept")
            return None
        return url

    def send(self, url: str, path: str, headers: Mapping[str, str], body: bytes) -> Answer | None:
        """Forward one request to the leader at `url`: its answer, or None when it never
        reached the leader (the caller takes it here)."""
        request = urllib.request.Request(  # noqa: S310 - the leader's address, http(s) only
            url + path,
            data=body,
            method="POST",
            headers={**_copied(headers), FORWARDED: self.own or "a replica"},
        )
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                answer = Answer(
                    response.status, response.headers.get("content-type", _TEXT), response.read()
                )
        except urllib.error.HTTPError as exc:  # the leader refused it: the agent hears why
            with exc:
                answer = Answer(exc.code, exc.headers.get("content-type", _TEXT), exc.read())
        except urllib.error.URLError as exc:
            # Not delivered (refused, unreachable, no connection in time): the leader has not
            # seen it, so taking it here spends its nonce once.
            self._unreached(url, str(exc.reason))
            self._count("kept")
            return None
        except (OSError, http.client.HTTPException) as exc:
            # Delivered, but no answer: the leader may have taken it (and spent its nonce), so
            # it is not taken again here; the agent pushes again with a fresh nonce.
            why = str(exc) or type(exc).__name__
            self._unreached(url, f"no answer within {self.timeout_s:g} s: {why}")
            self._count("unanswered")
            body = b"the leader replica did not answer in time; push again"
            return Answer(504, _TEXT, body)
        self._count("forwarded")
        self._say("forwarding " + url, f"replicas: node agents' pushes go to the leader at {url}")
        return answer

    def totals(self) -> dict[str, int]:
        """For /healthz: forwarded (answered by the leader), kept (taken here while another
        replica leads), unanswered, received (forwarded here by another replica)."""
        with self._lock:
            return {
                key: self._counts[key] for key in ("forwarded", "kept", "unanswered", "received")
            }

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _unreached(self, url: str, why: str) -> None:
        with self._lock:
            self._resting = (url, self.clock() + self.rest_s)
        self._say(
            "unreached " + url,
            f"replicas: cannot reach the leader at {url} ({why}); node agents' pushes are "
            f"taken here for now, and the leader is tried again every {self.rest_s:g} s",
        )

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def _say(self, state: str, message: str) -> None:
        """Log `message` when the state changes; "" changes it silently."""
        with self._lock:
            if self._said == state:
                return
            self._said = state
        if not message:
            return
        if state.startswith("forwarding"):
            log.info("%s", message)
        else:
            log.warning("%s", message)
