"""The Web API front door: body parsing, faults, token checks, dispatch to a method, recording.

Every answer is HTTP 200 `{"ok": ...}` unless a fault replaces it, as with Slack.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from .calls import Call, CallLog
from .faults import Faults
from .model import JSON
from .workspace import Workspace

APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
JSON_STRING_FIELDS = ("blocks", "view", "files", "attachments", "metadata")
SCOPES = (
    "commands,chat:write,chat:write.public,im:write,im:history,channels:history,groups:history,"
    "users:read,users:read.email,files:write,channels:read,groups:read,im:read,mpim:read"
)


class ApiError(Exception):
    """A Slack error answer; `violation` marks a contract breach the tests should hear about."""

    def __init__(self, error: str, violation: str | None = None, **extra: Any) -> None:
        super().__init__(error)
        self.error, self.violation, self.extra = error, violation, extra


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(
        cls, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Answer:
        content = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        return cls(status, json.dumps(body).encode(), content)

    @classmethod
    def text(cls, status: int, body: str) -> Answer:
        return cls(status, body.encode(), {"Content-Type": "text/plain; charset=utf-8"})


class Args(dict[str, Any]):
    """A method's arguments with Slack's ways of spelling them (form strings, JSON strings)."""

    def required(self, name: str) -> Any:
        if self.get(name) in (None, ""):
            message = f"[ERROR] missing required field: {name}"
            raise ApiError("invalid_arguments", response_metadata={"messages": [message]})
        return self[name]

    def flag(self, name: str) -> bool:
        value = self.get(name)
        return value is True or str(value).lower() in ("1", "true")


@dataclass
class Context:
    """What a method implementation may use besides its arguments."""

    workspace: Workspace
    base_url: str  # http://127.0.0.1:PORT/


Method = Callable[[Context, Args], JSON]


def parse_args(content_type: str, raw: bytes, query: str) -> Args:
    """JSON or form body plus query string; JSON-string form fields (`blocks`, `view`…) decoded."""
    args = Args(parse_qsl(query, keep_blank_values=True))
    if raw and content_type.startswith("application/json"):
        args.update(json.loads(raw))
    elif raw:
        args.update(parse_qsl(raw.decode(), keep_blank_values=True))
    for name in JSON_STRING_FIELDS:
        if isinstance(args.get(name), str) and args[name][:1] in ("[", "{"):
            args[name] = json.loads(args[name])
    return args


class WebApi:
    """Answers `POST /api/<method>` against one workspace."""

    def __init__(
        self,
        workspace: Workspace,
        methods: Mapping[str, Method],
        *,
        bot_token: str,
        app_token: str,
        calls: CallLog,
        faults: Faults,
        stopping: threading.Event,
    ) -> None:
        self.workspace, self.methods = workspace, methods
        self.bot_token, self.app_token = bot_token, app_token
        self.calls, self.faults, self.stopping = calls, faults, stopping
        self.violations: list[str] = []
        self.base_url = ""

    def violate(self, problem: str) -> None:
        with self.workspace.lock:
            self.violations.append(problem)

    def handle(self, method: str, headers: Mapping[str, str], raw: bytes, query: str) -> Answer:
        headers = {name.lower(): value for name, value in headers.items()}
        try:
            args = parse_args(headers.get("content-type", ""), raw, query)
        except (ValueError, TypeError):  # bad JSON, bad UTF-8, a JSON body that is no object
            error = {"ok": False, "error": "invalid_json"}
            return self._finish(method, Args(), headers, status=200, body=error)
        fault = self.faults.take(method)
        if fault is not None:
            self.stopping.wait(fault.delay)
            if fault.replaces_answer:
                status, body, extra = fault.answer()
                return self._finish(
                    method, args, headers, status=status, body=body, extra=extra, faulted=True
                )
        with self.workspace.lock:
            body, extra = self._answer(method, args, headers)
        return self._finish(method, args, headers, status=200, body=body, extra=extra)

    def _answer(
        self, method: str, args: Args, headers: Mapping[str, str]
    ) -> tuple[JSON, dict[str, str]]:
        auth = headers.get("authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth else str(args.pop("token", ""))
        args.pop("token", None)
        expected = self.app_token if method in APP_TOKEN_METHODS else self.bot_token
        if not token:
            return {"ok": False, "error": "not_authed"}, {}
        if token in (self.app_token, self.bot_token) and token != expected:
            return {"ok": False, "error": "not_allowed_token_type"}, {}
        if token != expected:
            return {"ok": False, "error": "invalid_auth"}, {}
        implementation = self.methods.get(method)
        if implementation is None:
            self.violate(f"{method}: unknown method")
            return {"ok": False, "error": "unknown_method"}, {}
        context = Context(self.workspace, self.base_url)
        try:
            body = {"ok": True, **implementation(context, args)}
        except ApiError as problem:
            if problem.violation:
                self.violate(problem.violation)
            body = {"ok": False, "error": problem.error, **problem.extra}
        scopes = {"x-oauth-scopes": SCOPES} if method == "auth.test" else {}
        return body, scopes

    def _finish(
        self,
        method: str,
        args: Args,
        headers: dict[str, str],
        *,
        status: int,
        body: JSON,
        extra: Mapping[str, str] | None = None,
        faulted: bool = False,
    ) -> Answer:
        at = self.workspace.now()
        self.calls.record(Call(method, dict(args), headers, at, faulted, status, body))
        return Answer.json(status, body, extra)
