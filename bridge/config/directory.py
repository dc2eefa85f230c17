"""A configuration directory: which of its entries are configuration files, and the signature of
that listing (what the hot-reload watcher compares to see a file added, removed or swapped).

A directory's configuration is the files named ``*.yaml`` or ``*.yml`` directly in it (not in its
subdirectories), in name order (code point order, as :func:`sorted`). An entry whose name starts
with ``.`` is ignored: that skips the bookkeeping of a Kubernetes ConfigMap or projected volume
(the ``..data`` symlink and the ``..2026_01_01_00_00_00.123`` directory it points to), whose
visible names are symlinks ``name -> ..data/name``, followed like any symlink.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from bridge.core.settings import sha256_hex

CONFIG_SUFFIXES: Final = (".yaml", ".yml")
"""The names of a directory's configuration files end so (lowercase)."""


def is_config_name(name: str) -> bool:
    """Whether a directory entry called ``name`` is one of its configuration files."""
    return not name.startswith(".") and name.endswith(CONFIG_SUFFIXES)


def config_files(directory: Path) -> list[Path]:
    """The configuration files of ``directory`` in name order (OSError when it cannot be
    listed). Whether each is a readable file is for the reader to find out."""
    return [directory / name for name in sorted(filter(is_config_name, os.listdir(directory)))]


def listing_digest(directory: Path) -> str:
    """The signature of the directory's listing: the names of its configuration files, in order,
    each with whether it is a regular file (following symlinks). It moves when a file is added,
    removed or renamed, and when a name starts or stops leading to a file (a symlink left
    dangling for a moment by an update), but not when a file's content changes: the watcher
    follows each file's content on its own. OSError when the directory cannot be listed."""
    entries = [f"{path.name}\0{'f' if path.is_file() else '-'}" for path in config_files(directory)]
    return sha256_hex("\n".join(entries).encode("utf-8", "surrogateescape"))
