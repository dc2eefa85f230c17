"""Where each webhook is in a configuration file's text (``bridge.config.segments``): the layout
is cut from the text alone, and taken only when the composed document agrees with it."""

from __future__ import annotations

import yaml

from bridge.config.segments import agrees, layout

TEXT = (
    "kafka:\n  bootstrap_servers: k:9092\n"
    "webhooks:  # the list\n"
    "\n"
    "  - id: a\n    url: https://a.example/h\n"
    "# a comment at the first column\n"
    "  - id: b\n    events:\n    - transaction.failed\n"
    "  -\n    id: c\n"
    "logging:\n  level: info\n"
)


def texts(text: str) -> list[str]:
    shape = layout(text)
    assert shape is not None
    return [text[start:end] for start, end in shape.spans]


def test_each_entry_runs_to_the_next_or_to_the_next_line_left_of_the_list() -> None:
    assert texts(TEXT) == [
        "  - id: a\n    url: https://a.example/h\n# a comment at the first column\n",
        "  - id: b\n    events:\n    - transaction.failed\n",
        "  -\n    id: c\n",
    ]
    shape = layout(TEXT)
    assert shape is not None
    assert shape.key_line == 2 and shape.lines == (4, 7, 10, 12)
    assert TEXT[shape.end :] == "logging:\n  level: info\n"


def test_a_list_at_the_first_column_runs_to_the_end() -> None:
    text = "webhooks:\n- id: a\n  events:\n  - x\n- id: b\n"
    assert texts(text) == ["- id: a\n  events:\n  - x\n", "- id: b\n"]
    shape = layout(text)
    assert shape is not None and shape.end == len(text) and shape.lines == (1, 4, 5)


def test_no_layout_where_the_list_cannot_be_cut() -> None:
    for text in (
        "kafka: {}\n",  # no list
        "webhooks: []\n",  # a flow list
        "webhooks:\n  key: value\n",  # not a list
        "  webhooks:\n  - id: a\n",  # not at the first column
        "webhooks:\n- id: a\nwebhooks:\n- id: b\n",  # the key twice
        "webhooks:\n- id: a",  # no line break at the end
        "webhooks:\r\n- id: a\r\n",  # other line breaks
        "webhooks:\n- id: a\n\u2028- id: b\n",
    ):
        assert layout(text) is None, text


def compose(text: str) -> yaml.Node:
    return yaml.compose(text, Loader=yaml.SafeLoader)


def test_the_composed_document_must_agree_entry_by_entry() -> None:
    shape = layout(TEXT)
    assert shape is not None
    assert agrees(compose(TEXT), shape, [0, 1, 2]) is not None
    # An entry-looking line inside a quoted scalar: two segments, one entry.
    quoted = 'webhooks:\n  - id: a\n    secret: "x\n  - id: b\n    y"\n'
    shape = layout(quoted)
    assert shape is not None and len(shape.spans) == 2
    assert agrees(compose(quoted), shape, [0, 1]) is None
    # The list running past where its text ends (a flow list left open swallows a section).
    open_flow = "webhooks:\n  - id: a\n    events: [x,\nlogging: y]\n"
    shape = layout(open_flow)
    assert shape is not None and open_flow[shape.end :] == "logging: y]\n"
    assert agrees(compose(open_flow), shape, [0]) is None
    # Segments left blank compose to nothing: the written ones must be the entries.
    shape = layout(TEXT)
    assert shape is not None and agrees(compose(TEXT), shape, [0, 2]) is None


def test_the_list_must_end_at_a_token_of_its_own() -> None:
    """A closer at the start of the line after the list (a ``]`` or a quote closing what an
    entry opened) ends the list after it: no agreement."""
    closed = "webhooks:\n  - id: a\n    events: [x,\n]\nlogging: {}\n"
    shape = layout(closed)
    assert shape is not None and shape.end_column == 0
    assert agrees(compose(closed), shape, [0]) is None
    fine = "webhooks:\n  - id: a\n    events: [x]\nlogging: {}\n"
    shape = layout(fine)
    assert shape is not None and agrees(compose(fine), shape, [0]) is not None
