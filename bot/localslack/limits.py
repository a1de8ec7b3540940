"""Slack's Block Kit limits, checked on every message and view; each problem is one readable line.

Real Slack answers `invalid_blocks` for these; the local API does too and records the problem.
"""

from __future__ import annotations

from typing import Any

MESSAGE_BLOCKS, VIEW_BLOCKS = 50, 100
BLOCK_TYPES = {
    "actions", "context", "divider", "file", "header", "image", "input", "markdown",
    "rich_text", "section", "video",
}  # fmt: skip
OPTION_ELEMENTS = {
    "static_select",
    "multi_static_select",
    "overflow",
    "radio_buttons",
    "checkboxes",
}


def check_blocks(blocks: object, *, max_blocks: int = MESSAGE_BLOCKS) -> list[str]:
    """Problems with a list of blocks for a message (50 at most) or a view (100)."""
    if not isinstance(blocks, list):
        return [f"blocks must be a list, not {type(blocks).__name__}"]
    checker = _Checker()
    if len(blocks) > max_blocks:
        checker.problems.append(f"{len(blocks)} blocks; Slack allows {max_blocks}")
    for index, block in enumerate(blocks):
        checker.block(index, block)
    return checker.problems


def check_view(view: object) -> list[str]:
    """Problems with a modal or Home tab view, its blocks included."""
    if not isinstance(view, dict):
        return ["view must be an object"]
    kind = view.get("type")
    if kind not in ("modal", "home"):
        return [f"view type {kind!r} is not 'modal' or 'home'"]
    blocks = view.get("blocks", [])
    problems = check_blocks(blocks, max_blocks=VIEW_BLOCKS)
    for name, limit in (("private_metadata", 3000), ("callback_id", 255), ("external_id", 255)):
        _length(view.get(name), f"view {name}", limit, problems)
    if kind == "modal":
        if "title" not in view:
            problems.append("a modal needs a title")
        for name in ("title", "submit", "close"):
            if name in view:
                _text(view[name], f"view {name}", 24, problems, plain_only=True)
        has_input = isinstance(blocks, list) and any(
            isinstance(b, dict) and b.get("type") == "input" for b in blocks
        )
        if has_input and "submit" not in view:
            problems.append("a modal with input blocks needs a submit button")
    return problems


def _length(value: object, where: str, limit: int, problems: list[str]) -> None:
    if isinstance(value, str) and len(value) > limit:
        problems.append(f"{where} is {len(value)} characters; Slack allows {limit}")


def _text(obj: object, where: str, limit: int, problems: list[str], *, plain_only: bool) -> None:
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        problems.append(f"{where}: needs a text object {{'type': ..., 'text': ...}}")
        return
    kinds = ("plain_text",) if plain_only else ("plain_text", "mrkdwn")
    if obj.get("type") not in kinds:
        problems.append(f"{where}: text type {obj.get('type')!r} is not {' or '.join(kinds)}")
    if not obj["text"]:
        problems.append(f"{where}: text is empty")
    _length(obj["text"], f"{where}: text", limit, problems)


class _Checker:
    """Walks one surface's blocks: block_id must be unique within the surface, action_id within
    its block (Slack's words: "unique among all other action_ids in the containing block")."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.block_ids: set[str] = set()
        self.action_ids: set[str] = set()

    def block(self, index: int, block: Any) -> None:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            self.problems.append(f"blocks[{index}] must be an object with a 'type'")
            return
        kind = block["type"]
        where = f"blocks[{index}] ({kind})"
        self.action_ids = set()
        if kind not in BLOCK_TYPES:
            self.problems.append(f"{where}: unknown block type")
        self._unique(block.get("block_id"), self.block_ids, f"{where}: block_id")
        if kind == "section":
            self._section(where, block)
        elif kind == "header":
            _text(block.get("text"), where, 150, self.problems, plain_only=True)
        elif kind == "actions":
            self._elements(where, block.get("elements"), 25)
        elif kind == "context":
            self._elements(where, block.get("elements"), 10, interactive=False)
        elif kind == "input":
            _text(block.get("label"), f"{where} label", 2000, self.problems, plain_only=True)
            if "element" not in block:
                self.problems.append(f"{where}: needs an element")
            else:
                self._element(f"{where} element", block["element"])
        elif kind == "markdown":
            _length(block.get("text"), f"{where}: text", 12000, self.problems)

    def _section(self, where: str, block: dict[str, Any]) -> None:
        if "text" not in block and "fields" not in block:
            self.problems.append(f"{where}: needs text or fields")
        if "text" in block:
            _text(block["text"], where, 3000, self.problems, plain_only=False)
        fields = block.get("fields", [])
        if not isinstance(fields, list) or len(fields) > 10:
            size = len(fields) if isinstance(fields, list) else "not a list"
            self.problems.append(f"{where}: fields has {size} items; Slack allows 10")
        else:
            for number, field in enumerate(fields):
                _text(field, f"{where} fields[{number}]", 2000, self.problems, plain_only=False)
        if "accessory" in block:
            self._element(f"{where} accessory", block["accessory"])

    def _elements(
        self, where: str, elements: object, limit: int, *, interactive: bool = True
    ) -> None:
        if not isinstance(elements, list) or not elements:
            self.problems.append(f"{where}: needs a non-empty list of elements")
            return
        if len(elements) > limit:
            self.problems.append(f"{where}: {len(elements)} elements; Slack allows {limit}")
        if interactive:
            for number, element in enumerate(elements):
                self._element(f"{where} elements[{number}]", element)

    def _element(self, where: str, element: object) -> None:
        if not isinstance(element, dict) or not isinstance(element.get("type"), str):
            self.problems.append(f"{where}: must be an object with a 'type'")
            return
        kind = element["type"]
        self._unique(element.get("action_id"), self.action_ids, f"{where}: action_id")
        if kind == "button":
            _text(element.get("text"), f"{where} (button)", 75, self.problems, plain_only=True)
            _length(element.get("value"), f"{where} (button) value", 2000, self.problems)
            _length(element.get("url"), f"{where} (button) url", 3000, self.problems)
            if element.get("style") not in (None, "primary", "danger"):
                self.problems.append(f"{where} (button): style must be 'primary' or 'danger'")
        if kind in OPTION_ELEMENTS:
            options = element.get("options", [])
            if not isinstance(options, list) or len(options) > 100:
                self.problems.append(f"{where} ({kind}): at most 100 options")
                return
            for number, option in enumerate(options):
                label = f"{where} ({kind}) options[{number}]"
                option_dict = option if isinstance(option, dict) else {}
                _text(option_dict.get("text"), label, 75, self.problems, plain_only=False)
                _length(option_dict.get("value"), f"{label} value", 150, self.problems)
        if "placeholder" in element:
            _text(
                element["placeholder"], f"{where} placeholder", 150, self.problems, plain_only=True
            )

    def _unique(self, value: object, seen: set[str], where: str) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not value or len(value) > 255:
            self.problems.append(f"{where} must be a string of 1 to 255 characters")
        elif value in seen:
            self.problems.append(f"{where} {value!r} is used twice")
        else:
            seen.add(value)
