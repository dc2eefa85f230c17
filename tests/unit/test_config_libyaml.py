"""libyaml against the pure-Python loader: whatever libyaml composes, it composes as the pure
loader does, and every load ends alike (the fuzz strategies are those of test_config_fuzz). Only
where PyYAML has libyaml: elsewhere there is nothing to compare, and the module is skipped whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import loader
from tests.unit.test_config_fuzz import (
    FUZZ,
    LIBYAML,
    YAML_PIECES,
    Files,
    block_documents,
    check_libyaml_composes_as_pure,
    check_loads_agree,
    documents,
    files,
)

__all__ = ["files"]  # the fixture, shared with test_config_fuzz

if LIBYAML is None:
    pytest.skip("PyYAML is built without libyaml here", allow_module_level=True)


@settings(FUZZ, max_examples=300)
@given(parts=st.lists(st.sampled_from(YAML_PIECES), max_size=40))
def test_libyaml_composes_as_the_pure_loader_yaml_soup(parts: list[str]) -> None:
    check_libyaml_composes_as_pure("".join(parts) + "\n")


@settings(FUZZ, max_examples=150)
@given(text=block_documents())
def test_libyaml_composes_as_the_pure_loader_block_style(text: str) -> None:
    check_libyaml_composes_as_pure(text)


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_libyaml_and_the_pure_loader_load_alike(files: Files, data: st.DataObject) -> None:
    text = data.draw(documents(str(files.secret)))
    encoded = text.encode("utf-8", "surrogatepass")
    check_loads_agree(files, encoded)
    flipped = bytearray(encoded)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(flipped) - 1))
        flipped[at] = data.draw(st.integers(0, 255))
    check_loads_agree(files, bytes(flipped))


@pytest.mark.parametrize(
    "text",
    [
        "topics: {s?urce: t.source}\nwebhooks:\n",  # found by the fuzz test above
        "a: [x?y, z]\n",
        "a: [x,\n  y?z]\n",
        "a: {k: v?w}\n",
    ],
)
def test_a_question_mark_in_a_flow_collection_is_read_by_the_pure_loader(text: str) -> None:
    check_libyaml_composes_as_pure(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "FAST_YAML_LOADER", LIBYAML)
        assert loader._compose_fast(text) == (False, None, 0)
