"""Files the bot shares, as people see them: a chart drawn in the conversation, a CSV as a chip
with its name, size and a download link."""

from __future__ import annotations

import re
import struct
import zlib
from datetime import UTC

from playwright.sync_api import expect
from slack_sdk import WebClient

from bot.localslack import BOT_TOKEN
from rules.reports import Scope, ScopeKind, parse_window
from tests.browser.workspace import ADA, ALICE, GPU, SlackPage


def a_png(width: int, height: int) -> bytes:
    """A valid PNG of grey pixels, built by hand."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_a_report_chart_from_the_bot_is_drawn_full_size_on_click(slack: SlackPage) -> None:
    """Ada's lab chart, shared by the bot through the outbox and the upload steps, loads in
    the page (its natural width is the PNG's 1000 px), at most 520 px wide, and opens in a
    new tab."""
    services = slack.demo.bot.services
    window = parse_window("7d", services.now(), UTC)
    lab = Scope(ScopeKind.LAB)
    assert services.report_file(ADA, lab, window, fmt="png", channel=GPU, asked="7d") is None
    slack.demo.bot.deliverer.deliver_due()
    slack.open(ADA, GPU)
    image = slack.message("the chart Ada Admin asked for").locator(".file-image img")
    expect(image).to_be_visible()
    assert 1000 == image.evaluate("img => img.complete && img.naturalWidth")
    assert image.evaluate("img => img.getBoundingClientRect().width") <= 520
    link = slack.page.locator(".file-image")
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("href", re.compile(r"^/files/F\w+/gpubot-report-lab-7d\.png$"))


def test_a_shared_csv_is_a_chip_with_its_name_size_and_a_download(slack: SlackPage) -> None:
    """Any file that is not an image: its title, size and name, and a link that downloads it."""
    client = WebClient(token=BOT_TOKEN, base_url=slack.demo.local.api_url)
    client.files_upload_v2(
        channel=GPU,
        content="kind,key,allocated_gpu_h\nday,2026-11-30,12.5\n",
        filename="report.csv",
        title="GPU use (CSV)",
        initial_comment="The figures as CSV",
    )
    slack.open(ALICE, GPU)
    chip = slack.message("The figures as CSV").locator(".file-chip")
    expect(chip).to_contain_text("GPU use (CSV)")
    expect(chip).to_contain_text("45 B · report.csv")
    with slack.page.expect_download() as download:
        chip.get_by_role("link", name="Download").click()
    assert "report.csv" == download.value.suggested_filename


def test_a_png_anyone_shares_is_drawn_too(slack: SlackPage) -> None:
    """A hand-made 2x1 PNG: drawn at its own size."""
    client = WebClient(token=BOT_TOKEN, base_url=slack.demo.local.api_url)
    client.files_upload_v2(channel=GPU, file=a_png(2, 1), filename="dot.png", title="A dot")
    slack.open(ALICE, GPU)
    image = slack.page.locator(".file-image img")
    expect(image).to_be_visible()
    assert 2 == image.evaluate("img => img.complete && img.naturalWidth")
