"""Buttons as Block Kit draws them: a danger button's confirmation dialog is a danger one too."""

from __future__ import annotations

from bot.slack.blocks.kit import button


def test_a_danger_buttons_confirm_dialog_has_a_red_confirm_button() -> None:
    release = button("Release", "lease_release", "7", style="danger", confirm=("T", "Q?", "Go"))
    assert "danger" == release["confirm"]["style"]


def test_other_confirm_dialogs_keep_slacks_default_style() -> None:
    extend = button("Extend", "lease_extend", "7", style="primary", confirm=("T", "Q?", "Go"))
    assert "style" not in extend["confirm"]
    assert "confirm" not in button("Mine", "mine", "1")
