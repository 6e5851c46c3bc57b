"""One SHM driver per namespace (Driver Model §2.1), enforced with an advisory file lock.

The driver takes ``flock(LOCK_EX | LOCK_NB)`` on ``<shm.base_dir>/<shm.namespace>/driver.lock``
before it touches anything else under the namespace, and holds it for its whole life. The
kernel drops an ``flock`` when the last descriptor of the open file goes away, which includes
the process dying for any reason (``kill -9``, OOM, a crash), so a dead driver can never leave
the namespace locked: there is no stale-lock heuristic to get wrong.

The lock file also records who holds it (pid, instance id, start time) for the error message
a second driver prints. That text is informational only: the lock itself is the truth, and
the file is never unlinked (unlinking a lock file lets two processes lock two different
inodes of the "same" path).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from types import TracebackType
from typing import Self

from tensorpool.fsafety import make_dirs

__all__ = ["LOCK_FILE_NAME", "LockHeld", "NamespaceLock", "read_lock_owner"]

LOCK_FILE_NAME = "driver.lock"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LockHeld(RuntimeError):
    """Another live process holds the namespace lock."""

    def __init__(self, path: str, owner: str) -> None:
        self.path = path
        self.owner = owner
        detail = f" (held by {owner})" if owner else ""
        super().__init__(
            f"another SHM driver already serves this namespace: {path} is locked{detail}"
        )


def read_lock_owner(path: str) -> str:
    """The holder description written into the lock file ('' if unreadable)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(512).strip()
    except OSError:
        return ""


class NamespaceLock:
    """An exclusive, crash-safe lock on one namespace directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @classmethod
    def acquire(
        cls, namespace_dir: str, *, owner: str = "", dir_mode: int = 0o700, file_mode: int = 0o600
    ) -> NamespaceLock:
        """Create ``namespace_dir`` if needed and lock it, or raise :class:`LockHeld`.

        Directories it creates get exactly ``dir_mode`` and a lock file it creates exactly
        ``file_mode`` (#13.7: ``os.makedirs``/``os.open`` modes are narrowed by the umask, so
        a ``"660"`` namespace came out 0750/0640, not what docs/operator.md promises).
        Existing directories keep their mode: they are the operator's.
        """
        make_dirs(namespace_dir, dir_mode)
        lock = cls(os.path.join(namespace_dir, LOCK_FILE_NAME))
        lock._lock(owner, file_mode)
        return lock

    def _lock(self, owner: str, file_mode: int) -> None:
        flags = os.O_RDWR | os.O_NOFOLLOW | _O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, file_mode)
            os.fchmod(fd, file_mode)  # the umask must not narrow the configured mode
        except FileExistsError:
            fd = os.open(self.path, flags)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LockHeld(self.path, read_lock_owner(self.path)) from None
            raise
        self._fd = fd
        text = owner or f"pid={os.getpid()}"
        data = f"{text} since_unix_ns={time.time_ns()}\n".encode("ascii", "replace")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock (idempotent). The file stays: see the module docstring."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
