"""Open-loop load of signed slash commands over HTTP, timed on one clock from the instant each
was due to its ack (the HTTP response) and to its answer (its response_url POST reaching the
LocalSlack in this process).

The sender keeps to its schedule whatever the server does: the main thread hands each command
to a large thread pool at its due time, so a slow ack holds one thread, never the schedule, and
both times count from the due instant (a sender that fell behind shows as `lag`).
"""

from __future__ import annotations

import http.client
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlencode

from bot.localslack import LocalSlack, payloads, sign
from bot.localslack.api import Answer
from bot.server import EVENTS_PATH

SENDERS = 256  # threads, so that a second of slow acks at the top rate still finds a free one
ACK_TIMEOUT_S = 10.0  # the client gives up (status 0); Slack itself gives up after 3 s
SLACK_DEADLINE_S = 3.0
clock = time.perf_counter  # the one clock: due, sent, acked and answered instants


class TimedSlack(LocalSlack):
    """LocalSlack noting, on the bench's clock, when each response_url POST has arrived (its
    body read, before the workspace handles it), first arrival per token."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: dict[str, float] = {}

    def __enter__(self) -> TimedSlack:
        self.start()
        return self

    def _route(self, verb: str, path: str, headers: Mapping[str, str], raw: bytes) -> Answer:
        if verb == "POST" and path.startswith("/response/"):
            token = path.removeprefix("/response/").partition("?")[0]
            self.arrivals.setdefault(token, clock())
        return super()._route(verb, path, headers, raw)


@dataclass
class Shot:
    """One slash command: what it says, when it was due, and what became of it."""

    user: str
    text: str
    token: str  # its response_url's
    body: bytes
    headers: dict[str, str]
    due: float = math.nan
    sent: float = math.nan
    acked: float = math.nan
    status: int = 0  # 0: no HTTP answer within ACK_TIMEOUT_S


@dataclass
class Load:
    """A run at one offered rate against one server."""

    server: str
    rate: float
    shots: list[Shot]
    answered: dict[str, float] = field(default_factory=dict)  # token -> arrival
    settle_s: float = 0.0  # from the last ack until answered and drained
    settled: bool = True  # False: still not, when the bench stopped waiting

    def acks_s(self) -> list[float]:
        return sorted(s.acked - s.due for s in self.shots if not math.isnan(s.acked))

    def answers_s(self) -> list[float]:
        """Due to answer; an unanswered command counts as never (inf)."""
        return sorted(self.answered.get(s.token, math.inf) - s.due for s in self.shots)

    def lags_s(self) -> list[float]:
        return sorted(s.sent - s.due for s in self.shots if not math.isnan(s.sent))

    def non_200(self) -> int:
        return sum(s.status != 200 for s in self.shots)

    def late(self) -> int:
        """Acks Slack would have given up on."""
        return sum(t > SLACK_DEADLINE_S for t in self.acks_s())

    def unanswered(self) -> int:
        return sum(s.token not in self.answered for s in self.shots)


def nearest_rank(sorted_s: Sequence[float], q: float) -> float:
    if not sorted_s:
        return math.nan
    return sorted_s[max(0, math.ceil(q * len(sorted_s)) - 1)]


class Sender:
    """Signs slash commands as Slack does and POSTs them on a keep-alive connection per thread."""

    def __init__(self, local: TimedSlack, secret: str) -> None:
        self.local, self.secret = local, secret
        self._conns = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def shot(self, user: str, text: str) -> Shot:
        """A signed command with a fresh response_url and trigger (signed now: good for 5 min)."""
        url = payloads.fresh_response_url(self.local, "C0GPU", user)
        form = payloads.slash_command(
            user,
            text,
            response_url=url,
            trigger_id=payloads.fresh_trigger_id(self.local, user),
            channel_name="gpu",
        )
        body = urlencode(form).encode()
        return Shot(user, text, url.rsplit("/", 1)[1], body, sign(body, self.secret))

    def _connection(self, port: int) -> http.client.HTTPConnection:
        conns: dict[int, http.client.HTTPConnection] = self._conns.__dict__.setdefault("by", {})
        if port not in conns:
            conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=ACK_TIMEOUT_S)
            with self._lock:
                self._all.append(conns[port])
        return conns[port]

    def fire(self, port: int, shot: Shot) -> None:
        conn = self._connection(port)
        shot.sent = clock()
        for attempt in (1, 2):
            try:
                conn.request("POST", EVENTS_PATH, body=shot.body, headers=shot.headers)
                response = conn.getresponse()
                response.read()
                shot.status = response.status
            except ConnectionError:
                # uvicorn closes a keep-alive connection idle for 5 s (between loads): reconnect
                # and send again, as an HTTP client does; the time still counts from `due`.
                conn.close()
                if attempt == 1:
                    continue
            except (OSError, http.client.HTTPException):
                conn.close()  # status 0: no answer
            break
        shot.acked = clock()

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


def run_load(
    pool: ThreadPoolExecutor, sender: Sender, port: int, shots: Sequence[Shot], rate: float
) -> None:
    """Hand each shot to the pool at its due time (rate per second from now); returns when
    every ack is in."""
    start = clock() + 0.05
    futures = []
    for i, shot in enumerate(shots):
        shot.due = start + i / rate
        wait = shot.due - clock()
        if wait > 0:
            time.sleep(wait)
        futures.append(pool.submit(sender.fire, port, shot))
    for future in futures:
        future.result()
