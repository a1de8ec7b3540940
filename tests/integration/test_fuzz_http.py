"""Hostile HTTP at every endpoint of the served bot (uvicorn on loopback, the whole front):
unsigned, forged and signed-but-malformed requests to /slack/events, the agents' routes and any
other path. None gets a 5xx, nothing logs a traceback, and the bot still answers afterwards."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import string
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bot.localslack import LocalSlack, payloads
from bot.localslack.signing import FORM, JSON_CONTENT, sign
from bot.main import Bot, assemble
from bot.server import MAX_BODY, Background, SlackAsgi
from bot.slack import wire
from bot.slack.blocks import (
    APPROVE_ACTION,
    BORROW_COUNT,
    BORROW_DURATION,
    BORROW_MODAL,
    BORROW_OPEN_ACTION,
    BORROW_POOL,
    BORROW_PRIORITY,
    BORROW_REASON,
    CANCEL_ACTION,
    DENY_ACTION,
    DENY_MODAL,
    DENY_REASON,
    EXTEND_ACTION,
    RELEASE_ACTION,
    borrow_modal,
)
from bot.slack.blocks.warnings import BORROW_QUICK_ACTION, SNOOZE_ACTION
from bot.telemetry import model
from tests.integration.conftest import PROXY_VARIABLES, SECRET, settings_for

NODE = "a100-node-01"
AGENT_TOKEN = "fuzz-agent-token-for-a100-node-01-0123456789"  # noqa: S105  (a test agent's)
PEOPLE = ("U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ADMIN01", "U0NMGR001")
POOLS = ("a100", "l40s", "inference")
BUTTONS = (
    APPROVE_ACTION,
    DENY_ACTION,
    CANCEL_ACTION,
    EXTEND_ACTION,
    RELEASE_ACTION,
    SNOOZE_ACTION,
    BORROW_OPEN_ACTION,
    BORROW_QUICK_ACTION,
)
PROBES = ("/livez", "/readyz", "/healthz")
ROUTES = ("/slack/events", "/agent/samples", "/agent/results", *PROBES)
REFUSED = {400, 401, 413}
Headers = Sequence[tuple[str, str | bytes]]
# Stands for a body one byte over the limit (a megabyte in an example would swamp its repr).
OVERSIZE = b"<one byte more than MAX_BODY>"

FUZZ = settings(
    deadline=None,
    derandomize=True,  # CI runs the same examples every time
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


class Recorder(logging.Handler):
    """Every log record of the run, from any thread; `problems` are those with a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.records.append(record)

    def problems(self, since: int = 0) -> list[str]:
        with self._lock:
            records = self.records[since:]
        return [self.format(r) for r in records if r.exc_info or "Traceback" in r.getMessage()]


def _octets(value: str | bytes) -> bytes:
    """A header value as sent: latin-1 where it can be (as http.client does), else UTF-8."""
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


class Front:
    """The assembled bot behind uvicorn, the local Slack it talks to, and its log."""

    def __init__(self, bot: Bot, local: LocalSlack, port: int, log: Recorder) -> None:
        self.bot, self.local, self.port, self.log = bot, local, port, log

    def __repr__(self) -> str:  # what a failing example prints
        return f"Front(http://127.0.0.1:{self.port})"

    def send(
        self,
        method: str,
        path: str,
        headers: Headers = (),
        body: bytes = b"",
        *,
        chunked: bool = False,
    ) -> int:
        """One request on a fresh loopback connection; the status of its answer."""
        body = b"x" * (MAX_BODY + 1) if body == OVERSIZE else body
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, _octets(value))
            if chunked:
                conn.putheader("Transfer-Encoding", "chunked")
                chunks = [body[k : k + 65536] for k in range(0, len(body), 65536)]
                # The server may answer (413) before it reads the rest; its answer is there.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.endheaders(iter(chunks), encode_chunked=True)
            else:
                conn.putheader("Content-Length", str(len(body)))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.endheaders(body)
            response = conn.getresponse()
            # A server that refuses bad framing closes the connection with bytes unread, and
            # the kernel may reset it under the answer's body: the status is what counts.
            with contextlib.suppress(ConnectionResetError):
                response.read()
            return response.status
        finally:
            conn.close()

    def quiet(self, since: int) -> list[str]:
        """The tracebacks logged since `since`, once the bot's workers are done."""
        assert self.bot.inbox.wait_idle(20)
        # Drains the express delivery thread (the next answer owed starts another).
        self.bot.deliverer.close()
        return self.log.problems(since)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("fuzz")
    tokens = tmp / "agents.yaml"
    tokens.write_text(f"{NODE}: {AGENT_TOKEN}\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as env, LocalSlack() as local:
        for name in PROXY_VARIABLES:  # slack_sdk reads a proxy when its client is built
            env.delenv(name, raising=False)
        settings_ = settings_for(local, tmp).model_copy(update={"agent_tokens_file": tokens})
        bot = assemble(settings_)
        served = Background(SlackAsgi(bot.app, bot.health, ingest=bot.ingest, ready=bot.ready))
        recorder = Recorder()
        # uvicorn's loggers stop at "uvicorn" (propagate False): watch it as well as the root.
        watched = [logging.getLogger(), logging.getLogger("uvicorn")]
        for logger in watched:
            logger.addHandler(recorder)
        try:
            yield Front(bot, local, served.port, recorder)
        finally:
            for logger in watched:
                logger.removeHandler(recorder)
            served.stop()
            bot.close()


# Building blocks

latin1 = st.text(st.characters(max_codepoint=255, exclude_characters="\r\n"), max_size=60)
header_values = st.one_of(
    latin1,
    st.text(st.characters(exclude_characters="\r\n"), max_size=30).map(str.encode),
    st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**31 - 2, max_value=2**80),
    st.floats(),  # NaN and Infinity too, which json.dumps writes and JSON does not know
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
nested = st.integers(min_value=1, max_value=3000).flatmap(
    lambda n: st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n, "[" * n])
)
ODD_IDS = ("", "0", "1", "2", "-1", "01", "1.5", "1e3", "²", "١٢", " 1", "1\n", "9" * 11, "9" * 40)
id_texts = st.one_of(
    st.sampled_from([*ODD_IDS, str(2**31 - 1), str(2**31), str(2**63)]),
    st.text(max_size=12),
)
slack_ids = st.one_of(
    st.sampled_from(PEOPLE),
    st.sampled_from(["U0NOBODY1", "W0ABC", "B0BOT", "USLACKBOT", "U" + "0" * 31, "U" * 33]),
    st.text(string.ascii_letters + string.digits, min_size=1, max_size=32),
    st.text(max_size=10),
)
# Only loopback, or nothing a client can reach: the bot answers through these.
response_urls = st.sampled_from(
    ["", "x", "not a url", "javascript:alert(1)", "ftp://127.0.0.1/x", "http://127.0.0.1:9/"]
)
command_texts = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "help",
            "status",
            "mine",
            "queue",
            "quota",
            "audit",
            "borrow",
            "borrow 1 a100 for 1h because fuzz",
            "borrow 99999999999 a100",
            "borrow 1 nowhere for 99999d",
            "release L99999999999",
            "release L2147483648",
            "extend L1 +99999h",
            "approve R2147483647",
            "why R" + "9" * 40,
            "admin pause",
            "admin drain a100-node-01",
        ]
    ),
)


def now_s() -> int:
    return int(time.time())


# 1. /slack/events, not signed by Slack

stamps = st.one_of(
    st.none(),
    st.sampled_from(["", "abc", "²", "١٧٤١٩٤٢٨٠٠", "9" * 40, "-1", "0", "1.5", "+1", "0x10"]),
    st.integers(min_value=-(10**13), max_value=10**13).map(str),
    latin1,
    st.integers(min_value=-(10**7), max_value=10**7),  # seconds from now, stale or not
)
signatures = st.one_of(
    st.none(),
    header_values,
    st.sampled_from(
        ["v0=", "v0=" + "0" * 64, "v0=" + "é" * 64, "V0=" + "a" * 64, "v1=" + "a" * 64]
    ),
    st.text("0123456789abcdefg", min_size=60, max_size=70).map("v0=".__add__),
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            FORM,
            JSON_CONTENT,
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "application/json;;;",
            "text/plain",
            "multipart/form-data; boundary=x",
            "",
        ]
    ),
    latin1,
)
slack_bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: urlencode({"payload": json.dumps(v)}).encode()),
    nested.map(str.encode),
    st.just(OVERSIZE),
    st.just(urlencode({"command": "/gpu", "user_id": "U0ALICE01", "text": "help"}).encode()),
)


@dataclass(frozen=True)
class Unsigned:
    """A request to /slack/events as anyone on the network could send it."""

    body: bytes
    stamp: str | int | None  # int: seconds from now
    signature: str | bytes | None
    content_type: str | None
    resign: str | None  # sign the body with this secret over a stale stamp instead
    chunked: bool
    extra: tuple[tuple[str, str | bytes], ...]


unsigned_requests = st.builds(
    Unsigned,
    body=slack_bodies,
    stamp=stamps,
    signature=signatures,
    content_type=content_types,
    resign=st.one_of(st.none(), st.sampled_from([SECRET, "wrong-secret", ""])),
    chunked=st.booleans(),
    extra=st.lists(
        st.tuples(
            st.sampled_from(
                ["X-Slack-Signature", "X-Slack-Request-Timestamp", "Content-Type", "X-Other"]
            ),
            header_values,
        ),
        max_size=2,
    ).map(tuple),
)


@settings(FUZZ, max_examples=400)
@given(request=unsigned_requests)
def test_unsigned_or_forged_slack_requests_are_refused_with_4xx(
    front: Front, request: Unsigned
) -> None:
    """Bytes, headers and stamps of any kind, not signed with the secret now: 400, 401 or 413."""
    since = len(front.log.records)
    headers: list[tuple[str, str | bytes]] = []
    if request.resign is not None:
        stale = now_s() - wire.MAX_SKEW_S - 60 if request.resign == SECRET else now_s()
        headers += sign(request.body, request.resign, stale).items()
    else:
        if request.stamp is not None:
            stamp = request.stamp
            headers.append(
                (
                    "X-Slack-Request-Timestamp",
                    str(now_s() + stamp) if isinstance(stamp, int) else stamp,
                )
            )
        if request.signature is not None:
            headers.append(("X-Slack-Signature", request.signature))
        if request.content_type is not None:
            headers.append(("Content-Type", request.content_type))
    status = front.send(
        "POST", "/slack/events", [*headers, *request.extra], request.body, chunked=request.chunked
    )
    event(f"status {status}")  # the spread, in --hypothesis-show-statistics
    assert status in REFUSED
    assert [] == front.quiet(since)


# 2. /slack/events, signed with the secret, hostile inside

actions = st.fixed_dictionaries(
    {"action_id": st.one_of(st.sampled_from(BUTTONS), st.text(max_size=10), json_values)},
    optional={
        "value": st.one_of(
            id_texts,
            st.lists(st.one_of(st.sampled_from([*POOLS, NODE]), id_texts), max_size=6).map(
                ":".join
            ),
            json_values,
        ),
        "type": st.sampled_from(["button", "static_select", "overflow"]),
        "block_id": st.text(max_size=8),
        "selected_option": json_values,
    },
)
modal_inputs = (
    BORROW_POOL,
    BORROW_COUNT,
    BORROW_DURATION,
    BORROW_PRIORITY,
    BORROW_REASON,
    DENY_REASON,
)
input_states = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["static_select", "plain_text_input", "number_input"]),
            "value": st.one_of(st.text(max_size=30), id_texts, json_values),
            "selected_option": st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {"value": st.one_of(st.sampled_from([*POOLS, "high", "normal"]), json_values)}
                ),
            ),
        },
    ),
)
state_values = st.one_of(
    json_values,
    st.dictionaries(
        st.one_of(st.sampled_from([i.block_id for i in modal_inputs]), st.text(max_size=6)),
        st.one_of(
            json_values,
            st.dictionaries(
                st.one_of(
                    st.sampled_from([i.action_id for i in modal_inputs]), st.text(max_size=6)
                ),
                input_states,
                max_size=3,
            ),
        ),
        max_size=5,
    ),
)
views = st.fixed_dictionaries(
    {
        "callback_id": st.one_of(
            st.sampled_from([BORROW_MODAL, DENY_MODAL]), st.text(max_size=8), json_values
        ),
        "state": st.one_of(st.fixed_dictionaries({"values": state_values}), json_values),
    },
    optional={
        "private_metadata": st.one_of(id_texts, json_values),
        "id": st.text(max_size=8),
        "type": st.just("modal"),
        "blocks": json_values,
    },
)
# What Slack sends as interactions: the two gpubot handles, and others it answers 404.
INTERACTION_TYPES = (
    "block_actions",
    "view_submission",
    "view_closed",
    "shortcut",
    "message_action",
    "block_suggestion",
)
interactions = st.fixed_dictionaries(
    {
        "type": st.one_of(st.sampled_from(sorted(INTERACTION_TYPES)), json_values),
        "user": st.one_of(
            st.fixed_dictionaries({"id": st.one_of(slack_ids, json_values)}), json_values
        ),
    },
    optional={
        "actions": st.one_of(st.lists(actions, max_size=3), json_values),
        "view": st.one_of(views, json_values),
        "trigger_id": st.one_of(st.text(max_size=20), json_values),
        "response_url": st.one_of(response_urls, json_values),
        "callback_id": st.one_of(st.text(max_size=10), json_values),
        "container": json_values,
        "channel": json_values,
        "message": json_values,
        "team": json_values,
        "state": json_values,
        "value": st.text(max_size=10),
        "event_id": st.one_of(st.text(max_size=100), json_values),
    },
)
command_forms = st.one_of(
    st.fixed_dictionaries(
        {"command": st.just("/gpu"), "user_id": st.sampled_from(PEOPLE), "text": command_texts},
        optional={
            "response_url": response_urls,
            "trigger_id": st.text(max_size=20),
            "channel_id": st.one_of(st.sampled_from(["C0GPU", "D0NOPE", ""]), st.text(max_size=10)),
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "command": st.one_of(st.sampled_from(["/gpu", "/other", ""]), st.text(max_size=70)),
            "user_id": slack_ids,
            "text": st.one_of(command_texts, st.just("t" * 4001)),
            "response_url": st.one_of(response_urls, st.just("x" * 1001)),
            "trigger_id": st.text(max_size=201),
            "channel_id": st.text(max_size=10),
            "payload": st.text(max_size=10),
            "ssl_check": st.sampled_from(["1", "0"]),
        },
    ),
)
events = st.fixed_dictionaries(
    {
        "type": st.one_of(
            st.sampled_from(["app_home_opened", "message", "app_mention", "tokens_revoked"]),
            json_values,
        )
    },
    optional={
        "user": st.one_of(slack_ids, st.none(), json_values),
        "tab": st.one_of(st.sampled_from(["home", "messages", "about"]), json_values),
        "channel": st.one_of(st.text(max_size=10), json_values),
        "view": json_values,
        "text": st.text(max_size=20),
        "event_ts": st.one_of(st.text(max_size=10), json_values),
    },
)
event_bodies = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("event_callback"), "event": st.one_of(events, json_values)},
        optional={
            "event_id": st.one_of(st.text(max_size=100), json_values),
            "team_id": st.one_of(st.text(max_size=10), json_values),
            "api_app_id": st.one_of(st.text(max_size=10), json_values),
            "authorizations": json_values,
            "event_time": json_values,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("url_verification")},
        optional={"challenge": st.one_of(st.text(max_size=210), json_values)},
    ),
    st.fixed_dictionaries(
        {"type": st.one_of(st.sampled_from(["app_rate_limited", "block_actions"]), json_values)},
        optional={"event": json_values, "minute_rate_limited": json_values},
    ),
    json_values,
)


def _form(fields: dict[str, str]) -> bytes:
    return urlencode(fields).encode()


signed_bodies = st.one_of(
    st.tuples(st.just(FORM), interactions.map(lambda p: _form({"payload": json.dumps(p)}))),
    st.tuples(st.just(FORM), json_values.map(lambda v: _form({"payload": json.dumps(v)}))),
    st.tuples(st.just(FORM), nested.map(lambda n: ("payload=" + quote(n)).encode())),
    st.tuples(st.just(FORM), st.text(max_size=60).map(lambda t: ("payload=" + t).encode())),
    st.tuples(st.just(FORM), command_forms.map(_form)),
    st.tuples(st.just(FORM), st.binary(max_size=100)),
    st.tuples(st.just(FORM), st.just(("a=1&" * 300).encode())),
    st.tuples(st.just(JSON_CONTENT), event_bodies.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just(JSON_CONTENT), interactions.map(lambda v: json.dumps(v).encode())),
    st.tuples(st.just(JSON_CONTENT), nested.map(str.encode)),
    st.tuples(st.just(JSON_CONTENT), st.binary(max_size=100)),
    st.tuples(
        content_types.map(lambda c: c or ""), json_values.map(lambda v: json.dumps(v).encode())
    ),
)


@settings(FUZZ, max_examples=1000)
@given(signed=signed_bodies)
def test_signed_hostile_slack_bodies_never_get_a_server_error(
    front: Front, signed: tuple[str, bytes]
) -> None:
    """Signed with the secret, fresh, any shape inside: never a 5xx, never a traceback."""
    content_type, body = signed
    since = len(front.log.records)
    headers = sign(body, SECRET, content_type=content_type)
    status = front.send("POST", "/slack/events", list(headers.items()), body)
    event(f"status {status}")  # the spread, in --hypothesis-show-statistics
    assert status < 500
    assert [] == front.quiet(since)


# 3. /slack/events, well formed, fuzzed where people type

typed = st.one_of(
    st.text(max_size=80),
    st.lists(
        st.sampled_from(["borrow", "1", "a100", "for", "2h", "because", "🙂", "&", "<@U0BOB0001>"]),
        max_size=6,
    ).map(" ".join),
)


@dataclass(frozen=True)
class Typed:
    """A request Slack could send, with what a person typed or a button carried in it."""

    kind: str
    user: str
    text: str
    pool: str
    value: str  # a count typed in the form, or a button's value
    button: str


well_formed = st.builds(
    Typed,
    kind=st.sampled_from(["command", "home", "url_verification", "borrow_form", "click"]),
    user=st.sampled_from(PEOPLE),
    text=typed,
    pool=st.sampled_from(POOLS),  # a select sends only its options
    value=st.one_of(
        st.sampled_from(["1", "0", "-1", "99999", "2.5", "a100:1:60"]), id_texts, typed
    ),
    button=st.sampled_from(BUTTONS),
)


def well_formed_body(front: Front, request: Typed) -> tuple[bytes, str]:
    """The signed body Slack would send, and its content type."""
    local, user = front.local, request.user
    trigger = payloads.fresh_trigger_id(local, user)
    if request.kind == "command":
        response_url = payloads.fresh_response_url(local, "C0GPU", user)
        form = payloads.slash_command(
            user, request.text, response_url=response_url, trigger_id=trigger
        )
        return _form(form), FORM
    if request.kind == "home":
        opened = payloads.app_home_opened(user, channel=local.workspace.dm_channel(user))
        return json.dumps(opened).encode(), JSON_CONTENT
    if request.kind == "url_verification":
        return json.dumps(payloads.url_verification(request.text)).encode(), JSON_CONTENT
    if request.kind == "click":  # on the Home tab, so the answer goes by DM
        action = {"action_id": request.button, "block_id": "b", "type": "button"}
        home = {"id": "V0FUZZHOME", "type": "home", "blocks": []}
        clicked = payloads.block_actions(
            user, {**action, "value": request.value}, home, trigger_id=trigger
        )
        return _form({"payload": json.dumps(clicked)}), FORM
    view = borrow_modal(POOLS, None, datetime.now(UTC))
    values = {"pool": request.pool, "count": request.value, "duration": request.text}
    submitted = payloads.view_submission(
        user, view, {**values, "reason": request.text}, trigger_id=trigger
    )
    return _form({"payload": json.dumps(submitted)}), FORM


@settings(FUZZ, max_examples=150)
@given(request=well_formed)
def test_well_formed_signed_requests_with_fuzzed_text_get_200(front: Front, request: Typed) -> None:
    """Real payload shapes with anything typed in them: 200, and no traceback later."""
    since = len(front.log.records)
    body, content_type = well_formed_body(front, request)
    headers = sign(body, SECRET, content_type=content_type)
    assert 200 == front.send("POST", "/slack/events", list(headers.items()), body)
    assert [] == front.quiet(since)


# 4. /agent/samples and /agent/results

FIELDS = (*model.FIELDS, "extra")


def a_sample_row(taken_at: str) -> dict[str, Any]:
    return {
        "node": NODE,
        "index": 0,
        "uuid": "GPU-fuzz-0",
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_total_mib": 81920,
        "memory_used_mib": 0,
        "util_pct": 0.0,
        "temperature_c": 30.0,
        "power_w": 60.0,
        "health": "ok",
        "processes": [{"pid": 4242, "user": "alice", "used_mib": 100, "started": 1.7e9}],
        "taken_at": taken_at,
        "error": None,
    }


@dataclass(frozen=True)
class Push:
    """An agent's request: what its body says, and at most one flaw in how it is sent."""

    path: str
    body: tuple[str, Any]  # (how to build it, what to build it with)
    flaw: str = ""  # "": signed right with the node's token
    signature: str | None = None  # unsigned: this instead of the right one
    skew_s: int = 0  # the timestamp, seconds from now
    nonce: str | None = None  # None: a fresh one
    node: str = NODE
    header: tuple[str, str | bytes] | None = None  # one more, repeating one of ours


agent_bodies = st.one_of(
    st.tuples(
        st.just("sample"),
        st.tuples(
            st.sampled_from(FIELDS),
            st.one_of(
                json_values,
                st.sampled_from(
                    [
                        "9999-12-31T23:59:59-01:00",
                        "0001-01-01T00:00:00+01:00",
                        "2024-01-01T00:00:00",
                        "now",
                        "",
                        1023,
                        1024,
                        2**31,
                        -273,
                        100_001,
                        2**22 + 1,
                    ]
                ),
            ),
        ),
    ),
    st.tuples(
        st.just("samples"),
        st.one_of(
            st.integers(min_value=0, max_value=8),
            st.sampled_from([model.MAX_SAMPLES, model.MAX_SAMPLES + 1]),
        ),
    ),
    st.tuples(
        st.just("document"),
        st.fixed_dictionaries(
            {},
            optional={
                "version": st.one_of(st.just(1), json_values),
                "samples": st.one_of(st.lists(json_values, max_size=3), json_values),
                "order": st.one_of(
                    st.integers(min_value=-3, max_value=2**31 + 3), st.integers(), json_values
                ),
                "results": st.one_of(
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "pid": st.one_of(st.integers(), json_values),
                                "outcome": st.one_of(st.text(max_size=30), json_values),
                            }
                        ),
                        max_size=3,
                    ),
                    json_values,
                ),
            },
        ),
    ),
    st.tuples(
        st.just("document"),
        st.fixed_dictionaries(
            {
                "order": st.one_of(
                    st.sampled_from([0, 1, 2, model.MAX_ID, model.MAX_ID + 1]), st.integers()
                ),
                "results": st.lists(
                    st.fixed_dictionaries(
                        {
                            "pid": st.integers(min_value=-1, max_value=model.MAX_PID + 1),
                            "outcome": st.text(max_size=30),
                        }
                    ),
                    max_size=3,
                ),
            }
        ),
    ),
    st.tuples(st.just("json"), json_values),
    st.tuples(st.just("raw"), st.one_of(st.binary(max_size=200), nested.map(str.encode))),
    st.tuples(
        st.just("raw"),
        st.sampled_from(
            [
                b'{"version": 1, "samples": [{"util_pct": NaN}]}',
                b'{"order": Infinity, "results": []}',
                b'{"order": ' + b"9" * 5000 + b', "results": []}',
                b"\xff\xfe{",
                OVERSIZE,
            ]
        ),
    ),
)
agent_headers = st.sampled_from(
    ["X-Gpubot-Node", "X-Gpubot-Timestamp", "X-Gpubot-Nonce", "X-Gpubot-Signature"]
)


def pushes_with(flaw: str, **wrong: st.SearchStrategy[Any]) -> st.SearchStrategy[Push]:
    return st.builds(
        Push,
        path=st.sampled_from(["/agent/samples", "/agent/results"]),
        body=agent_bodies,
        flaw=st.just(flaw),
        **wrong,
    )


WRONG: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "": {},  # signed right
    "unsigned": {"signature": st.sampled_from(["", "v1=" + "0" * 64, "v1=" + "é" * 64])},
    "skew": {"skew_s": st.integers(min_value=-(10**7), max_value=10**7)},
    "nonce": {"nonce": st.one_of(st.just("used-once"), latin1)},
    "node": {"node": st.one_of(st.sampled_from(["A100-NODE-01", "a100-node-02"]), latin1)},
    "header": {"header": st.tuples(agent_headers, header_values)},
}
pushes = st.sampled_from(["", "", "", "", *WRONG]).flatmap(  # signed right half the time
    lambda flaw: pushes_with(flaw, **WRONG[flaw])
)


def agent_body(kind: str, detail: Any, now: datetime) -> bytes:
    if kind == "sample":
        name, value = detail
        row = a_sample_row(now.isoformat())
        row[name] = now.isoformat() if value == "now" else value
        return json.dumps({"version": 1, "samples": [row]}).encode()
    if kind == "samples":
        rows = [{**a_sample_row(now.isoformat()), "index": k} for k in range(detail)]
        return json.dumps({"version": 1, "samples": rows}).encode()
    if kind in ("document", "json"):
        return json.dumps(detail).encode()
    assert isinstance(detail, bytes)
    return detail


@settings(FUZZ, max_examples=400)
@given(push=pushes)
def test_hostile_agent_pushes_never_get_a_server_error(front: Front, push: Push) -> None:
    """Unsigned, misheaded or signed-with-the-token junk on the agents' routes: never a 5xx."""
    since, now = len(front.log.records), datetime.now(UTC)
    body = agent_body(*push.body, now)
    stamp = str(now_s() + push.skew_s)
    nonce = push.nonce if push.nonce is not None else f"fuzz-{time.monotonic_ns()}"
    signature = push.signature
    if signature is None:
        signature = model.sign(AGENT_TOKEN, stamp, nonce, body)
    headers: list[tuple[str, str | bytes]] = [
        ("X-Gpubot-Node", push.node),
        ("X-Gpubot-Timestamp", stamp),
        ("X-Gpubot-Nonce", nonce),
        ("X-Gpubot-Signature", signature),
        ("Content-Type", "application/json"),
    ]
    if push.header is not None:
        headers.append(push.header)
    status = front.send("POST", push.path, headers, body)
    # The spread, in --hypothesis-show-statistics.
    event(f"{push.flaw or 'signed'} {push.path} {push.body[0]}: {status}")
    assert status < 500
    if push.flaw == "unsigned":
        assert status in REFUSED
    assert [] == front.quiet(since)


# 5. Any method, any path

methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
paths = st.one_of(
    st.sampled_from(ROUTES),
    st.sampled_from(
        [
            "/",
            "*",
            "/slack/events/",
            "/SLACK/EVENTS",
            "//livez",
            "/livez?x=1&x=2",
            "/readyz/../healthz",
            "/%2e%2e/%2e%2e/etc/passwd",
            "/%6civez",
            "/%ff%fe",
            "/agent/samples%00",
            "/" + "a" * 5000,
        ]
    ),
    st.text(string.ascii_letters + string.digits + string.punctuation, max_size=40).map(
        "/".__add__
    ),
)


@settings(FUZZ, max_examples=200)
@given(
    method=methods,
    path=paths,
    body=st.binary(max_size=100),
    headers=st.lists(
        st.tuples(
            st.sampled_from(["Content-Type", "Upgrade", "Connection", "X-Slack-Signature", "Host"]),
            header_values,
        ),
        max_size=3,
    ),
)
def test_any_method_on_any_path_never_gets_a_server_error(
    front: Front, method: str, path: str, body: bytes, headers: list[tuple[str, str | bytes]]
) -> None:
    """404 for what is not a route, 4xx for what a route refuses; the probes answer 200."""
    since = len(front.log.records)
    status = front.send(method, path, headers, body)
    event(f"status {status}")  # the spread, in --hypothesis-show-statistics
    assert status < 500
    if method in ("GET", "HEAD") and path in PROBES and not headers:
        assert 200 == status
    assert [] == front.quiet(since)


def test_the_bot_still_answers_after_the_fuzzing(front: Front) -> None:
    """After all of the above, `/gpu help` gets its 200 and nothing logged a traceback."""
    user = "U0ALICE01"
    form = payloads.slash_command(
        user,
        "help",
        response_url=payloads.fresh_response_url(front.local, "C0GPU", user),
        trigger_id=payloads.fresh_trigger_id(front.local, user),
    )
    body = _form(form)
    headers = sign(body, SECRET)
    assert 200 == front.send("POST", "/slack/events", list(headers.items()), body)
    for probe in PROBES:
        assert 200 == front.send("GET", probe)
    assert [] == front.quiet(0)
