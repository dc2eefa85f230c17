"""Reading the configuration's files: to the end however short each read is (procfs, FUSE, NFS
return fewer bytes than asked before the end), never past the limit."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import files
from bridge.core.settings import sha256_hex
from bridge.files import FileRefused, read_regular_file

LIMIT = 64


@contextlib.contextmanager
def short_reads(most: int, reported_size: int | None = None) -> Iterator[list[int]]:
    """``os.read`` returning at most ``most`` bytes a call, as a network or virtual file system
    may; with ``reported_size``, ``fstat`` says that size (0 as procfs does, or less than the
    file holds, as for a file that grew). Yields the length of every read's result."""
    real_read, real_fstat = os.read, os.fstat
    returned: list[int] = []

    def read(fd: int, wanted: int) -> bytes:
        data = real_read(fd, min(wanted, most))
        returned.append(len(data))
        return data

    def fstat(fd: int) -> os.stat_result:
        status = real_fstat(fd)
        if reported_size is None:
            return status
        fields = list(status)
        fields[stat.ST_SIZE] = reported_size
        return os.stat_result(fields)

    with mock.patch.object(files.os, "read", read), mock.patch.object(files.os, "fstat", fstat):
        yield returned


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    most=st.integers(1, LIMIT + 2),
    size=st.integers(0, 3 * LIMIT),
    reported=st.one_of(st.none(), st.integers(0, LIMIT)),
)
def test_a_file_read_in_short_pieces_is_read_whole_and_never_past_the_limit(
    most: int, size: int, reported: int | None
) -> None:
    content = bytes(index % 251 for index in range(size))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f"
        path.write_bytes(content)
        reported = size if reported is None else min(reported, size)
        with short_reads(most, reported) as returned:
            if size <= LIMIT:
                assert read_regular_file(path, LIMIT) == content
            else:
                with pytest.raises(FileRefused) as refused:
                    read_regular_file(path, LIMIT)
                assert refused.value.too_large
    assert sum(returned) <= LIMIT + 1


def test_a_proc_file_is_read_whole() -> None:
    # procfs says a size of 0 and returns about a page a read: /proc/self/smaps was cut at its
    # first page. Their contents move between two reads, so what is compared is what stays.
    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no procfs")

    def keys(text: str) -> list[str]:
        return [line.split(":")[0] for line in text.splitlines()]

    assert keys(read_regular_file(status, 1 << 20).decode()) == keys(status.read_text())
    smaps = read_regular_file(Path("/proc/self/smaps"), 64 << 20)
    assert len(smaps) > 4 * 4096 and b"[stack]" in smaps, "read past its first pages"
    assert smaps.endswith(b"\n") and smaps.splitlines()[-1].startswith(b"VmFlags:")


def test_the_watchers_fingerprint_of_a_file_read_in_short_pieces_is_the_whole_files(
    tmp_path: Path,
) -> None:
    import bridge.config.reload as reload

    path = tmp_path / "bridge.yaml"
    content = b"webhooks: []\n" + b"#" * 10_000 + b"\n"
    path.write_bytes(content)
    with short_reads(1000):
        assert reload._Fingerprints()([path], True) == (sha256_hex(content),)
