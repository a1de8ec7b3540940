"""`/gpu status` for admins: the GPUs used without a lease (or by someone else) are named up
to a limit, and the rest are counted, so that the section stays within what Slack shows."""

from __future__ import annotations

import pytest

from bot.slack.blocks.overview import SHOWN_GPUS, named_gpus


@pytest.mark.parametrize(
    ("found", "more"),
    [(1, None), (SHOWN_GPUS, None), (SHOWN_GPUS + 1, "…and 1 more"), (5000, "…and 4980 more")],
)
def test_the_first_gpus_are_named_and_the_rest_counted(found: int, more: str | None) -> None:
    """Every GPU named up to the limit, then one line saying how many more there are."""
    names = [f"a100-node-{k:04d}:0 by dave" for k in range(found)]
    text = named_gpus("*In use without a lease*", names)["text"]["text"]
    lines = text.splitlines()
    assert "*In use without a lease*:" == lines[0]
    named = [line for line in lines if line.startswith("• ")]
    assert [f"• `{name}`" for name in names[:SHOWN_GPUS]] == named
    assert ([more] if more else []) == lines[1 + len(named) :]
    assert len(text) <= 3000  # a section's text
