"""views.open / push / update / publish: trigger_id rules, hash checks and the view limits."""

from __future__ import annotations

from .api import ApiError, Args, Context, Method
from .limits import check_view
from .model import JSON


def checked_view(method: str, args: Args, kind: str) -> JSON:
    """The `view` argument, if it is a valid view of `kind` ("modal" or "home")."""
    view = args.required("view")
    if not isinstance(view, dict):
        raise ApiError("invalid_arguments", f"{method}: view is not a JSON object")
    if view.get("type") != kind:
        found = view.get("type")
        raise ApiError("invalid_arguments", f"{method}: view type {found!r}, expected {kind!r}")
    problems = check_view(view)
    if problems:
        messages = [f"[ERROR] {problem}" for problem in problems]
        violation = f"{method}: invalid_blocks: {'; '.join(problems)}"
        raise ApiError("invalid_blocks", violation, response_metadata={"messages": messages})
    return view


def redeemed_trigger_user(ctx: Context, args: Args) -> str:
    """Who the trigger_id was issued to; it must be unused and at most three seconds old."""
    trigger = ctx.workspace.tokens.redeem_trigger(str(args.required("trigger_id")))
    if trigger is None:
        raise ApiError(
            "invalid_arguments", response_metadata={"messages": ["invalid `trigger_id`"]}
        )
    return trigger.user


def check_hash(args: Args, current: JSON) -> None:
    if args.get("hash") and args["hash"] != current["hash"]:
        raise ApiError("hash_conflict")


def open_view(ctx: Context, args: Args) -> JSON:
    view = checked_view("views.open", args, "modal")
    user = redeemed_trigger_user(ctx, args)
    return {"view": ctx.workspace.views.open_modal(user, view)}


def push(ctx: Context, args: Args) -> JSON:
    view = checked_view("views.push", args, "modal")
    user = redeemed_trigger_user(ctx, args)
    pushed = ctx.workspace.views.push_modal(user, view)
    if pushed is None:
        raise ApiError("push_limit_reached")
    return {"view": pushed}


def update(ctx: Context, args: Args) -> JSON:
    views = ctx.workspace.views
    if args.get("view_id"):
        current = views.get(str(args["view_id"]))
    elif args.get("external_id"):
        current = views.by_external_id(str(args["external_id"]))
    else:
        raise ApiError("invalid_arguments", "views.update: neither view_id nor external_id")
    if current is None:
        raise ApiError("not_found")
    view = checked_view("views.update", args, current["type"])
    check_hash(args, current)
    updated = views.update(current["id"], view)
    assert updated is not None  # the workspace lock is held for the whole call
    return {"view": updated}


def publish(ctx: Context, args: Args) -> JSON:
    ws = ctx.workspace
    user = str(args.required("user_id"))
    if ws.user(user) is None:
        raise ApiError("user_not_found")
    view = checked_view("views.publish", args, "home")
    current = ws.views.home(user)
    if current is not None:
        check_hash(args, current)
    return {"view": ws.views.publish_home(user, view)}


METHODS: dict[str, Method] = {
    "views.open": open_view,
    "views.push": push,
    "views.update": update,
    "views.publish": publish,
}
