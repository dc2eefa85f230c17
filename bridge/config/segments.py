"""Where each webhook of a configuration file is in its text, found without parsing it.

A reload of 10,000 webhooks where a few changed spent most of its time making the YAML of every
webhook into nodes again (libyaml scans fast; the nodes are Python objects). :func:`layout` cuts
the text of a top-level block list ``webhooks:`` into *segments*, one per entry: each starts at a
line whose first character is the list's ``-`` (at the list's column) and runs to the next such
line, or to the first line at that column or left of it that is neither an entry nor a comment.
The loader (:mod:`bridge.config.loader`) composes again only the segments whose text it has not
met before, and lines of blank text stand for the others, so every node composed keeps its line.

This is a guess from the text, never trusted: a line that looks like an entry may be inside a
quoted scalar or a flow collection. The loader takes a layout only when the composed document
agrees with it entry by entry (:func:`agrees`); otherwise it composes the whole text.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_KEY = re.compile(r"^webhooks:[ ]*(?:#[^\n]*)?\n", re.M)
"""The line of the list's key: at the first column, nothing after it but a comment."""
_FIRST_ENTRY = re.compile(r"(?:[ ]*(?:#[^\n]*)?\n)*([ ]*)-(?=[ \n])")
"""Blank or comment lines, then the first entry's ``-`` (its column: the list's)."""
_ODD_BREAKS = re.compile("[\r\x85\u2028\u2029]")
"""Line breaks other than ``\\n``: YAML (1.1, as PyYAML reads it) counts them as lines too."""


@functools.cache
def _left_of(column: int) -> re.Pattern[str]:
    """The lines whose first character is at ``column`` or left of it."""
    return re.compile(rf"^ {{0,{column}}}[^ \n]", re.M)


@dataclass(frozen=True, slots=True)
class Layout:
    """The segments of one text: ``spans[i]`` is the ``(start, end)`` offsets of entry ``i``,
    ``lines[i]`` the 0-based line it starts on (``lines[-1]``: the line the list's text ends
    on). ``key_line`` is the line of ``webhooks:``; ``end`` the offset where the list's text
    ends (the length of the text when it runs to the end)."""

    key_line: int
    spans: tuple[tuple[int, int], ...]
    lines: tuple[int, ...]
    end: int
    end_column: int | None
    """The column of the first character of the line the list's text ends on (None when it runs
    to the end of the text)."""


def layout(text: str) -> Layout | None:
    """The segments of ``text``, or None when it has no top-level ``webhooks:`` block list that
    can be cut (see the module's docstring), line breaks other than ``\\n``, or no line break at
    the end (where a stream may end on the line that closes what a segment opened)."""
    if not text.endswith("\n") or _ODD_BREAKS.search(text):
        return None
    keys = list(_KEY.finditer(text))
    if len(keys) != 1:
        return None
    key = keys[0]
    first = _FIRST_ENTRY.match(text, key.end())
    if first is None:
        return None
    column = len(first.group(1))
    start = first.end() - column - 1  # the first entry's line
    key_line = text.count("\n", 0, key.start())
    line = key_line + 1 + text.count("\n", key.end(), start)
    starts = [start]
    lines = [line]
    end = len(text)
    end_column = None
    at = start
    for match in _left_of(column).finditer(text, start + column + 1):
        here = match.start()
        mark = match.end() - 1
        if text[mark] == "#":  # a comment line (or a line of a quoted scalar: still this entry)
            continue
        line += text.count("\n", at, here)
        at = here
        if mark - here == column and text[mark] == "-" and text[mark + 1 : mark + 2] in (" ", "\n"):
            starts.append(here)
            lines.append(line)
            continue
        end, end_column = here, mark - here
        break
    if end == len(text):
        line += text.count("\n", at, end)
    lines.append(line)
    spans = tuple(zip(starts, [*starts[1:], end], strict=True))
    return Layout(key_line, spans, tuple(lines), end, end_column)


def webhooks_list(root: Node | None, key_line: int) -> SequenceNode | None:
    """The value of the top-level ``webhooks`` key written at the start of ``key_line``, if it
    is a list and the only such key."""
    if not isinstance(root, MappingNode):
        return None
    found = [
        value
        for key, value in root.value
        if isinstance(key, ScalarNode) and key.value == "webhooks"
    ]
    if len(found) != 1:
        return None
    key = next(k for k, v in root.value if v is found[0])
    if key.start_mark.line != key_line or key.start_mark.column != 0:
        return None
    value = found[0]
    return value if isinstance(value, SequenceNode) else None


def agrees(root: Node | None, shape: Layout, composed: list[int]) -> SequenceNode | None:
    """The ``webhooks`` list of the document composed from a text laid out as ``shape`` with
    only the segments numbered ``composed`` (in order) written out, if it agrees with the
    layout: one entry per segment written out, each starting within its segment's lines, and
    the list ending where its text does (at the first character of the line after it, a token
    of its own: not after a ``]`` or a quote there that closed what a segment opened). Else
    None.

    Agreement proves each segment was read from a clean start: an entry's ``-`` is read as one
    only outside quoted scalars and flow collections, so the line before every entry closed
    whatever the text before it opened, and the list did not run past its end."""
    items = webhooks_list(root, shape.key_line)
    if items is None or len(items.value) != len(composed):
        return None
    lines = shape.lines
    for item, index in zip(items.value, composed, strict=True):
        if not lines[index] <= item.start_mark.line < max(lines[index + 1], lines[index] + 1):
            return None
    end = items.end_mark
    if shape.end_column is None:
        if end.line > lines[-1]:
            return None
    elif (end.line, end.column) != (lines[-1], shape.end_column):
        return None
    return items
