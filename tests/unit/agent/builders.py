"""Builders for the agent tests: child processes to enforce on.

Run as root, the children run as an unprivileged uid (31337, no passwd entry), as a
researcher's job would; run as anyone else, they run as that user."""

from __future__ import annotations

import os
import subprocess

from bot.agent.enforcer import MIN_UID

AS_ROOT = os.geteuid() == 0
CHILD_UID = 31337 if AS_ROOT else os.getuid()
# Not root, the children run as whoever runs the tests; let the agent signal that uid.
AGENT_MIN_UID = MIN_UID if AS_ROOT else min(MIN_UID, os.getuid())


def spawn(
    children: list[subprocess.Popen[bytes]], argv: list[str], *, uid: int | None = None
) -> subprocess.Popen[bytes]:
    """A child running `argv` as `uid` (default CHILD_UID), kept in `children` to be reaped."""
    uid = CHILD_UID if uid is None else uid
    as_user = uid if uid != os.getuid() else None
    # Fixed arguments: coreutils' sleep, or sh running a fixed script.
    child = subprocess.Popen(argv, user=as_user, stdout=subprocess.PIPE)  # noqa: S603
    children.append(child)
    return child


def sleeper(
    children: list[subprocess.Popen[bytes]], *, uid: int | None = None
) -> subprocess.Popen[bytes]:
    return spawn(children, ["sleep", "60"], uid=uid)
