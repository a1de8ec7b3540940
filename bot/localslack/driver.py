"""`SlackDriver`: a person using Slack. It types commands, clicks buttons, submits modals and
opens the Home tab, and shows the app's immediate answers the way Slack would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

from .elements import action_payload
from .limits import check_blocks, check_view
from .model import JSON, Ephemeral, Message
from .payloads import Source, app_home_opened, block_actions, slash_command, view_submission
from .server import LocalSlack
from .signing import FORM, JSON_CONTENT, sign
from .transports import Inbound, Kind, Outcome, Transport

Forge = Literal["signature", "timestamp"]  # a wrong signature, or one over a 10-minute-old stamp
SIGNING_SECRET = "local-signing-secret"  # noqa: S105  (the local workspace's, never real)


@dataclass(frozen=True)
class Reply:
    """The app's immediate answer (status 0: none) and what Slack showed of it, if anything."""

    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    shown: Message | Ephemeral | None = None
    response_url: str | None = None  # where the app may answer later (its token ends it)

    @property
    def json(self) -> JSON:
        """The body as JSON ({} when empty or plain text)."""
        try:
            parsed = json.loads(self.body) if self.body.lstrip().startswith("{") else {}
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    @property
    def text(self) -> str | None:
        """An ack's text: `ack("…")` answers plain text, `ack(text=…, blocks=…)` JSON."""
        if self.json:
            return self.json.get("text")
        return self.body or None

    @property
    def blocks(self) -> list[JSON] | None:
        return self.json.get("blocks")

    @property
    def response_action(self) -> str | None:
        return self.json.get("response_action")

    @property
    def errors(self) -> dict[str, str]:
        return dict(self.json.get("errors") or {})


class SlackDriver:
    """Acts in `local` as any person; requests reach the app through `transport`."""

    def __init__(
        self, local: LocalSlack, transport: Transport, signing_secret: str = SIGNING_SECRET
    ) -> None:
        self.local, self.transport, self.signing_secret = local, transport, signing_secret

    def command(
        self,
        user: str,
        text: str,
        channel: str = "C0GPU",
        command: str = "/gpu",
        *,
        forge: Forge | None = None,
    ) -> Reply:
        """Type `/gpu text`; the ack shows as an ephemeral (or, in_channel, as a message)."""
        ws = self.local.workspace
        where = ws.channel(channel)
        channel_id = where.id if where else channel
        token = ws.tokens.issue_response_url(channel_id, user)
        form = slash_command(
            user,
            text,
            channel_id,
            command,
            response_url=self.local.response_url(token),
            trigger_id=ws.tokens.issue_trigger(user),
            user_name=self._name(user),
            channel_name=where.name if where and not where.is_im else None,
        )
        outcome = self._deliver("command", form, urlencode(form).encode(), FORM, forge)
        url = self.local.response_url(token)
        reply = Reply(outcome.status, outcome.body, outcome.headers, response_url=url)
        if outcome.status != 200 or not (reply.text or reply.blocks):
            return reply
        if reply.blocks is not None:
            self._check("command ack", check_blocks(reply.blocks))
        if reply.json.get("response_type") == "in_channel":
            ws.post(channel_id, f"{command} {text}".strip(), user=user)
            shown: Message | Ephemeral = ws.post(channel_id, reply.text or "", reply.blocks)
        else:
            shown = ws.post_ephemeral(channel_id, user, reply.text or "", reply.blocks)
            ws.tokens.note_response(token, shown.ts)
        return Reply(reply.status, reply.body, reply.headers, shown, url)

    def click(
        self,
        user: str,
        source: Source,
        action_id: str,
        value: Any = None,
        *,
        block_id: str | None = None,
        forge: Forge | None = None,
    ) -> Reply:
        """Use the element `action_id` (in block `block_id`, when the id repeats) on a message,
        ephemeral or view, as it is now."""
        ws = self.local.workspace
        current = self._current(source)
        if isinstance(current, Message | Ephemeral):
            blocks = current.blocks
            token = ws.tokens.issue_response_url(
                current.channel, user, current.ts, ephemeral=isinstance(current, Ephemeral)
            )
            response_url: str | None = self.local.response_url(token)
        else:
            blocks, response_url = current.get("blocks", []), None
        payload = block_actions(
            user,
            action_payload(blocks, action_id, value, block_id),
            current,
            trigger_id=ws.tokens.issue_trigger(user),
            response_url=response_url,
            user_name=self._name(user),
        )
        return self._interact(payload, forge)

    def submit(
        self,
        user: str,
        view: JSON,
        values: Mapping[str, Any] | None = None,
        *,
        forge: Forge | None = None,
    ) -> Reply:
        """Submit a modal with `values` by action_id; apply the app's response_action."""
        ws = self.local.workspace
        current = self._current(view)
        assert isinstance(current, dict)
        payload = view_submission(
            user,
            current,
            values or {},
            trigger_id=ws.tokens.issue_trigger(user),
            user_name=self._name(user),
        )
        reply = self._interact(payload, forge)
        if reply.status != 200:
            return reply
        action, new_view = reply.response_action, reply.json.get("view")
        if action in ("update", "push") and isinstance(new_view, dict):
            self._check(f"response_action {action}", check_view(new_view))
            if action == "update":
                ws.views.update(current["id"], new_view)
            else:
                ws.views.push_modal(user, new_view)
        elif action == "clear":
            ws.views.clear(user)
        elif action is None:
            ws.views.close(current["id"])
        return reply

    def open_home(self, user: str, *, forge: Forge | None = None) -> Reply:
        """Open the app's Home tab (an app_home_opened event)."""
        ws = self.local.workspace
        channel = ws.dm_channel(user)
        return self.event(
            app_home_opened(user, channel=channel, view=ws.views.home(user)), forge=forge
        )

    def event(self, payload: JSON, *, forge: Forge | None = None) -> Reply:
        """Deliver an Events API payload (an event_callback or url_verification) as JSON."""
        outcome = self._deliver("event", payload, json.dumps(payload).encode(), JSON_CONTENT, forge)
        return Reply(outcome.status, outcome.body, outcome.headers)

    def _interact(self, payload: JSON, forge: Forge | None) -> Reply:
        body = urlencode({"payload": json.dumps(payload)}).encode()
        outcome = self._deliver("interactive", payload, body, FORM, forge)
        return Reply(outcome.status, outcome.body, outcome.headers)

    def _deliver(
        self, kind: Kind, payload: JSON, body: bytes, content_type: str, forge: Forge | None
    ) -> Outcome:
        secret, stamp = self.signing_secret, int(time.time())
        if forge == "signature":
            secret += "-forged"
        elif forge == "timestamp":
            stamp -= 600
        headers = sign(body, secret, stamp, content_type=content_type)
        return self.transport.deliver(Inbound(kind, payload, body, headers))

    def _current(self, source: Source) -> Message | Ephemeral | JSON:
        """What the person sees now of `source`; LookupError if it is gone."""
        ws = self.local.workspace
        if isinstance(source, Message):
            found: Message | Ephemeral | JSON | None = ws.message(source.channel, source.ts)
        elif isinstance(source, Ephemeral):
            found = ws.ephemeral(source.ts)
        else:
            found = ws.views.get(source["id"])
        if found is None:
            raise LookupError(f"{source!r} is no longer in the workspace")
        return found

    def _name(self, user: str) -> str:
        person = self.local.workspace.user(user)
        return person.name if person else user

    def _check(self, where: str, problems: list[str]) -> None:
        if problems:
            self.local.api.violate(f"{where}: invalid_blocks: {'; '.join(problems)}")
