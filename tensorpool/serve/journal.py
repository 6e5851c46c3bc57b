"""The loss ledger's journal: what keeps a query's read-time loss across a ``serve`` restart.

``tensorpool serve`` appends one line per ledger record and per non-empty take
(:func:`~tensorpool.serve.core.journal_record`, :func:`~tensorpool.serve.core.journal_take`)
to ``loss-ledger.journal`` in its state directory, with one ``write`` on an ``O_APPEND``
descriptor: the line is in the kernel before the loss metadata is sent or the take is
answered, so it survives the process's end, SIGTERM or kill -9. It is not fsynced: a power
loss or a kernel crash may lose the last lines (the rings, in tmpfs, go with it anyway).

At start the journal is replayed (:meth:`~tensorpool.serve.core.LossLedger.replay`, which
skips a bad or unfinished line and counts it) and compacted: the live entries are written to
``loss-ledger.journal.tmp`` in the same directory and renamed over the journal.

Layout and ownership: the directory holds ``tensorpool-serve.lock`` (the marker: serve
creates it, and adopts only a new, empty or already marked directory; its ``flock`` keeps a
second serve out, and it holds the owner's pid for the refusal's message, and ``created``
when a serve made the directory itself), the journal and its temporary file. Serve writes,
replaces and truncates only those two names, under the lock.

Leaving nothing behind: a serve that stops with nothing owed (an empty ledger) removes the
journal and the marker, and the directory only when the marker says a serve created it (a
configured directory that was there before is never removed). A serve that stops owing loss
counts, or is killed, keeps them for the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections import Counter

from tensorpool.serve.core import LossLedger, journal_record

MARKER = "tensorpool-serve.lock"
JOURNAL = "loss-ledger.journal"
TMP = JOURNAL + ".tmp"
#: lines appended since the last compaction after which the journal is compacted again, once
#: it holds four times as many lines as the ledger has entries (so it stays bounded)
COMPACT_AFTER_LINES = 16384


class StateDirError(Exception):
    """The state directory cannot be used (the message says why, in one line)."""


class LedgerJournal:
    """The locked state directory of one serve and its journal's append descriptor."""

    def __init__(self, state_dir: str) -> None:
        """Create or adopt ``state_dir`` and lock it; :class:`StateDirError` if it is
        another program's directory or another serve holds it."""
        self.dir = os.path.abspath(state_dir)
        self.counters: Counter[str] = Counter()
        self._fd: int | None = None
        self._lines = 0
        self._ledger: LossLedger | None = None
        try:
            created = not os.path.isdir(self.dir)
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            marker = os.path.join(self.dir, MARKER)
            if not os.path.exists(marker) and os.listdir(self.dir):
                raise StateDirError(
                    f"--state-dir {self.dir}: not empty and not a tensorpool serve state "
                    f"directory (no {MARKER}); give a new or empty directory"
                )
            self._lock = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateDirError(f"--state-dir {self.dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = (os.pread(self._lock, 32, 0).decode(errors="replace").split() or ["?"])[0]
            os.close(self._lock)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise StateDirError(f"--state-dir {self.dir}: cannot lock: {exc}") from None
            raise StateDirError(
                f"--state-dir {self.dir}: another tensorpool serve (pid {holder}) "
                "uses it; give each serve its own --state-dir"
            ) from None
        self.created = created or b"created" in os.pread(self._lock, 64, 0)
        os.ftruncate(self._lock, 0)
        tag = "created" if self.created else "adopted"
        os.pwrite(self._lock, f"{os.getpid()}\n{tag}\n".encode(), 0)

    def load(self, ledger: LossLedger, now_ns: int, counters: Counter[str]) -> None:
        """Replay the journal into ``ledger``, compact it, and open it for appending; what
        was replayed, skipped and compacted is counted in ``counters`` (``loss_journal_*``)."""
        self.counters = counters
        self._ledger = ledger
        path = os.path.join(self.dir, JOURNAL)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.counters.update(ledger.replay(data, now_ns))
        self.compact(ledger)

    def compact(self, ledger: LossLedger) -> None:
        """Rewrite the journal as ``ledger``'s live entries (temp file, then rename)."""
        tmp = os.path.join(self.dir, TMP)
        body = b"".join(journal_record(*e) for e in ledger.entries())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(self.dir, JOURNAL))
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(
            os.path.join(self.dir, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        )
        self._lines = len(ledger)
        self.counters["loss_journal_compactions"] += 1

    def append(self, line: bytes, ledger: LossLedger) -> None:
        """Write one event line (the caller holds the ledger's lock, so the journal's order
        is the ledger's); compact once it has grown well past the ledger."""
        assert self._fd is not None, "load() first"
        _write_all(self._fd, line)
        self._lines += 1
        if self._lines > max(COMPACT_AFTER_LINES, 4 * len(ledger)):
            self.compact(ledger)

    def close(self) -> None:
        """Release the journal and the lock. With nothing owed, remove what serve made (see
        the module); otherwise the marker stays: it proves the directory is serve's at the
        next start."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._ledger is not None and len(self._ledger) == 0:
            for name in (JOURNAL, TMP, MARKER):  # the marker last: it is the proof
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, name))
            if self.created:
                with contextlib.suppress(OSError):  # not empty: something of someone else's
                    os.rmdir(self.dir)
        with contextlib.suppress(OSError):
            os.close(self._lock)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


__all__ = ["COMPACT_AFTER_LINES", "JOURNAL", "MARKER", "TMP", "LedgerJournal", "StateDirError"]
