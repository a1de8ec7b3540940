"""`gpubot org lookup`: the Slack ids org.yaml needs, asked of the local Slack API with the
bot token, by email (users.lookupByEmail) or by handle or name (users.list, page by page)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bot.localslack.directory import people, person
from bot.localslack.server import BOT_TOKEN, LocalSlack
from bot.services.rule_files import read_rules_dir
from rules.loader import load_policy
from tests.builders import POLICIES
from tests.unit.bot.cli.builders import gpubot


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalSlack]:
    """The local Slack API, and the bot token and API URL a deployment would set."""
    with LocalSlack() as server:
        monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
        monkeypatch.setenv("SLACK_API_URL", server.api_url)
        yield server


def test_lookup_by_email_prints_the_ids_and_a_snippet_for_org_yaml(local: LocalSlack) -> None:
    """alice@example.com: id, handle, real name, zone, and `names` to paste; one call."""
    result = gpubot("org", "lookup", "alice@example.com")
    assert 0 == result.exit_code, result.output
    assert result.stdout.startswith(
        "Alice Anders\n"
        "  id         U0ALICE01\n"
        "  handle     @alice\n"
        "  real name  Alice Anders\n"
        "  time zone  Europe/Berlin\n"
        "  email      alice@example.com\n"
    )
    assert "names:\n  U0ALICE01: Alice Anders\n" in result.stdout
    assert "    members: [U0ALICE01]" in result.stdout
    assert "  alice: U0ALICE01" in result.stdout
    assert [{"email": "alice@example.com"}] == [
        {k: v for k, v in c.args.items() if k != "team_id"}
        for c in local.calls.of("users.lookupByEmail")
    ]
    assert [] == local.calls.of("users.list")


def test_the_snippet_is_yaml_that_the_rules_accept(local: LocalSlack, tmp_path: Path) -> None:
    """Pasted as it is (TEAM named), the snippet loads as a policy file."""
    result = gpubot("org", "lookup", "@victor", "bob@example.com")
    assert 0 == result.exit_code, result.output
    pasted = result.stdout.split("put each id in the team and the role that fit):\n", 1)[1]
    parsed = yaml.safe_load(pasted.replace("TEAM", "robotics"))
    assert {"U0VMGR001": "Victor Vision", "U0BOB0001": "Bob Brown"} == parsed["names"]
    assert ["U0VMGR001", "U0BOB0001"] == parsed["teams"]["robotics"]["members"]
    assert {"victor": "U0VMGR001", "bob": "U0BOB0001"} == parsed["accounts"]


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("@victor", "U0VMGR001"),
        ("Bob Brown", "U0BOB0001"),
        ("carol", "U0CAROL01"),
        ("nair", "U0NMGR001"),
        ("ERIN ITO", "U0ERIN001"),
    ],
)
def test_lookup_by_handle_or_name_pages_through_users_list(
    local: LocalSlack, query: str, found: str
) -> None:
    """A handle matches exactly; a name exactly or as part of a real name; every page read."""
    for n in range(250):  # the workspace's people come after these: the second page
        local.workspace.add_user(person(f"U0AAA{n:04d}", f"Extra Person{n}", "Europe/London"))
    result = gpubot("org", "lookup", query)
    assert 0 == result.exit_code, result.output
    assert f"  id         {found}\n" in result.stdout
    assert 1 == result.stdout.count("  id ")
    pages = local.calls.of("users.list")
    assert [None, "user:U0AAA0200"] == [c.args.get("cursor") for c in pages]


def test_a_name_several_people_share_lists_them_all(local: LocalSlack) -> None:
    """Two people named Sam: both are printed, and their shared handle is no login guess."""
    local.workspace.add_user(person("U0SAM0001", "Sam Stone", "Europe/London"))
    local.workspace.add_user(person("U0SAM0002", "Sam Smith", "Asia/Tokyo"))
    result = gpubot("org", "lookup", "sam")
    assert 0 == result.exit_code, result.output
    assert result.stdout.startswith("2 people match 'sam'; pick the one you mean:\n")
    assert ["U0SAM0001", "U0SAM0002"] == [
        line.split()[-1] for line in result.stdout.splitlines() if line.startswith("  id ")
    ]
    assert "  # LOGIN: U0SAM0001    #" in result.stdout
    pasted = result.stdout.split("the role that fit):\n", 1)[1]
    assert {"U0SAM0001": "Sam Stone", "U0SAM0002": "Sam Smith"} == yaml.safe_load(pasted)["names"]


def test_the_bot_and_deactivated_people_are_not_found(local: LocalSlack) -> None:
    """gpubot itself is no one to put in org.yaml."""
    result = gpubot("org", "lookup", "@gpubot")
    assert 2 == result.exit_code
    assert "error: no one in the Slack workspace matches '@gpubot'\n" == result.stderr


def test_someone_not_found_is_named_and_the_others_still_printed(local: LocalSlack) -> None:
    """One found, one unknown email: the found one is printed, then one error line; exit 2."""
    result = gpubot("org", "lookup", "@alice", "zed@example.com")
    assert 2 == result.exit_code
    assert "  id         U0ALICE01\n" in result.stdout
    assert "error: no one in the Slack workspace matches 'zed@example.com'\n" == result.stderr


def test_without_a_bot_token_it_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SLACK_BOT_TOKEN: one line naming it; nothing is asked."""
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    result = gpubot("org", "lookup", "@alice")
    assert 2 == result.exit_code
    assert result.stderr.startswith("error: SLACK_BOT_TOKEN is not set")
    assert 1 == len(result.stderr.splitlines())


def test_a_token_without_users_read_email_says_which_scope_to_add(local: LocalSlack) -> None:
    """Slack's missing_scope: the scope named, and where to add it."""
    local.faults.add("users.lookupByEmail", status=400, error="missing_scope")
    result = gpubot("org", "lookup", "alice@example.com")
    assert 2 == result.exit_code
    assert result.stderr.startswith(
        "error: the bot token lacks the users:read.email scope that users.lookupByEmail needs"
    )
    assert "reinstall the app" in result.stderr


def test_a_refused_token_is_said_in_one_line(
    local: LocalSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token the workspace does not know: invalid_auth, one line."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-not-this-one")
    result = gpubot("org", "lookup", "@alice")
    assert 2 == result.exit_code
    assert (
        "error: Slack refused the bot token (invalid_auth); check SLACK_BOT_TOKEN\n"
        == result.stderr
    )


def test_slack_out_of_reach_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at SLACK_API_URL: one line naming it, no traceback."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("SLACK_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("SLACK_API_URL", f"http://127.0.0.1:{port}/api/")
    result = gpubot("org", "lookup", "@alice")
    assert 2 == result.exit_code
    assert result.stderr.startswith(f"error: cannot reach Slack at http://127.0.0.1:{port}/api/: ")
    assert 1 == len(result.stderr.splitlines())


def test_the_shipped_names_are_the_demo_workspaces_people() -> None:
    """org.yaml's `names` match the local workspace, so the CLI and the page agree."""
    names = load_policy(read_rules_dir(POLICIES)).names
    expected = {u.id: u.real_name for u in people() if not u.is_bot}
    assert expected == dict(names)
