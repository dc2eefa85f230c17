"""The alias walk (``_shape_problem``) against a plain one, on random YAML graphs of every
outcome: recursive aliases, nesting (in the tree and through aliases) and alias expansion. The
walk settles scalars where it meets them (remembering each, or, given the composer's count of
distinct nodes, not); the plain one stacks every node. Same verdict, same node, for every graph
and every limit."""

from __future__ import annotations

import random

import pytest
import yaml
from yaml.nodes import Node

from bridge.config import loader


def plain_walk(
    root: Node, max_nesting: int, max_expansion: int, factor: int
) -> tuple[Node, str] | None:
    """The walk as first written: every node stacked, sizes and depths in two dicts."""
    _children = loader._children
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active = {id(root)}
    stack: list[tuple[Node, list[Node]]] = [(root, _children(root)[::-1])]
    while stack:
        node, pending = stack[-1]
        if pending:
            child = pending.pop()
            if id(child) in active:
                return child, "recursive alias: a node anchored here contains an alias to itself"
            if id(child) not in size:
                if len(stack) >= max_nesting:
                    return child, f"nested more than {max_nesting} levels deep"
                active.add(id(child))
                stack.append((child, _children(child)[::-1]))
            continue
        stack.pop()
        active.discard(id(node))
        children = _children(node)
        size[id(node)] = 1 + sum(size[id(child)] for child in children)
        depth[id(node)] = 1 + max((depth[id(child)] for child in children), default=0)
    if depth[id(root)] > max_nesting:
        return root, f"nested more than {max_nesting} levels deep (through aliases)"
    added = size[id(root)] - len(size)
    limit = max(max_expansion, factor * len(size))
    if added > limit:
        return root, (
            f"aliases would expand the document by more than {limit} nodes ({added}); "
            "write the values out or share fewer"
        )
    return None


def random_document(rng: random.Random) -> str:
    """Flow collections and scalars, some anchored, some aliases of what came before."""
    anchors: list[str] = []

    def anchor() -> str:
        if rng.random() < 0.3:
            anchors.append(f"a{len(anchors)}")
            return f"&{anchors[-1]} "
        return ""

    def node(level: int) -> str:
        roll = rng.random()
        if anchors and roll < 0.25:
            return "*" + rng.choice(anchors)
        if level > rng.randint(1, 6) or roll < 0.45:
            return anchor() + rng.choice(["x", "1", "true", "''"])
        prefix = anchor()
        if rng.random() < 0.5:
            return prefix + "[" + ", ".join(node(level + 1) for _ in range(rng.randint(0, 4))) + "]"
        entries = (f"k{i}: {node(level + 1)}" for i in range(rng.randint(0, 4)))
        return prefix + "{" + ", ".join(entries) + "}"

    return node(0) + "\n"


@pytest.mark.parametrize("seed", range(4))
def test_the_walk_gives_the_plain_walks_verdict_on_random_graphs(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for _ in range(3000):
        root = yaml.compose(random_document(rng), Loader=yaml.SafeLoader)
        if root is None:
            continue
        limits = (
            rng.choice([3, 5, 64]),
            rng.choice([0, 2, 5, 20, 100_000]),
            rng.choice([0, 1, 10]),
        )
        monkeypatch.setattr(loader, "MAX_NESTING", limits[0])
        monkeypatch.setattr(loader, "MAX_ALIAS_EXPANSION", limits[1])
        monkeypatch.setattr(loader, "ALIAS_EXPANSION_FACTOR", limits[2])
        expected = plain_walk(root, *limits)
        distinct = sum(1 for _ in loader._distinct_nodes(root))
        # Scalars remembered, and counted by the composer (taken as met, a walk again if one
        # is as deep as the limit).
        for found in (loader._shape_problem(root), loader._shape_problem(root, 0, distinct)):
            assert (found is None) == (expected is None)
            if found is not None and expected is not None:
                assert found[0] is expected[0] and found[1] == expected[1]
        verdict = "none" if expected is None else " ".join(expected[1].split()[:2])
        outcomes[verdict] = outcomes.get(verdict, 0) + 1
    # Every kind of verdict was met (the generator reaches them all).
    assert set(outcomes) == {"none", "recursive alias:", "nested more", "aliases would"}, outcomes
