"""`gpubot org lookup`: the Slack ids `org.yaml` needs, found through the bot token by email
(users.lookupByEmail) or by handle or name (users.list), with a snippet to paste."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer
import yaml
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from bot.cli.common import EXIT_FAILED, fail, read_settings

app = typer.Typer(help="Who is who in Slack, for org.yaml.", no_args_is_help=True)

EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# What each method needs, named when Slack answers missing_scope without saying.
SCOPE = {"users.lookupByEmail": "users:read.email", "users.list": "users:read"}
REFUSED_TOKEN = {"not_authed", "invalid_auth", "account_inactive", "token_revoked"}
PAGE = 200  # users.list's page size; Slack recommends no more than 200


@dataclass(frozen=True)
class Person:
    """One Slack account as org.yaml needs it."""

    id: str
    handle: str
    real_name: str
    tz: str
    email: str

    @property
    def name(self) -> str:
        """What `names:` in org.yaml shows for this person."""
        return self.real_name or self.handle or self.id


def person_of(user: dict[str, Any]) -> Person:
    profile = user.get("profile") or {}
    return Person(
        id=str(user.get("id", "")),
        handle=str(user.get("name") or ""),
        real_name=str(user.get("real_name") or profile.get("real_name") or ""),
        tz=str(user.get("tz") or ""),
        email=str(profile.get("email") or ""),
    )


@app.command("lookup")
def org_lookup(
    who: Annotated[
        list[str],
        typer.Argument(
            metavar="WHO",
            help="@handle, email or name (several may be given)",
            show_default=False,
        ),
    ],
) -> None:
    """Print each person's Slack id, handle, real name and time zone, and the lines to add to
    org.yaml, looked up through the bot token (SLACK_BOT_TOKEN, at SLACK_API_URL)."""
    settings = read_settings()
    if settings.slack_bot_token is None:
        fail(
            "SLACK_BOT_TOKEN is not set: the lookup asks Slack with the bot token "
            "(xoxb-…, under OAuth & Permissions in the app's settings)"
        )
    client = WebClient(
        token=settings.slack_bot_token.get_secret_value(),
        base_url=settings.slack_api_url,
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)],
    )
    directory = _Directory(client, settings.slack_api_url)
    found: list[Person] = []
    missing: list[str] = []
    for query in who:
        matches = directory.find(query)
        if not matches:
            missing.append(query)
        elif len(matches) > 1:
            typer.echo(f"{len(matches)} people match {query!r}; pick the one you mean:")
        people = [p for p in matches if p not in found]
        for person in people:
            typer.echo(describe(person))
        found.extend(people)
    if found:
        typer.echo(snippet(found))
    if missing:
        fail(f"no one in the Slack workspace matches {', '.join(map(repr, missing))}")


class _Directory:
    """The workspace's people, asked for once and only when a handle or name needs them."""

    def __init__(self, client: WebClient, api_url: str) -> None:
        self.client, self.api_url = client, api_url
        self._everyone: list[Person] | None = None

    def find(self, query: str) -> list[Person]:
        text = query.strip()
        if EMAIL.match(text):
            return self._by_email(text)
        return matching(text, self._all())

    def _by_email(self, email: str) -> list[Person]:
        try:
            answer = self.client.users_lookupByEmail(email=email)
        except SlackApiError as exc:
            if exc.response.get("error") == "users_not_found":
                return []
            self._failed("users.lookupByEmail", exc)
        except (SlackRequestError, OSError) as exc:
            self._unreachable(exc)
        return [person_of(answer["user"])]

    def _all(self) -> list[Person]:
        if self._everyone is None:
            try:
                self._everyone = [person_of(u) for u in self._pages() if _a_person(u)]
            except SlackApiError as exc:
                self._failed("users.list", exc)
            except (SlackRequestError, OSError) as exc:
                self._unreachable(exc)
        return self._everyone

    def _pages(self) -> Iterator[dict[str, Any]]:
        cursor = ""
        while True:
            answer = self.client.users_list(limit=PAGE, cursor=cursor or None)
            yield from answer.get("members") or []
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or ""
            if not cursor:
                return

    def _failed(self, method: str, exc: SlackApiError) -> NoReturn:
        error = str(exc.response.get("error") or "an error")
        if error == "missing_scope":
            needed = exc.response.get("needed") or SCOPE[method]
            fail(
                f"the bot token lacks the {needed} scope that {method} needs: add it under "
                "OAuth & Permissions in the app's settings (deploy/slack-app-manifest.yaml "
                "lists it), then reinstall the app to the workspace"
            )
        if error in REFUSED_TOKEN:
            fail(f"Slack refused the bot token ({error}); check SLACK_BOT_TOKEN")
        fail(f"Slack answered {error} to {method}", EXIT_FAILED)

    def _unreachable(self, exc: Exception) -> NoReturn:
        reason = getattr(exc, "reason", None) or exc
        fail(f"cannot reach Slack at {self.api_url}: {reason}")


def _a_person(user: dict[str, Any]) -> bool:
    """Deactivated accounts, bots and Slackbot are no one to put in org.yaml."""
    return not (user.get("deleted") or user.get("is_bot") or user.get("id") == "USLACKBOT")


def matching(query: str, people: Iterable[Person]) -> list[Person]:
    """`@handle` matches the handle exactly; a name matches a handle or real name exactly,
    else every real name that contains it (case does not matter)."""
    wanted = query.removeprefix("@").strip().casefold()
    people = list(people)
    if not wanted:
        return []
    if query.startswith("@"):
        return [p for p in people if p.handle.casefold() == wanted]
    exact = [p for p in people if wanted in (p.handle.casefold(), p.real_name.casefold())]
    return exact or [p for p in people if wanted in p.real_name.casefold()]


def describe(person: Person) -> str:
    lines = [
        person.name,
        f"  id         {person.id}",
        f"  handle     @{person.handle}",
        f"  real name  {person.real_name or '(none set)'}",
        f"  time zone  {person.tz or '(none set)'}",
    ]
    if person.email:
        lines.append(f"  email      {person.email}")
    return "\n".join(lines) + "\n"


def snippet(people: list[Person]) -> str:
    """The lines org.yaml needs for these people: `names` as it is, the rest to complete."""
    ids = ", ".join(p.id for p in people)
    names = yaml.safe_dump(
        {"names": {p.id: p.name for p in people}}, allow_unicode=True, sort_keys=False
    )
    handles = [p.handle for p in people]
    accounts = "".join(_account_line(p, handles) for p in people)
    return (
        "For org.yaml (put each id in the team and the role that fit):\n"
        f"{names}"
        "teams:\n"
        "  TEAM:\n"
        f"    members: [{ids}]    # managers: [...] approve the team's requests\n"
        f"accounts:\n{accounts}"
        f"# an admin also goes in admins: [{ids}]"
    )


def _account_line(person: Person, handles: list[str]) -> str:
    """The handle as a first guess at the Unix login; a line to complete (commented out, so
    the snippet stays valid YAML) when it has none or another person found shares it."""
    unique = person.handle and handles.count(person.handle) == 1
    login = f"  {person.handle}" if unique else "  # LOGIN"
    return f"{login}: {person.id}    # the Unix login of their jobs on the GPU nodes\n"
