"""Hot reload: watch the configuration file or directory (and its secret files) and apply valid
changes.

The watcher polls every file the current configuration was read from (:attr:`Config.sources`),
through its path, so it sees in-place edits, replaced files and Kubernetes' ConfigMap and Secret
updates (an atomic swap of the ``..data`` symlink) alike: every ``interval_seconds`` (0.1 s) it
compares each file's ``stat`` (device, inode, size, modification and change times) with the last
one seen and hashes the files whose ``stat`` moved; every ``HASH_EVERY_S`` it hashes them all
(SHA-256) whatever ``stat`` says. A configuration directory is one more thing watched, first in the
sources: its listing, whose "content" is the signature
:func:`~bridge.config.directory.listing_digest` (the names of its configuration files and whether
each leads to a file), so a file added to it or removed from it is a change like an edit (the files
it holds are watched one by one, through their visible names, and so is a file not in force, added
with a mistake: fixing it is a change). Only the content decides: a file touched but not changed is
not reloaded. A change is loaded once the files have stayed the same for ``SETTLE_S`` (at most
``SETTLE_MAX_S`` after it was seen), so a file written in several steps, several times in a row, or
a Kubernetes update (new files, ``..data`` swapped, names added and removed) is loaded once; a file
written in place (its content changed under the same inode) for ``IN_PLACE_SETTLE_S``: what is
there may be the first part of the new file (see :meth:`ConfigWatcher._settle`).

A changed, valid configuration is handed to ``on_change``; an invalid one is logged and handed to
``on_error``, and the current one stays in force. While the file stays invalid it is loaded again
when any file changes, and every ``REJECTED_RETRY_S`` in any case (a secret file that appears
later completes it); the same problems are reported only once.

**Loading off the event loop.** Parsing and validating 10,000 webhooks takes a second or more of
CPU that, on a thread, holds the interpreter lock (PyYAML's C parser releases nothing) and with
it every delivery: py-spy saw the loading thread hold the lock for 72 % of the samples of a
reload. With ``isolated=True`` (what ``bridge run`` uses) the file is loaded in a child process
(:func:`worker_main`, at niceness ``WORKER_NICE``): a fresh interpreter, started ahead of time so
its imports are done when a change comes, loads the files, answers, and exits. It composes
again only the webhooks whose text changed, and builds again only those whose YAML changed
(:class:`~bridge.config.loader.Reuse`: at 10,000 webhooks, composing and building them all was
most of a reload's time). For that, each child answers with a *state* the next one reads: a
keyed digest of each webhook loaded, in order, one of its YAML, and a record of its text.
The watcher keeps the state of the configuration in force as the bytes the child wrote and
sends them to the next child unread (reading and writing it again was milliseconds of the
event loop's time). What else comes back is small: the non-webhook sections, the webhooks whose
digest differs from the one in force and, only when webhooks were removed or moved, the ids in
their new order. The event loop unpickles the webhooks ``CHUNK`` at a time, in slices that give
the loop and the other threads their turn (:mod:`bridge.core.slices`), keeps every unchanged
:class:`~bridge.core.webhook.Webhook` object as it is, and hands over the new configuration in
one step of its own, saying which webhooks changed (:meth:`ConfigWatcher.changed`:
:meth:`Subscriptions.updated` then makes no pass over all of them). When
:meth:`ConfigWatcher.run` starts, a first child loads the files in force to learn their state
(:attr:`ConfigWatcher.primed`; were they changed meanwhile, the first reload ships every webhook,
still a chunk at a time). The digests are keyed
by a random key of this process; the state, which holds the webhooks' secrets as written in the
file, never leaves this process but to its own child, through a pipe. A child that cannot be
started, dies, or does not answer within ``WORKER_TIMEOUT_S`` rejects that file (an internal
error naming what happened); the next change is loaded by a new one. Without ``isolated``
(tests, tools) the file is loaded on a thread.

The watcher survives everything: a file that makes the loader or ``on_change`` fail in a way
nobody foresaw is rejected like an invalid one (its problem names the exception type, never its
message), and the next good file still applies. :attr:`ConfigWatcher.rejected` holds the problems
of the file on disk while it is rejected (for ``/readyz``), and is empty once a good file is in
force again, including the one in force before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import marshal
import os
import pickle
import secrets
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from bridge.config.digest import webhook_digest
from bridge.config.directory import config_files, is_config_name, listing_digest
from bridge.config.loader import (
    CONFIG_FILE_LIMIT_BYTES,
    SECRET_FILE_LIMIT_BYTES,
    Reuse,
    load_config,
)
from bridge.core.errors import ConfigError
from bridge.core.settings import Config, sha256_hex
from bridge.core.slices import Slices
from bridge.core.webhook import Webhook
from bridge.files import FileRefused, read_regular_file

log = logging.getLogger("bridge.config.reload")

POLL_INTERVAL_S = 0.1
STAT_ON_LOOP = 16  # up to this many files, a poll's stat calls run on the event loop itself
HASH_EVERY_S = 1.0  # every file hashed at least this often, whatever its ``stat`` says
SETTLE_S = 0.05  # a change is loaded once the files stayed the same this long...
SETTLE_MAX_S = 2.0  # ...or this long after it was seen, whichever comes first
IN_PLACE_SETTLE_S = 0.5  # the same for a file written in place (its inode kept)...
IN_PLACE_SETTLE_MAX_S = 5.0  # ...and its bound
REJECTED_RETRY_S = 5.0  # a rejected file that did not change is loaded again this often
WORKER_TIMEOUT_S = 120.0
CHUNK = 100  # changed webhooks pickled together (the parent takes them in slices of its loop)
WORKER_NICE = 10  # the child's niceness, above the bridge's
WORKER_ARGS = ("-c", "from bridge.config.reload import worker_main; worker_main()")
"""How the child is started: ``sys.executable`` with these arguments."""
_MAGIC = b"BRLD"
_HEADER = struct.Struct(">4sQ")

_StatKey = tuple[int, int, int, int, int]


def _fingerprint(path: Path, limit: int) -> str | None:
    """SHA-256 of the file's current content (following symlinks), or the signature of a
    directory's listing (as the loader computes it); None when it cannot be read as the loader
    would read it (missing, not a regular file, larger than ``limit``): never more than
    ``limit`` + 1 bytes are read, and a FIFO is never waited on."""
    try:
        if path.is_dir():
            return listing_digest(path)
        return sha256_hex(read_regular_file(path, limit))
    except (OSError, ValueError, FileRefused):
        return None


def _stat_key(path: Path) -> _StatKey | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Fingerprints:
    """The SHA-256 of each watched file, hashed again only when its ``stat`` moved (or when asked
    for ``full``): a poll of unchanged files costs one ``stat`` each. ``limit_of`` says the
    largest file the loader reads at a path."""

    def __init__(
        self, limit_of: Callable[[Path], int] = lambda _path: CONFIG_FILE_LIMIT_BYTES
    ) -> None:
        self._limit_of = limit_of
        self._known: dict[Path, tuple[_StatKey | None, str | None]] = {}
        self.in_place = False  # a file's content changed under the same inode (until reset)

    def __call__(self, paths: Sequence[Path], full: bool) -> tuple[str | None, ...]:
        known: dict[Path, tuple[_StatKey | None, str | None]] = {}
        digests = []
        for path in paths:
            key = _stat_key(path)  # before reading: a change after it moves the key again
            before = seen = self._known.get(path)
            if full or seen is None or key is None or seen[0] != key:
                seen = (key, _fingerprint(path, self._limit_of(path)))
                if before is not None and before[0] is not None and key is not None:
                    same_file = before[0][:2] == key[:2]  # (device, inode)
                    self.in_place |= same_file and before[1] != seen[1]
            known[path] = seen
            digests.append(seen[1])
        self._known = known
        return tuple(digests)

    def unchanged(self, paths: Sequence[Path]) -> tuple[str | None, ...] | None:
        """The digests known for ``paths`` if no file's ``stat`` moved since (one ``stat``
        each, cheap enough for the event loop), else None."""
        digests = []
        for path in paths:
            seen = self._known.get(path)
            key = _stat_key(path)
            if seen is None or key is None or seen[0] != key:
                return None
            digests.append(seen[1])
        return tuple(digests)


class ConfigWatcher:
    """Polls the files of the current configuration and reloads it when one of them changes."""

    def __init__(
        self,
        current: Config,
        on_change: Callable[[Config], None],
        on_error: Callable[[ConfigError], None],
        *,
        interval_seconds: float = POLL_INTERVAL_S,
        environ: Mapping[str, str] = os.environ,
        isolated: bool = False,
        primer: Primer | None = None,
    ) -> None:
        self._current = current
        self._on_change = on_change
        self._on_error = on_error
        self._interval = interval_seconds
        self._environ = environ
        self._reported: list[str] | None = None  # problems of the rejected file, while it is bad
        # The files as the load of the rejected file saw them (loaded again once they change).
        self._attempted: tuple[str | None, ...] | None = None
        self._retry_at = 0.0
        self._hash_at = 0.0
        self._fingerprints = _Fingerprints(self._limit_of)
        self._loader = _IsolatedLoader(environ, current, primer) if isolated else None
        self.generation = 1  # configurations in force so far (the first one counts)
        self.applied_at = time.time()  # when the one in force was loaded or applied

    @property
    def rejected(self) -> list[str]:
        """The problems of the file on disk while it is rejected; empty when it is in force."""
        return list(self._reported or ())

    def changed(self, config: Config) -> tuple[Webhook, ...] | None:
        """For ``on_change``: the webhooks of ``config`` that are not the ones in force, when
        every other one is the very object in force, in the same order (what
        :meth:`Subscriptions.updated` takes to skip its passes over every webhook); else None."""
        return None if self._loader is None else self._loader.changed(config)

    @property
    def current(self) -> Config:
        """The configuration in force."""
        return self._current

    @property
    def primed(self) -> bool:
        """Whether the child processes know the webhooks in force (``isolated``, once
        :meth:`run` has started): a reload then ships only the webhooks that changed."""
        return self._loader is not None and self._loader.primed

    async def run(self) -> None:
        """Poll every ``interval_seconds`` until cancelled; no file can end the loop."""
        try:
            if self._loader is not None:
                self._loader.keep_spare = True
                if not self._loader.primed:  # (a Primer from the first load spares this)
                    await self._loader.prime(self._current)
                else:  # the first change finds a child ready, as every later one does
                    await self._loader.start_spare()
            while True:
                await asyncio.sleep(self._interval)
                await self.poll(retry_rejected=time.monotonic() >= self._retry_at)
        finally:
            if self._loader is not None:
                await self._loader.close()

    async def poll(self, retry_rejected: bool = True) -> None:
        """Check the files once; reload, then call ``on_change`` or ``on_error`` as needed.

        While the file on disk is rejected and no file changed since, it is loaded again only if
        ``retry_rejected``."""
        paths = self._watched()
        now = time.monotonic()
        seen = None
        self._fingerprints.in_place = False  # (said by this poll's look at the files)
        if now < self._hash_at and len(paths) <= STAT_ON_LOOP:
            seen = self._fingerprints.unchanged(paths)
        if seen is None:
            full = now >= self._hash_at
            if full:
                self._hash_at = now + HASH_EVERY_S
            seen = await asyncio.to_thread(self._fingerprints, paths, full)
        if self._reported is None:
            if seen == tuple(digest for _source, digest in self._current.sources):
                return
        elif seen == self._attempted and not retry_rejected:
            return
        seen = await self._settle(paths, seen)
        result: Config | ConfigError | None = await self._load()
        if isinstance(result, Config):
            result = self._apply(result)
        if isinstance(result, ConfigError):
            self._attempted = seen
            self._retry_at = time.monotonic() + REJECTED_RETRY_S
            if result.problems == self._reported:
                return
            self._reported = result.problems
            log.error(
                "config.rejected",
                extra={"fields": {"path": result.path, "problems": result.problems}},
            )
            self._on_error(result)

    def _watched(self) -> list[Path]:
        """The files the configuration in force was read from and, for a directory, its
        configuration files not in force (there only while they are rejected, or for the moment
        before a reload: a file added with a mistake, then fixed, is a change seen at once
        rather than at the next ``REJECTED_RETRY_S``)."""
        paths = [source for source, _digest in self._current.sources]
        directory = self._current.path
        if paths and paths[0] == directory and directory.is_dir():
            with contextlib.suppress(OSError):
                known = set(paths)
                paths += [path for path in config_files(directory) if path not in known]
        return paths

    def _limit_of(self, path: Path) -> int:
        """The largest file the loader reads at ``path``: the configuration file or one of the
        directory's, or else a secret file."""
        config = self._current.path
        if path == config or (path.parent == config and is_config_name(path.name)):
            return CONFIG_FILE_LIMIT_BYTES
        return SECRET_FILE_LIMIT_BYTES

    async def _settle(
        self, paths: Sequence[Path], seen: tuple[str | None, ...]
    ) -> tuple[str | None, ...]:
        """Wait until the files stay the same for ``SETTLE_S`` (at most ``SETTLE_MAX_S``): one
        load for a file written in several steps, or several times in a row.

        A file whose content changed under the same inode is being written in place (``cp``,
        a shell's ``>``, an editor that does not replace the file): what is there may be the
        first part of the new file, and a first part can be a valid configuration with fewer
        webhooks, whose records would then not be delivered to the others. It must stay the
        same for ``IN_PLACE_SETTLE_S`` (at most ``IN_PLACE_SETTLE_MAX_S``). A file replaced
        whole (a rename, Kubernetes' swap of ``..data``) has a new inode and is never seen
        half written."""
        started = quiet_since = time.monotonic()
        while True:
            in_place = self._fingerprints.in_place
            quiet = IN_PLACE_SETTLE_S if in_place else SETTLE_S
            longest = IN_PLACE_SETTLE_MAX_S if in_place else SETTLE_MAX_S
            now = time.monotonic()
            if now - quiet_since >= quiet or now - started >= longest:
                break
            await asyncio.sleep(SETTLE_S)
            again = await asyncio.to_thread(self._fingerprints, paths, True)
            if again != seen:
                seen = again
                quiet_since = time.monotonic()
        self._fingerprints.in_place = False
        return seen

    async def _load(self) -> Config | ConfigError:
        path = self._current.path
        try:
            if self._loader is not None:
                return await self._loader.load(self._current)
            return await asyncio.to_thread(load_config, path, self._environ)
        except ConfigError as exc:
            return exc
        except Exception as exc:
            return _internal(path, "reading", exc)

    def _apply(self, config: Config) -> ConfigError | None:
        """Hand a valid configuration over unless it is the one in force (then, after a rejected
        file, only say that it is in force again); a failing hand-over is a rejection."""
        recovered = self._reported is not None
        if config.sources == self._current.sources and not recovered:
            return None
        try:
            self._on_change(config)
        except Exception as exc:
            if self._loader is not None:
                self._loader.not_in_force()
            return _internal(config.path, "applying", exc)
        self._reported = None
        self._attempted = None
        self._current = config
        self.generation += 1
        self.applied_at = time.time()
        if self._loader is not None:
            self._loader.in_force(config)
        log.info(
            "config.reloaded",
            extra={"fields": {"path": str(config.path), "webhooks": len(config.webhooks)}},
        )
        return None


def _internal(path: Path, doing: str, exc: BaseException | str) -> ConfigError:
    """A failure nobody foresaw, as a rejection naming its type (never its message)."""
    name = exc if isinstance(exc, str) else type(exc).__name__
    log.error("config.reload_failed", extra={"fields": {"doing": doing, "error": name}})
    problem = f"{path}: internal error while {doing} the configuration ({name})"
    return ConfigError(str(path), [problem])


# ---- loading in a child process --------------------------------------------------------------


class WorkerFailed(Exception):
    """The loading process could not be started, died, or did not answer in time."""


class _IsolatedLoader:
    """Loads the configuration in a child process; keeps one started ahead of time.

    The children are plain :class:`subprocess.Popen` processes (started with ``vfork``, which
    costs the event loop nothing, unlike a ``fork`` of a process of this size), and the
    exchange with one runs on a thread, blocked in system calls that release the interpreter
    lock."""

    def __init__(
        self, environ: Mapping[str, str], current: Config, primer: Primer | None = None
    ) -> None:
        self._environ = environ
        self._key = secrets.token_bytes(32) if primer is None else primer.key
        self._spare: subprocess.Popen[bytes] | None = None
        # What the children know of the webhooks in force, once known (from the first load's
        # child): their digests, those of their YAML and their texts (see :func:`answer`),
        # written by a child and read by the next one only (this process never reads it:
        # at 10,000 webhooks that was milliseconds of the event loop's time per reload).
        self._state: bytes | None = None if primer is None else primer.state
        self._by_id: dict[str, Webhook] = {w.id: w for w in current.webhooks}
        # Loaded, not yet applied: the configuration, its webhooks by id, the children's state,
        # and its webhooks that are not those in force when the others are, in the same order.
        self._pending: (
            tuple[Config, dict[str, Webhook], bytes, tuple[Webhook, ...] | None] | None
        ) = None
        self.keep_spare = False  # start the next child as soon as one has answered (run())
        # Whether what ``on_change`` was handed last is known to be all in force or none of it
        # (see changed()).
        self._handed_whole = True

    @property
    def primed(self) -> bool:
        """Whether the digests of the webhooks in force are known."""
        return self._state is not None

    async def prime(self, current: Config) -> None:
        """Learn the digests of the configuration in force (a child loads the same files: when
        they have not changed since, its digests describe the webhooks in force)."""
        self._by_id = {w.id: w for w in current.webhooks}
        try:
            answer = await self._ask(current.path, b"", prime=True)
        except Exception:  # WorkerFailed, or anything else: the next load sends every webhook
            return
        if answer[0] == "primed" and tuple(answer[1]) == current.sources:
            self._state = answer[2]

    async def load(self, current: Config) -> Config:
        """The configuration on disk (ConfigError when invalid, or when the child failed),
        built from the webhooks in force wherever they did not change."""
        if not self._by_id:
            self._by_id = {w.id: w for w in current.webhooks}
        try:
            # (nothing in force known: every webhook is built and shipped)
            answer = await self._ask(current.path, self._state or b"")
        except WorkerFailed as exc:
            raise _internal(current.path, "reading", str(exc)) from None
        kind = answer[0]
        if kind == "rejected":
            raise ConfigError(answer[1], list(answer[2]))
        if kind != "config":
            raise _internal(current.path, "reading", str(answer[1]))
        _kind, sections, properties, order, count, chunks, state = answer
        changed: dict[str, Webhook] = {}
        slices = Slices()  # (a whole file of new webhooks is thousands: they come in slices)
        for chunk in chunks:
            changed.update((w.id, w) for w in pickle.loads(chunk))
            await slices.after_piece()
        # What the child compared with: the webhooks in force, once primed.
        base = self._by_id if self._state is not None else {}
        try:
            if order[0] == "all":  # removed or reordered webhooks: in the order given
                by_id = {i: changed.get(i) or base[i] for i in order[1]}
            else:  # the same ids in the same order, maybe some appended: updated in place
                by_id = base | changed
            if len(by_id) != count:
                raise KeyError(count)
        except KeyError:  # the state did not describe the webhooks in force: forget it
            self._state = None
            raise _internal(current.path, "reading", "WorkerOutOfStep") from None
        config = _assembled(sections, properties, tuple(by_id.values()))
        # (primed and in the same order: every other webhook is the one in force)
        said = tuple(changed.values()) if base and order[0] == "same" else None
        self._pending = (config, by_id, state, said)
        await asyncio.sleep(0)  # the hand-over gets a turn of its own
        return config

    def in_force(self, config: Config) -> None:
        """``config`` was applied: its webhooks and digests are the ones in force now."""
        pending, self._pending = self._pending, None
        self._handed_whole = True
        if pending is not None and pending[0] is config:
            _config, self._by_id, self._state, _changed = pending
        else:
            self._by_id, self._state = {w.id: w for w in config.webhooks}, None

    def changed(self, config: Config) -> tuple[Webhook, ...] | None:
        """The webhooks of ``config`` (loaded, not yet in force) that are not the ones in force,
        when every other one is the very object in force, in the same order; else None. Also
        None after a hand-over that failed: ``on_change`` may have put part of it in force
        (the index, say), so "the ones in force" is not known until one succeeds."""
        pending = self._pending
        if not self._handed_whole or pending is None or pending[0] is not config:
            return None
        return pending[3]

    def not_in_force(self) -> None:
        """``on_change`` failed on the configuration last loaded (some of it may be in force)."""
        self._handed_whole = False

    async def start_spare(self) -> None:
        """Start the next child now, if none is waiting."""
        if self._spare is None:
            with contextlib.suppress(WorkerFailed):
                self._spare = await asyncio.to_thread(_start)

    async def close(self) -> None:
        """Stop the spare child (it would also exit on its own when this process ends: its
        standard input closes)."""
        spare, self._spare = self._spare, None
        self.keep_spare = False
        if spare is not None:
            await asyncio.to_thread(_end, spare)

    async def _ask(self, path: Path, state: bytes, prime: bool = False) -> tuple[Any, ...]:
        """Send one request to the spare child (started now if there is none), start the next
        spare, and return the child's answer."""
        child, self._spare = self._spare, None
        if child is not None and child.poll() is not None:  # it died waiting
            await asyncio.to_thread(_end, child)
            child = None
        if child is None:
            child = await asyncio.to_thread(_start)
        request = _request(path, self._environ, self._key, state, prime)
        try:
            data = await asyncio.to_thread(_exchange, child, request)
        finally:
            await asyncio.to_thread(_end, child)
        if self.keep_spare:
            with contextlib.suppress(WorkerFailed):
                self._spare = await asyncio.to_thread(_start)
        answer: tuple[Any, ...] = pickle.loads(data)
        return answer


@dataclasses.dataclass(frozen=True)
class Primer:
    """What a child told of the webhooks it loaded: their digests under ``key``. Handed to the
    :class:`ConfigWatcher` of the same configuration, it spares the watcher a second load to
    learn them (:meth:`_IsolatedLoader.prime`)."""

    key: bytes
    state: bytes
    """What the children know of the webhooks loaded (see :func:`answer`)."""


def load_isolated(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """:func:`~bridge.config.loader.load_config` done in a child process (see
    :func:`load_isolated_primed`)."""
    return load_isolated_primed(path, environ)[0]


def load_isolated_primed(
    path: str | Path, environ: Mapping[str, str] | None = None
) -> tuple[Config, Primer | None]:
    """:func:`~bridge.config.loader.load_config` done in a child process, for ``bridge run``'s
    first load: the process then holds only the configuration, unpickled into fresh memory,
    never the parse's leftovers. (Loaded in place, 10,000 webhooks left the process 66 MB larger
    although the objects kept were 10 MB: the parse's freed memory stays scattered between
    them.) Also returns the webhooks' digests for the watcher (None when loaded in place).
    Raises ConfigError exactly as ``load_config`` does; where no child can be started or it
    fails, loads in this process instead."""
    environ = os.environ if environ is None else environ
    key = secrets.token_bytes(32)
    request = _request(Path(path), environ, key, b"")
    try:
        child = _start()
        try:
            reply: tuple[Any, ...] = pickle.loads(_exchange(child, request))
        finally:
            _end(child)
    except (WorkerFailed, pickle.UnpicklingError, EOFError):
        return load_config(path, environ), None
    if reply[0] == "rejected":
        raise ConfigError(reply[1], list(reply[2]))
    if reply[0] != "config":  # the child met something unforeseen: say it from here
        return load_config(path, environ), None
    _kind, sections, properties, _order, count, chunks, state = reply
    webhooks = tuple(w for chunk in chunks for w in pickle.loads(chunk))
    if len(webhooks) != count:
        return load_config(path, environ), None
    return _assembled(sections, properties, webhooks), Primer(key, state)


def _assembled(
    sections: Config, properties: dict[str, Any], webhooks: tuple[Webhook, ...]
) -> Config:
    """The configuration a child answered with (see :func:`answer`): its sections, its Kafka
    properties (sent as a dict: a mapping proxy cannot be pickled) and the webhooks."""
    kafka = dataclasses.replace(sections.kafka, properties=MappingProxyType(properties))
    config: Config = dataclasses.replace(sections, kafka=kafka, webhooks=webhooks)
    return config


def _request(
    path: Path, environ: Mapping[str, str], key: bytes, state: bytes, prime: bool = False
) -> bytes:
    """A request to a child (see :func:`answer`)."""
    return pickle.dumps(
        {"path": str(path), "environ": dict(environ), "key": key, "state": state, "prime": prime}
    )


def _start() -> subprocess.Popen[bytes]:
    """A child waiting for its request (its imports under way)."""
    try:
        return subprocess.Popen(
            [sys.executable, *WORKER_ARGS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in a terminal is the parent's to handle
        )
    except (OSError, ValueError) as exc:
        raise WorkerFailed(f"WorkerNotStarted: {type(exc).__name__}") from None


def _exchange(child: subprocess.Popen[bytes], request: bytes) -> bytes:
    """Send ``request`` to ``child`` and read its whole answer (on a thread).

    Written whole, then read whole, each in one call that waits in system calls without the
    interpreter lock (the child reads all of its request before it answers).
    ``Popen.communicate`` was the obvious tool, but it writes 512 bytes per turn of a Python
    loop: a state of megabytes took thousands of turns, each taking the lock back from the
    event loop. A timer kills a child that does not answer within ``WORKER_TIMEOUT_S``."""
    assert child.stdin is not None and child.stdout is not None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        with contextlib.suppress(ProcessLookupError):
            child.kill()

    timer = threading.Timer(WORKER_TIMEOUT_S, expire)
    timer.daemon = True
    timer.start()
    try:
        with contextlib.suppress(OSError):  # (it died: its answer says so)
            child.stdin.write(_HEADER.pack(_MAGIC, len(request)) + request)
            child.stdin.close()
        out = child.stdout.read()
    finally:
        timer.cancel()
    if expired.is_set():
        raise WorkerFailed("WorkerTimeout")
    if len(out) < _HEADER.size:
        raise WorkerFailed("WorkerExited")
    magic, size = _HEADER.unpack(out[: _HEADER.size])
    if magic != _MAGIC or len(out) != _HEADER.size + size:
        raise WorkerFailed("WorkerGarbled")
    return out[_HEADER.size :]


def _end(child: subprocess.Popen[bytes]) -> None:
    """Kill ``child`` if it still runs, reap it and close its pipes."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(10.0)
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _read_request(stream: Any) -> dict[str, Any] | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None  # the parent went away before it needed this child
    magic, size = _HEADER.unpack(head)
    if magic != _MAGIC:
        return None
    request: dict[str, Any] = pickle.loads(stream.read(size))
    return request


def answer(request: dict[str, Any]) -> tuple[Any, ...]:
    """What the child answers to one request (see :class:`_IsolatedLoader`).

    The request carries the state the previous child answered with (empty when nothing is
    known): the keyed digest of each webhook in force, in order; the digests of their YAML; the
    records of their texts, with the secrets and the context of the load that noted them
    (:class:`~bridge.config.loader.Reuse`). The webhooks whose YAML
    (or text) did not change are not built again; of those built, only the ones that differ
    from the webhooks in force are shipped. With ``prime``, nothing is shipped: the answer is
    the files read and the state, for the next request."""
    path = request["path"]
    key: bytes = request["key"]
    state: bytes = request.get("state") or b""
    known: dict[str, bytes]
    known, sources, texts, noted_secrets, context = (
        marshal.loads(state) if state else ({}, {}, {}, frozenset(), b"")
    )
    reuse = Reuse(key, sources, texts, noted_secrets, context)
    try:
        config, built = _built(path, request["environ"], reuse)
        try:
            digests = {i: built[i][1] if i in built else known[i] for i in reuse.order}
        except KeyError:  # (kept, but not in force: a state out of step) load it all again
            known, reuse = {}, Reuse(key, {})
            config, built = _built(path, request["environ"], reuse)
            digests = {i: built[i][1] for i in reuse.order}
    except ConfigError as exc:
        return ("rejected", exc.path, list(exc.problems))
    except Exception as exc:
        return ("internal", type(exc).__name__)
    # (marshal: plain data only, from this process's own child, and at 10,000 webhooks three
    # times as fast as pickle both ways)
    following = marshal.dumps(
        (digests, reuse.read, reuse.texts_read, reuse.secrets_read, reuse.context_read)
    )
    if request.get("prime"):
        return ("primed", config.sources, following)
    changed = [webhook for webhook, digest in built.values() if known.get(webhook.id) != digest]
    chunks = [pickle.dumps(changed[i : i + CHUNK]) for i in range(0, len(changed), CHUNK)]
    # The ids in order only when some were removed or moved; else the watcher keeps the ones
    # it has, in place, and the new ones come after them.
    order = tuple(digests)
    in_order = ("same",) if order[: len(known)] == tuple(known) else ("all", order)
    # A mapping proxy cannot be pickled: the properties travel as a dict, wrapped again there.
    properties = dict(config.kafka.properties)
    kafka = dataclasses.replace(config.kafka, properties=cast(Mapping[str, Any], {}))
    sections = dataclasses.replace(config, kafka=kafka, webhooks=())
    return ("config", sections, properties, in_order, len(order), chunks, following)


def _built(
    path: str, environ: Mapping[str, str], reuse: Reuse
) -> tuple[Config, dict[str, tuple[Webhook, bytes]]]:
    """The configuration loaded with ``reuse``, and each webhook it built with its digest."""
    config = load_config(path, environ, reuse)
    return config, {w.id: (w, webhook_digest(w, reuse.key)) for w in config.webhooks}


def worker_main() -> None:
    """The child process: read one request on stdin, load the file, write the answer, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)  # the deliveries first when CPU is short (the load waits)
    request = _read_request(sys.stdin.buffer)
    if request is None:
        return
    try:
        reply = answer(request)
    except Exception as exc:  # (answer catches the loader's failures; this is the rest)
        reply = ("internal", type(exc).__name__)
    try:
        data = pickle.dumps(reply)
    except Exception as exc:
        data = pickle.dumps(("internal", type(exc).__name__))
    sys.stdout.buffer.write(_HEADER.pack(_MAGIC, len(data)) + data)
    sys.stdout.buffer.flush()
