"""How many YAML nodes a document has, counted apart from the loader under test."""

from __future__ import annotations

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode


def yaml_nodes(text: str) -> int:
    """The distinct nodes (keys, values, list items; an alias is its anchor's node, counted
    once) of ``text``, composed by PyYAML's pure-Python loader."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    seen: set[int] = set()
    stack: list[Node] = [] if root is None else [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                stack += (key, value)
        elif isinstance(node, SequenceNode):
            stack += node.value
    return len(seen)
