"""One standalone producer per stream, enforced with an advisory file lock (#13.7).

A standalone producer owns its stream's regions: a second one started on the same stream
(same SHM base dir and namespace) used to pick the next epoch, delete the first one's epoch
directory and take the stream over in silence. Now the producer takes
``flock(LOCK_EX | LOCK_NB)`` on ``<shm_base_dir>/<namespace>/stream-<id>.producer.lock``
before it touches any region, and holds it while it runs. The kernel drops the lock when
the process dies (``kill -9`` included), so a dead producer never blocks its successor and
no pid-liveness heuristic (pid reuse) is involved; a live one is refused unless the new
producer is told to take over.

The file records the holder (pid, stream, start time) for the refusal message. It is
removed on a clean release *while still locked*, and so when recording the holder fails (a
full tmpfs: ``ENOSPC``), with the directories the attempt created (#30); a process that
locked a file which was meanwhile unlinked (or replaced) notices by comparing inodes and locks
again, so unlinking cannot let two producers hold "the same" lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time

from tensorpool.fsafety import make_dirs, remove_empty_dirs

__all__ = ["StreamBusy", "StreamLock", "stream_lock_path"]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class StreamBusy(RuntimeError):
    """Another live standalone producer holds the stream (pass ``takeover`` to proceed)."""

    def __init__(self, stream_id: int, path: str, owner: str) -> None:
        self.stream_id = stream_id
        self.path = path
        self.owner = owner
        held = f" ({owner})" if owner else ""
        super().__init__(
            f"stream {stream_id} already has a live standalone producer{held}, lock {path}: "
            "stop it first, or pass --takeover (takeover=True) to replace it"
        )


def stream_lock_path(shm_base_dir: str, namespace: str, stream_id: int) -> str:
    return os.path.join(shm_base_dir, namespace, f"stream-{stream_id}.producer.lock")


def _read_owner(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(256).strip()
    except OSError:
        return ""


class StreamLock:
    """The held lock of one stream (create with :meth:`try_acquire`)."""

    def __init__(self, path: str, fd: int, created_dirs: tuple[str, ...] = ()) -> None:
        self.path = path
        self._fd: int | None = fd
        self._created_dirs = created_dirs
        """Directories :meth:`try_acquire` made (deepest first): removed at release if empty."""

    @classmethod
    def try_acquire(
        cls, path: str, stream_id: int, *, dir_mode: int = 0o700, file_mode: int = 0o600
    ) -> StreamLock:
        """Lock ``path`` (creating its directory and file as needed) or raise StreamBusy."""
        created: list[str] = []
        try:
            for _ in range(100):  # another process unlinking between open and flock: retry
                created += make_dirs(os.path.dirname(path), dir_mode)
                try:
                    fd = os.open(
                        path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _O_CLOEXEC, file_mode
                    )
                except FileNotFoundError:  # a releasing producer removed the empty directory
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise StreamBusy(stream_id, path, _read_owner(path)) from None
                    raise
                try:
                    same = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:  # locked an inode its holder has just removed
                    os.close(fd)
                    continue
                lock = cls(path, fd, tuple(created))
                try:
                    lock._record_holder(stream_id, file_mode)
                except BaseException:  # e.g. ENOSPC on a full tmpfs: leave no lock file
                    lock.release()
                    raise
                return lock
            raise OSError(errno.EAGAIN, f"cannot lock {path}: it keeps being replaced")
        except BaseException:  # refused or failed: no directory of ours is left either
            remove_empty_dirs(created)
            raise

    def _record_holder(self, stream_id: int, file_mode: int) -> None:
        """Write who holds the lock (for a refused successor's message)."""
        assert self._fd is not None
        os.fchmod(self._fd, file_mode)
        text = f"pid={os.getpid()} stream={stream_id} since_unix_ns={time.time_ns()}\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode("ascii"), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the file (still locked, so nobody can hold it meanwhile) and unlock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(fd)  # closing the last descriptor drops the flock
        remove_empty_dirs(self._created_dirs)
