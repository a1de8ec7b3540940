"""The two-step file upload that WebClient.files_upload_v2 performs."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from slack_sdk import WebClient

from bot.localslack import LocalSlack


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
