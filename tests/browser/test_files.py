"""Files the bot shares, as people see them: a chart drawn in the conversation, a CSV as a chip
with its name, size and a download link."""

from __future__ import annotations

import struct
import zlib

from playwright.sync_api import expect
from slack_sdk import WebClient

from bot.localslack import BOT_TOKEN
from tests.browser.workspace import ALICE, GPU, SlackPage


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


def test_a_shared_chart_is_drawn_and_a_csv_is_a_download(slack: SlackPage) -> None:
    """The image loads from the page (its natural width is the PNG's), at most 520 px wide,
    and opens full size in a new tab; the CSV shows its name and size and downloads."""
    client = WebClient(token=BOT_TOKEN, base_url=slack.demo.local.api_url)
    client.files_upload_v2(
        channel=GPU, file=a_png(1000, 500), filename="chart.png", title="GPU use, last 7 days"
    )
    client.files_upload_v2(
        channel=GPU,
        content="kind,key,allocated_gpu_h\nday,2026-11-30,12.5\n",
        filename="report.csv",
        title="GPU use (CSV)",
        initial_comment="The figures as CSV",
    )
    slack.open(ALICE, GPU)
    image = slack.page.locator(".file-image img")
    expect(image).to_be_visible()
    assert 1000 == image.evaluate("img => img.complete && img.naturalWidth")
    assert image.evaluate("img => img.getBoundingClientRect().width") <= 520
    link = slack.page.locator(".file-image")
    expect(link).to_have_attribute("target", "_blank")
    chip = slack.message("The figures as CSV").locator(".file-chip")
    expect(chip).to_contain_text("GPU use (CSV)")
    expect(chip).to_contain_text("report.csv")
    expect(chip).to_contain_text("45 B")
    with slack.page.expect_download() as download:
        chip.get_by_role("link", name="Download").click()
    assert "report.csv" == download.value.suggested_filename
