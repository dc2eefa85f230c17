"""The built wheel holds the product only: every package of ``bridge`` with its data, and none of
the development tools (``devtools/``: local broker and registry, demo, benchmark, sample tools)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"bridge", *(f"bridge/{name}" for name in ("core", "codec", "config", "kafka", "http"))}
PACKAGES |= {"bridge/ops", "bridge/engine"}
DEV_MODULES = ("bench", "demo", "devkafka", "devregistry", "sample_", "samples")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("transaction_webhook_bridge-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_every_product_package_and_its_data(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")}
    assert packages == PACKAGES
    data = {name.rsplit("/", 1)[1] for name in names if name.startswith("bridge/core/data/")}
    assert data == {path.name for path in (REPO / "bridge/core/data").glob("*.csv")}


def test_the_wheel_holds_no_development_tool(wheel: zipfile.ZipFile) -> None:
    modules = [name for name in wheel.namelist() if name.endswith(".py")]
    assert not [name for name in modules if not name.startswith("bridge/")]
    assert not [name for name in modules if name.rsplit("/", 1)[1].startswith(DEV_MODULES)], (
        "a development module is in the wheel"
    )
    (entry_points,) = [name for name in wheel.namelist() if name.endswith("entry_points.txt")]
    assert wheel.read(entry_points).decode().split() == [
        "[console_scripts]",
        "bridge",
        "=",
        "bridge.cli:main",
    ]
