"""auth.test, api.test, users.*, the two-step file upload and apps.connections.open."""

from __future__ import annotations

from .api import ApiError, Args, Context, Method
from .api_chat import joined_channel
from .model import JSON


def auth_test(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    return {
        "url": "https://gpubot-local.slack.com/",
        "team": ws.team_name,
        "user": "gpubot",
        "team_id": ws.team_id,
        "user_id": ws.bot_user,
        "bot_id": ws.bot_id,
        "is_enterprise_install": False,
    }


def api_test(ctx: Context, args: Args) -> JSON:
    """Echoes its arguments; `error=x` answers error x, as Slack's api.test does."""
    if args.get("error"):
        raise ApiError(str(args["error"]))
    return {"args": dict(args)}


def users_info(ctx: Context, args: Args) -> JSON:
    user = ctx.workspace.user(str(args.required("user")))
    if user is None:
        raise ApiError("user_not_found")
    return {"user": user.as_json(ctx.workspace.team_id)}


def users_lookup_by_email(ctx: Context, args: Args) -> JSON:
    user = ctx.workspace.user_by_email(str(args.required("email")))
    if user is None:
        raise ApiError("users_not_found")
    return {"user": user.as_json(ctx.workspace.team_id)}


def users_list(ctx: Context, args: Args) -> JSON:
    """Everyone, a page of `limit` at a time (no limit: all at once), continued by the opaque
    cursor in response_metadata.next_cursor, which is empty on the last page."""
    people = ctx.workspace.everyone()
    ids = [user.id for user in people]
    cursor = str(args.get("cursor") or "")
    if cursor and (not cursor.startswith("user:") or cursor.removeprefix("user:") not in ids):
        raise ApiError("invalid_cursor")
    start = ids.index(cursor.removeprefix("user:")) if cursor else 0
    try:
        limit = int(args.get("limit") or 0)
    except ValueError:
        raise ApiError("invalid_arguments") from None
    end = len(people) if limit <= 0 else start + limit
    page = [user.as_json(ctx.workspace.team_id) for user in people[start:end]]
    after = f"user:{ids[end]}" if end < len(ids) else ""
    return {"members": page, "response_metadata": {"next_cursor": after}}


def get_upload_url(ctx: Context, args: Args) -> JSON:
    """Step 1 of files_upload_v2: a file id and where to POST its bytes."""
    name = str(args.required("filename"))
    try:
        length = int(args.required("length"))
    except ValueError:
        raise ApiError("invalid_arguments") from None
    file = ctx.workspace.new_file(name, length)
    return {"upload_url": f"{ctx.base_url}upload/{file.id}", "file_id": file.id}


def complete_upload(ctx: Context, args: Args) -> JSON:
    """Step 3 of files_upload_v2: share the uploaded files, in a channel if one is named."""
    ws = ctx.workspace
    files = args.required("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "id" in f for f in files):
        raise ApiError("invalid_arguments", "files.completeUploadExternal: files is not a list")
    targets = [args["channel_id"]] if args.get("channel_id") else []
    targets += [c for c in str(args.get("channels") or "").split(",") if c]
    channels = [joined_channel(ws, target).id for target in targets]
    if any(ws.files.get(f["id"]) is None or ws.files[f["id"]].content is None for f in files):
        raise ApiError("file_not_found")
    done = []
    for f in files:
        file = ws.complete_file(
            f["id"], str(f.get("title") or ""), channels[0] if channels else None
        )
        assert file is not None  # checked above under the same lock
        done.append(file)
    comment = str(args.get("initial_comment") or "")
    for channel in channels:
        thread_ts = args.get("thread_ts") or None
        try:
            ws.post(channel, comment, None, thread_ts=thread_ts, files=[f.id for f in done])
        except LookupError:
            raise ApiError("thread_not_found") from None
    return {"files": [file.as_json(ctx.base_url) for file in done]}


def connections_open(ctx: Context, args: Args) -> JSON:
    """Socket Mode: where the app opens its WebSocket (plain ws://, so no TLS is needed)."""
    return {"url": "ws://" + ctx.base_url.removeprefix("http://") + "link"}


METHODS: dict[str, Method] = {
    "auth.test": auth_test,
    "api.test": api_test,
    "users.info": users_info,
    "users.lookupByEmail": users_lookup_by_email,
    "users.list": users_list,
    "files.getUploadURLExternal": get_upload_url,
    "files.completeUploadExternal": complete_upload,
    "apps.connections.open": connections_open,
}
