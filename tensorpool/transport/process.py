"""Stopping processes the one way every tensorpool daemon expects, from both ends.

Daemons (media driver, SHM driver, rate limiter, bridge) clean up on SIGTERM: announce
shutdown, release leases, remove their directories. So a stop is SIGTERM first and SIGKILL
only when the child ignores it for ``timeout_s`` -- a kill skips that cleanup, and the
caller must then clean up for it (e.g. remove an Aeron directory).

On the receiving side, :class:`StopSignals` is the one way a process asks its main loop to
stop. Two rules, both learnt from processes that outlived their parents (#13.6):

* The handler only stores a flag. Python runs handlers in the main thread between bytecodes,
  possibly while that thread holds a lock; a handler that takes one (``threading.Event.set``
  does) can wait for itself forever, and then no later signal is handled either.
* After the first signal the default action is restored, so a second SIGTERM or SIGINT ends
  the process even when its cleanup is stuck: a signal handler never keeps a process alive.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Final, Self

log = logging.getLogger(__name__)

#: Environment variable naming the process that started this one for itself (the demo's parts):
#: see :func:`exit_with_parent`.
PARENT_ENV: Final = "TENSORPOOL_PARENT_PID"


def proc_stat(pid: int) -> tuple[bytes, int] | None:
    """State and start time (clock ticks after boot) of process ``pid``, from
    ``/proc/<pid>/stat`` (fields 3 and 22); None when it cannot be read."""
    try:
        fields = _stat_fields(pid)
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _stat_fields(pid: int) -> list[bytes]:
    """``/proc/<pid>/stat`` from field 3 on (``comm`` may hold spaces and ``)``)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()


_NS_PER_S: Final = 1_000_000_000


def creator_stamp(pid_namespace: int, start_ticks: int) -> int:
    """The mtime (ns) a process stamps on a file it made, to prove later that it made it: its
    pid namespace's inode as the seconds, its start time (ticks, modulo 1e9) as the
    nanoseconds. Who made the file is then provable without a clock: same pid namespace as
    the one asking (else its pids mean nothing here), and a process now holding that pid is
    the creator only if it started at the same tick (``/proc/<pid>/stat``, boot-relative,
    immune to wall-clock steps)."""
    return pid_namespace * _NS_PER_S + start_ticks % _NS_PER_S


_PIDNS: list[int] = [0, 0]
"""``[pid, inode]``: this process's pid namespace, read once per process (``setns`` moves
only children; the pid key makes a forked child read its own)."""


def pid_namespace() -> int:
    """The inode of this process's pid namespace."""
    pid = os.getpid()
    if _PIDNS[0] != pid:
        _PIDNS[1] = os.stat("/proc/self/ns/pid").st_ino
        _PIDNS[0] = pid
    return _PIDNS[1]


def stamp_as_creator(path: str) -> None:
    """Stamp ``path`` with this process's :func:`creator_stamp` (not following a symlink);
    OSError when ``/proc`` cannot say who we are or the stamp cannot be set."""
    me = proc_stat(os.getpid())
    if me is None:
        raise OSError(f"/proc/{os.getpid()}/stat unreadable")
    ns = creator_stamp(pid_namespace(), me[1])
    os.utime(path, ns=(ns, ns), follow_symlinks=False)


def stamped_creator_gone(pid: int, mtime_ns: int) -> bool:
    """True only when ``mtime_ns`` is a :func:`creator_stamp` of this pid namespace and the
    process that stamped it under ``pid`` provably exited: the pid is dead or a zombie with
    no thread left (a zombie holds no mappings; another user's live process is never ours to
    judge), or it now belongs to a process that started at another tick (the pid was
    reused). A pid that is not a plain positive pid proves nothing (``0`` and ``-1`` name
    process groups, not a process), nor does a stamp of another pid namespace."""
    if pid <= 0 or mtime_ns // _NS_PER_S != pid_namespace():
        return False
    if not pid_running(pid):
        return True
    proc = proc_stat(pid)
    if proc is None:
        return False  # exited meanwhile (the next look sees it) or unreadable: keep
    return proc[1] % _NS_PER_S != mtime_ns % _NS_PER_S


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` of this pid namespace runs: it exists (another user's counts)
    and has not exited. A zombie (exited, not reaped yet) is gone -- unless other threads of it
    still run (a leader that returned before its threads also shows ``Z``). A pid that is not a
    plain positive pid is never probed: ``kill(0, 0)`` or ``kill(-1, 0)`` address groups.
    Callers decide deletions with it, so anything it cannot read counts as running."""
    if pid <= 0 or pid > 0x7FFFFFFF:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's process
        return True
    try:
        if _stat_fields(pid)[0] not in (b"Z", b"X"):
            return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except FileNotFoundError:  # reaped since the probe; or no procfs: the probe has to do
        return not os.path.isdir("/proc/self")
    except (OSError, ValueError, IndexError):
        return True


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that must not outlive this process (:func:`exit_with_parent`)."""
    return {**(os.environ if base is None else base), PARENT_ENV: str(os.getpid())}


def watch_parent(
    parent: int, on_gone: Callable[[], None], poll_s: float = 0.25
) -> threading.Thread:
    """Call ``on_gone`` from a daemon thread once ``parent`` is no longer this process's parent.

    ``os.getppid()`` changes only when the parent *process* dies and this one is re-parented
    (``PR_SET_PDEATHSIG`` fires when the parent *thread* that forked us exits, which in a JVM
    is any thread, and a Python signal handler needs the main thread).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("parent process %d is gone: stopping", parent)
        on_gone()

    thread = threading.Thread(target=watch, name="tensorpool-parent-watch", daemon=True)
    thread.start()
    return thread


_WATCHING = False


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def exit_with_parent(poll_s: float = 0.25) -> bool:
    """When :data:`PARENT_ENV` names this process's parent, stop (as on SIGTERM, so the
    command's own cleanup runs) once that parent is gone: a part of ``tensorpool demo`` whose
    demo was killed would otherwise run on forever. Returns whether the watch started.

    The variable is inherited by grandchildren, which must not obey it: it counts only while
    the named process is our parent. If it is already gone at start (it died before we got
    here), stop at once; if it is alive but not our parent, the variable is someone else's.
    Idempotent: one watch per process (a second SIGTERM would cut the cleanup short).
    """
    global _WATCHING
    if _WATCHING:
        return True
    text = os.environ.get(PARENT_ENV, "")
    if not text.isdigit():
        return False
    parent = int(text)
    if os.getppid() != parent:
        if not pid_running(parent):
            _WATCHING = True
            _terminate_self()
            return True
        return False
    _WATCHING = True
    watch_parent(parent, _terminate_self, poll_s)
    return True


def stop_process(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    timeout_s: float = 15.0,
    *,
    sig: int = signal.SIGTERM,
) -> tuple[int, bool]:
    """Signal ``proc`` (if still running), wait, kill on timeout.

    Returns ``(returncode, killed)``: ``killed`` is True when SIGKILL was needed, i.e. the
    child did not run its own cleanup.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout_s), False
    except subprocess.TimeoutExpired:
        log.warning("pid %d ignored signal %d for %.0f s; killing it", proc.pid, sig, timeout_s)
        proc.kill()
        return proc.wait(), True


class StopSignals:
    """``stop = StopSignals().install()`` then ``while not stop.requested: ...``."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> Self:
        """Install the handlers (only the main thread may; elsewhere this does nothing)."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True  # a plain store: no lock, see the module docstring
        self.signum = signum
        for sig in self.signals:
            signal.signal(sig, signal.SIG_DFL)  # the next one terminates

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


__all__ = [
    "PARENT_ENV",
    "StopSignals",
    "child_env",
    "creator_stamp",
    "exit_with_parent",
    "pid_namespace",
    "pid_running",
    "proc_stat",
    "stamp_as_creator",
    "stamped_creator_gone",
    "stop_process",
    "watch_parent",
]
