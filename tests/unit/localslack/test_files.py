"""The two-step file upload that WebClient.files_upload_v2 performs."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from slack_sdk import WebClient

from bot.localslack import BOT_TOKEN, LocalSlack


def test_files_upload_v2_shares_the_file_in_the_channel(
    client: WebClient, local: LocalSlack
) -> None:
    """URL, raw upload, completion: the bytes arrive and the channel shows the file."""
    answer = client.files_upload_v2(
        channel="C0GPU",
        content="node,gpu,util\nn1,0,97\n",
        filename="usage.csv",
        title="GPU usage",
        initial_comment="Weekly usage",
    )
    file_id = answer["file"]["id"]
    stored = local.workspace.files[file_id]
    assert (b"node,gpu,util\nn1,0,97\n", "GPU usage", "C0GPU") == (
        stored.content,
        stored.title,
        stored.channel,
    )
    message = local.last_message("C0GPU")
    assert message is not None
    assert ("Weekly usage", [file_id]) == (message.text, message.files)
    assert ["files.getUploadURLExternal", "upload", "files.completeUploadExternal"] == [
        call.method for call in local.calls
    ]
    assert [] == local.violations


def test_an_upload_to_an_unknown_file_is_404(local: LocalSlack) -> None:
    """Only URLs handed out by files.getUploadURLExternal take bytes."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = local.base_url + "upload/F0NOPE"
    request = urllib.request.Request(url, data=b"x", method="POST")  # noqa: S310  (loopback)
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=5)
    refused.value.close()
    assert 404 == refused.value.code


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24


def _get(url: str, token: str | None = None) -> tuple[int, bytes, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310  (loopback)
    try:
        with opener.open(request, timeout=5) as answer:
            return answer.status, answer.read(), answer.headers["Content-Type"]
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code, b"", ""


def test_a_shared_file_is_in_the_history_and_served_at_its_url_private(
    client: WebClient, local: LocalSlack
) -> None:
    """The message shows the whole file object, as Slack's does; its url_private answers the
    bytes to the bot token and nothing to anyone else."""
    answer = client.files_upload_v2(
        channel="C0GPU", file=PNG, filename="chart.png", title="Chart", initial_comment="Here"
    )
    shared = answer["file"]
    assert ("chart.png", "image/png", "png", len(PNG)) == (
        shared["name"],
        shared["mimetype"],
        shared["filetype"],
        shared["size"],
    )
    history = client.conversations_history(channel="C0GPU")
    (message,) = history["messages"]
    assert [shared] == message["files"]
    assert (200, PNG, "image/png") == _get(shared["url_private"], BOT_TOKEN)
    assert 403 == _get(shared["url_private"])[0]
    assert 404 == _get(local.base_url + "files/F0NOPE/chart.png", BOT_TOKEN)[0]
