"""``python -m devtools config-reference [--write]``: the README's configuration reference, rendered
from the key declarations by :func:`bridge.config.reference.render_reference`; printed, or written
into README.md between the two marker comments :data:`BEGIN` and :data:`END` (the rest of the
README is left as it is)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from bridge.config.reference import render_reference

README: Final = Path(__file__).resolve().parents[1] / "README.md"

BEGIN: Final = (
    "<!-- BEGIN generated config reference: python -m devtools config-reference --write -->"
)
END: Final = "<!-- END generated config reference -->"


def generated_part(readme: str) -> str:
    """The text between the markers of ``readme``, without the blank lines around it."""
    start, end = _between_markers(readme)
    return readme[start:end].strip("\n") + "\n"


def with_reference(readme: str, reference: str) -> str:
    """``readme`` with ``reference`` between its markers."""
    start, end = _between_markers(readme)
    return f"{readme[:start]}\n\n{reference}\n{readme[end:]}"


def _between_markers(readme: str) -> tuple[int, int]:
    """Where the generated part of ``readme`` starts and ends; ValueError without the markers."""
    begin = readme.find(BEGIN)
    end = readme.find(END, begin)
    if begin < 0 or end < 0:
        raise ValueError(f"the README has no lines {BEGIN} and {END} (in that order)")
    return begin + len(BEGIN), end


def main(write: bool, readme: Path = README) -> int:
    """Print the reference, or (``write``) put it into ``readme`` and say whether it changed."""
    reference = render_reference()
    if not write:
        print(reference, end="")
        return 0
    text = readme.read_text(encoding="utf-8")
    updated = with_reference(text, reference)
    if updated == text:
        print(f"{readme}: the configuration reference is up to date")
        return 0
    readme.write_text(updated, encoding="utf-8")
    print(f"{readme}: configuration reference written")
    return 0
