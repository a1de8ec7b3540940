"""rules/README.md carries the fact catalogue exactly as rules.catalogue.markdown() renders it.

Regenerate the block with `python -m tests.unit.rules.test_catalogue_doc`.
"""

from __future__ import annotations

from pathlib import Path

from rules.catalogue import markdown

README = Path(__file__).resolve().parents[3] / "rules" / "README.md"
START = "<!-- catalogue:start -->\n"
END = "<!-- catalogue:end -->"
REGENERATE = "python -m tests.unit.rules.test_catalogue_doc"


def split(text: str) -> tuple[str, str, str]:
    """The README as (before the block, the block, after it); markers stay outside the block."""
    head, start, rest = text.partition(START)
    block, end, tail = rest.partition(END)
    if not (start and end):
        raise ValueError(f"{README} lacks the {START.strip()} ... {END} markers")
    return head + start, block, end + tail


def regenerate() -> None:
    head, _, tail = split(README.read_text(encoding="utf-8"))
    README.write_text(f"{head}\n{markdown()}\n{tail}", encoding="utf-8")


def test_the_readme_catalogue_is_the_generated_one() -> None:
    """The block between the catalogue markers is markdown(), so the doc stays in step."""
    _, block, _ = split(README.read_text(encoding="utf-8"))
    assert markdown().strip() == block.strip(), (
        f"rules/README.md's fact catalogue differs from rules/catalogue.py; "
        f"regenerate it with `{REGENERATE}`"
    )


if __name__ == "__main__":
    regenerate()
    print(f"rewrote the fact catalogue in {README}")
