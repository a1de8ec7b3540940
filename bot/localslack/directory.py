"""The people and channels of the default local workspace; ids match rules/policies/org.yaml."""

from __future__ import annotations

from .model import Channel, User

BOT_USER, BOT_ID, APP_ID = "U0GPUBOT", "B0GPUBOT", "A0GPUBOT"
TEAM_ID, TEAM_NAME = "T0LOCAL", "gpubot local"

_ZONES = {
    "Europe/Berlin": ("Central European Time", 3600),
    "Europe/London": ("Greenwich Mean Time", 0),
    "America/New_York": ("Eastern Standard Time", -18000),
    "America/Los_Angeles": ("Pacific Standard Time", -28800),
    "Asia/Kolkata": ("India Standard Time", 19800),
    "Asia/Tokyo": ("Japan Standard Time", 32400),
}


def person(user_id: str, real_name: str, tz: str, *, is_admin: bool = False) -> User:
    """A user whose handle and email derive from the first name."""
    name = real_name.split(maxsplit=1)[0].lower()
    label, offset = _ZONES[tz]
    return User(
        id=user_id,
        name=name,
        real_name=real_name,
        tz=tz,
        tz_label=label,
        tz_offset=offset,
        is_admin=is_admin,
        email=f"{name}@example.com",
    )


def bot_user() -> User:
    return User(id=BOT_USER, name="gpubot", real_name="gpubot", tz="Europe/Berlin", is_bot=True)


def people() -> list[User]:
    """Ada the admin, the three team managers and their engineers."""
    return [
        bot_user(),
        person("U0ADMIN01", "Ada Admin", "Europe/Berlin", is_admin=True),
        person("U0VMGR001", "Victor Vision", "America/New_York"),
        person("U0ALICE01", "Alice Anders", "Europe/Berlin"),
        person("U0BOB0001", "Bob Brown", "Europe/London"),
        person("U0NMGR001", "Nadia Nair", "Asia/Kolkata"),
        person("U0CAROL01", "Carol Chen", "America/Los_Angeles"),
        person("U0DAVE001", "Dave Dias", "Europe/Berlin"),
        person("U0PMGR001", "Priya Patel", "Asia/Kolkata"),
        person("U0ERIN001", "Erin Ito", "Asia/Tokyo"),
    ]


def channels() -> list[Channel]:
    """#gpu for everyone and two private approvals channels; the bot is in all of them."""
    everyone = {user.id for user in people()}
    return [
        Channel(id="C0GPU", name="gpu", members=everyone),
        Channel(
            id="C0VAPPROV",
            name="vision-approvals",
            is_private=True,
            members={BOT_USER, "U0VMGR001", "U0ADMIN01"},
        ),
        Channel(
            id="C0NAPPROV",
            name="nlp-approvals",
            is_private=True,
            members={BOT_USER, "U0NMGR001", "U0ADMIN01"},
        ),
    ]
