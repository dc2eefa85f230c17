"""A Kubernetes ConfigMap (or projected) volume, written on a local directory exactly as kubelet's
AtomicWriter writes one (pkg/volume/util/atomic_writer.go, Kubernetes 1.2x to 1.3x):

1. a new directory ``..<UTC timestamp>.<random>`` (``os.MkdirTemp``, then mode 0755) holding
   every file of the payload;
2. a symlink ``..data_tmp -> ..<timestamp>...``, renamed over ``..data`` (the atomic step);
3. the visible names, symlinks ``name -> ..data/name``, created for the names not there yet (once:
   later updates go through ``..data``);
4. the visible names no longer in the payload removed;
5. the old timestamp directory removed.

Only top-level file names are written (the bridge reads no subdirectory).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA = "..data"
DATA_TMP = "..data_tmp"


class AtomicWriter:
    """Writes payloads (file name: text) into ``target`` as kubelet does."""

    def __init__(self, target: Path) -> None:
        self.target = target
        target.mkdir(parents=True, exist_ok=True)

    def write(self, payload: Mapping[str, str]) -> Path:
        """Publish ``payload`` as the volume's new content; returns the new timestamp directory."""
        data = self.target / DATA
        old = os.readlink(data) if data.is_symlink() else None
        old_names = set(os.listdir(self.target / old)) if old else set()
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
        version = Path(tempfile.mkdtemp(prefix=stamp, dir=self.target))
        version.chmod(0o755)
        for name, text in payload.items():
            assert "/" not in name and not name.startswith(".."), name
            (version / name).write_text(text, encoding="utf-8")
        (self.target / DATA_TMP).symlink_to(version.name)
        os.rename(self.target / DATA_TMP, data)
        for name in payload:
            visible = self.target / name
            if not visible.is_symlink():
                visible.symlink_to(f"{DATA}/{name}")
        for name in old_names - set(payload):
            (self.target / name).unlink()
        if old:
            shutil.rmtree(self.target / old)
        return version
