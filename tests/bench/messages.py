"""How many messages the README tour costs people's attention: the demo (the real bot over HTTP,
the local Slack API, the simulated fleet) plays the tour and runs on for its demo hours, then
the messages are counted per person (their DM with the bot) and per channel: top-level messages,
thread replies (broadcast ones also counted apart), edits in place and "only visible to you".

    python -m tests.bench.messages [--hours 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.localslack import LocalSlack
from bot.workspace.demo import Demo, start

ALICE, BOB, VICTOR, ADA = "U0ALICE01", "U0BOB0001", "U0VMGR001", "U0ADMIN01"
GPU, VISION_APPROVALS = "C0GPU", "C0VAPPROV"


def _wait(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"the tour waited in vain for {what}")


def _newest(local: LocalSlack, channel: str, contains: str) -> Any:
    """The newest message (replies included) in `channel` whose text or blocks say `contains`."""
    for message in reversed(local.messages(channel)):
        if contains in message.text + str(message.blocks):
            return message
    return None


def _settle(demo: Demo) -> None:
    demo.bot.inbox.wait_idle()
    demo.bot.deliverer.idle()
    demo.deliver()


def tour(demo: Demo, hours: int) -> None:
    """The README's tour: borrow over quota, Bob's refused and Victor's accepted Approve, an
    hour on, Extend 2h and Victor's approval of it, then the rest of the demo hours."""
    local, slack = demo.local, demo.slack
    slack.command(ALICE, "borrow 4 a100 for 2h because ablations", channel=GPU)
    card = _wait(lambda: _newest(local, VISION_APPROVALS, "request_approve"), "the card")
    slack.click(BOB, card, "request_approve")
    slack.click(VICTOR, card, "request_approve")
    _settle(demo)
    dm = local.dm_channel(ALICE)
    _wait(lambda: _newest(local, dm, "CUDA_VISIBLE_DEVICES"), "the grant DM")
    demo.forward(timedelta(hours=1))
    _settle(demo)
    warning = _wait(lambda: _newest(local, dm, "ends soon"), "the expiry warning")
    slack.click(ALICE, warning, "lease_extend")
    _settle(demo)
    extension = _wait(lambda: _newest(local, VISION_APPROVALS, "Extension"), "the extension")
    slack.click(VICTOR, extension, "request_approve")
    _settle(demo)
    for command in ("mine", "status", "why L8", "audit L8"):
        slack.command(ALICE, command, channel=GPU)
    slack.command(ADA, "status", channel=GPU)
    for _ in range(hours - 1):
        demo.forward(timedelta(hours=1))
    time.sleep(0.5)
    _settle(demo)


def count(demo: Demo) -> list[tuple[str, Counter[str]]]:
    """Per conversation (a person's DM, or a channel): the bot's messages by kind."""
    local, ws = demo.local, demo.local.workspace
    rows: list[tuple[str, Counter[str]]] = []
    updates = Counter(
        (str(c.args.get("channel")), str(c.args.get("ts")))
        for c in local.calls.of("chat.update")
        if not c.faulted
    )
    for channel in sorted(ws.channels.values(), key=lambda c: (c.is_im, c.id)):
        counted: Counter[str] = Counter()
        for message in ws.messages(channel.id):
            if message.bot_id is None:
                continue
            reply = message.thread_ts is not None and message.thread_ts != message.ts
            counted["replies" if reply else "top-level"] += 1
            if reply and getattr(message, "reply_broadcast", False):
                counted["broadcast"] += 1
            counted["edits"] += updates[(channel.id, message.ts)]
        counted["only-you"] = len(ws.ephemerals(channel=channel.id))
        if sum(counted.values()):
            user = ws.user(channel.im_user) if channel.im_user else None
            name = f"DM {user.real_name}" if user else f"#{channel.name}"
            rows.append((name, counted))
    return rows


def table(rows: list[tuple[str, Counter[str]]]) -> str:
    columns = ("top-level", "replies", "broadcast", "edits", "only-you")
    lines = [f"| conversation | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    total: Counter[str] = Counter()
    for name, counted in rows:
        total.update(counted)
        lines.append(f"| {name} | {' | '.join(str(counted[c]) for c in columns)} |")
    lines.append(f"| **all** | {' | '.join(str(total[c]) for c in columns)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=5, help="demo hours the tour runs (5)")
    hours = parser.parse_args().hours
    with tempfile.TemporaryDirectory(prefix="gpubot-messages-") as data:
        demo = start(Path(data))
        try:
            tour(demo, hours)
            print(f"Messages from the bot over the README tour and {hours} demo hours:\n")
            print(table(count(demo)))
        finally:
            demo.close()


if __name__ == "__main__":
    main()
