"""Read-time loss reports from executors to the reader on the Spark driver (same host).

Executors find frames overwritten between planning and reading; with ``failOnDataLoss=false``
the count must reach the next offset (``lostLate``), but a task cannot talk to the driver-side
reader. Executors run on the SHM host, so each task sends a small JSON datagram to the reader's
Unix socket in the *abstract* namespace (``@tensorpool-spark-loss-<pid>-[<kind>-]<random>``,
Linux). The reader keeps what it received until an offset records it (:func:`forget`).

Why a socket and not files: nothing is left behind (issue #13.6). An abstract socket has no
file; it goes away with the reader process however that ends, and Spark ends it with SIGTERM,
which runs no cleanup. (Until issue #13 the reports were files under
``<shmBaseDir>/.spark-loss/<pid>-...``, which stopped and failed queries left behind; the next
reader still removes such directories: :func:`sweep`.) The reader accepts reports only from
processes of its own user (``SO_PASSCRED``); a report to a reader that is gone is dropped, and
the executor's log line remains.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import struct
import uuid
from collections.abc import Iterable, Sequence
from typing import Final

from tensorpool.transport.process import pid_running

log = logging.getLogger("tensorpool.spark_source")

#: the directory of the file spools of tensorpool before issue #13 (swept, never created)
SPOOL_ROOT: Final = ".spark-loss"
ADDRESS_PREFIX: Final = "@tensorpool-spark-loss-"
_SPOOL_NAME: Final = re.compile(r"(\d+)-(?:[a-z]+-)?[0-9a-f]{12}")
_REPORT_NAME: Final = re.compile(r"\d+-\d+-\d+-[0-9a-f]{32}\.json|\.tmp-\w+")
_UCRED: Final = struct.Struct("iII")  # pid, uid, gid
_SEND_TIMEOUT_S: Final = 2.0


class _Inbox:
    """The reader's end: its socket and the reports received but not recorded in an offset."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self.sock.bind("\0" + address[1:])
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.pending: dict[str, tuple[int, int]] = {}  # token -> (stream, count)
        self._n = 0

    def drain(self) -> None:
        uid = os.getuid()
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(1024, socket.CMSG_SPACE(_UCRED.size))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # closed meanwhile
                log.warning("tensorpool: loss spool %s: %s", self.address, exc)
                return
            creds = [
                d for lvl, t, d in anc if (lvl, t) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
            ]
            if not creds or _UCRED.unpack(creds[0][: _UCRED.size])[1] != uid:
                log.warning(
                    "tensorpool: loss spool %s: ignored a report of another user", self.address
                )
                continue
            try:
                rec = json.loads(data)
                sid, n = int(rec["stream"]), int(rec["count"])
            except (ValueError, KeyError, TypeError):
                continue
            self._n += 1
            self.pending[f"{self.address}#{self._n}"] = (sid, n)


_INBOXES: dict[str, _Inbox] = {}


def make_spool(shm_base_dir: str, kind: str = "") -> str:
    """Open a fresh spool for a reader of this process and return its address (what executors
    get in the partitions); first remove file spools left by readers that are gone."""
    sweep(os.path.join(shm_base_dir, SPOOL_ROOT))
    tag = f"{kind}-" if kind else ""
    address = f"{ADDRESS_PREFIX}{os.getpid()}-{tag}{uuid.uuid4().hex[:12]}"
    _INBOXES[address] = _Inbox(address)
    return address


def sweep(root: str) -> list[str]:
    """Remove file spools under ``root`` left by reader processes that no longer exist.

    Only what can be proven to be one: a directory named ``<pid>-[<kind>-]<12 hex>`` whose pid
    is not a live process and that holds nothing but report files; then ``root`` if empty.
    Returns the removed paths.
    """
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed: list[str] = []
    for name in names:
        m = _SPOOL_NAME.fullmatch(name)
        if m is None or pid_running(int(m[1])):
            continue
        path = os.path.join(root, name)
        try:
            entries = os.listdir(path)
        except OSError:
            continue
        if not all(_REPORT_NAME.fullmatch(e) for e in entries):
            log.warning("tensorpool: not removing %s: it holds files a loss spool never has", path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    with contextlib.suppress(OSError):
        os.rmdir(root)  # only if empty: another reader of an older version may use it
    return removed


def remove_spool(spool: str | None) -> None:
    """The reader is done: close its spool (reports not recorded yet are dropped)."""
    inbox = _INBOXES.pop(spool, None) if spool is not None else None
    if inbox is not None:
        inbox.sock.close()


def report(spool: str, stream_id: int, epoch: int, count: int) -> None:
    """Executor side: record ``count`` frames of ``stream_id`` lost at reading."""
    msg = json.dumps({"stream": stream_id, "epoch": epoch, "count": count}).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.settimeout(_SEND_TIMEOUT_S)  # a full queue: the reader is not planning
            s.sendto(msg, "\0" + spool.removeprefix("@"))
    except OSError as exc:  # the reader is gone (query stopped): the log line remains
        log.warning("tensorpool: could not report loss to %s: %s", spool, exc)


def reachable(spool: str) -> bool:
    """Whether a report sent from here would reach ``spool``'s reader: its socket exists in
    this host's (network namespace's) abstract namespace. A remote stream's task decides by
    it whether its read-time loss may take this path (#18, :mod:`.remote`)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect("\0" + spool.removeprefix("@"))
    except OSError:
        return False
    return True


def collect(spool: str | None, streams: Sequence[int]) -> tuple[dict[int, int], list[str]]:
    """Reader side: loss counts per stream, and tokens of the reports (see :func:`forget`).

    Reports stay until forgotten: a plan that fails after collecting counts them again."""
    late: dict[int, int] = {}
    inbox = _INBOXES.get(spool) if spool is not None else None
    if inbox is None:
        return late, []
    inbox.drain()
    for sid, n in inbox.pending.values():
        if sid in streams and n > 0:
            late[sid] = late.get(sid, 0) + n
    return late, list(inbox.pending)


def forget(tokens: Iterable[str]) -> None:
    """Drop reports once an offset has recorded them."""
    for token in tokens:
        inbox = _INBOXES.get(token.rsplit("#", 1)[0])
        if inbox is not None:
            inbox.pending.pop(token, None)


__all__ = [
    "ADDRESS_PREFIX",
    "SPOOL_ROOT",
    "collect",
    "forget",
    "make_spool",
    "reachable",
    "remove_spool",
    "report",
    "sweep",
]
