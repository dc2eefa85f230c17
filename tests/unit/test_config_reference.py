"""The README's configuration reference and the example configuration against the key
declarations: the README's tables are the rendered declarations, every key the loader accepts is
documented (and nothing else), and config/bridge.example.yaml shows every key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bridge.config import loader
from bridge.config.reference import render_reference
from devtools.cli import main as devtools_main
from devtools.config_reference import BEGIN, END, generated_part, with_reference
from devtools.config_reference import main as write_reference

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m devtools config-reference --write"

ACCEPTED = {**loader._SECTIONS, "webhooks": loader._WEBHOOK_FIELDS}
"""Each section of the file and the keys the loader accepts in it, in the loader's order."""


def documented_keys(reference: str) -> dict[str, list[str]]:
    """Each section of a rendered reference and the keys its table's rows name, in order."""
    keys: dict[str, list[str]] = {}
    section = None
    for line in reference.splitlines():
        heading = re.fullmatch(r"### `(\w+)`", line)
        if heading:
            section = keys.setdefault(heading.group(1), [])
        elif section is not None and line.startswith("| `"):
            section += re.findall(r"`(\w+)`", line.split(" | ")[0])
    return keys


def test_readme_configuration_reference_is_the_rendered_declarations() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")

    assert generated_part(readme) == render_reference(), (
        "README.md's configuration reference differs from the key declarations in "
        f"bridge/core/settings.py and bridge/core/webhook.py: run `{COMMAND}`"
    )


def test_reference_documents_exactly_the_keys_the_loader_accepts_in_its_order() -> None:
    documented = documented_keys(render_reference())

    assert list(documented) == list(loader._TOP_LEVEL)
    assert documented == {section: list(spec) for section, spec in ACCEPTED.items()}


def test_example_configuration_shows_every_key() -> None:
    example = yaml.safe_load((REPO / "config" / "bridge.example.yaml").read_text(encoding="utf-8"))
    webhook_keys = {key for webhook in example["webhooks"] for key in webhook}

    shown = {section: set(example[section]) for section in loader._SECTIONS}
    assert {**shown, "webhooks": webhook_keys} == {
        section: set(spec) for section, spec in ACCEPTED.items()
    }


def test_write_puts_the_reference_between_the_markers_and_keeps_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nBefore.\n\n{BEGIN}\nstale table\n{END}\n\nAfter.\n")

    assert write_reference(write=True, readme=readme) == 0

    text = readme.read_text()
    assert text.startswith(f"# Title\n\nBefore.\n\n{BEGIN}\n\n### `kafka`\n")
    assert text.endswith(f"{END}\n\nAfter.\n")
    assert generated_part(text) == render_reference()
    assert with_reference(text, render_reference()) == text
    assert "configuration reference written" in capsys.readouterr().out


def test_printing_the_reference_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert devtools_main(["config-reference"]) == 0

    assert capsys.readouterr().out == render_reference()


def test_readme_without_markers_is_an_error_naming_them() -> None:
    with pytest.raises(ValueError, match="BEGIN generated config reference"):
        generated_part("# README without a generated part\n")
