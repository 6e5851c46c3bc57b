"""Process hygiene of the Spark source's control-plane clients: exit hooks and the parent watch.

Attachments (:mod:`.attach`) register themselves and ``atexit`` closes them (detaching driver
leases) when the process exits normally. Spark ends its Python workers with SIGTERM and does not
always call ``stop()``; no SIGTERM handler is installed, so SIGTERM terminates at once (a Python
handler only runs when the main thread returns to Python: one that waited on a lock kept source
runners alive for hours after their JVM was gone, issue #13.6). The driver expires the lease of
a process that died that way (loss spools are abstract sockets: nothing to remove). In
a Spark worker process (started by the JVM), the first attachment also starts a daemon thread
that exits the process when its parent JVM goes away (:func:`watch_parent`). The batch readers'
shared announce probes (:func:`~.probe.shared_probe`, #15) follow the same rules: closed by
``atexit``, when unused for :data:`~.probe.PROBE_IDLE_S` or their media driver is gone, and they
start the parent watch in a Spark worker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Final, Protocol

from tensorpool.transport.process import watch_parent as watch_parent_process

log = logging.getLogger(__name__)


class _Closeable(Protocol):
    def close(self) -> None: ...


_OPEN: weakref.WeakSet[_Closeable] = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()
#: closers of other kinds of client (the shared probes), run after the attachments' close
_ALSO_CLOSE: list[Callable[[], object]] = []

#: set by the JVM in the environment of every Python worker it starts (pyspark ``worker_util``)
SPARK_WORKER_ENV: Final = (
    "PYTHON_WORKER_FACTORY_SECRET",
    "PYTHON_WORKER_FACTORY_PORT",
    "PYTHON_WORKER_FACTORY_SOCK_PATH",
)
#: exit status of a process whose parent went away (like a shell's 128 + SIGHUP)
EXIT_PARENT_GONE: Final = 129
_WATCH: threading.Thread | None = None


def close_all() -> int:
    """Close every attachment (and shared probe) of this process; returns how many
    attachments were open."""
    open_now = list(_OPEN)
    for a in open_now:
        with contextlib.suppress(Exception):
            a.close()
    for closer in list(_ALSO_CLOSE):
        with contextlib.suppress(Exception):
            closer()
    return len(open_now)


def is_spark_worker() -> bool:
    """Whether this process is a Python worker the Spark JVM started (its life is the JVM's)."""
    return any(k in os.environ for k in SPARK_WORKER_ENV)


def _parent_gone(parent: int, close_timeout_s: float) -> None:
    log.warning("tensorpool: parent process %d is gone; exiting", parent)
    # Detach leases if that can be done quickly; a wedged main thread may hold the locks.
    closer = threading.Thread(target=close_all, name="tensorpool-parent-gone", daemon=True)
    closer.start()
    closer.join(close_timeout_s)
    os._exit(EXIT_PARENT_GONE)


def watch_parent(poll_s: float = 0.5, close_timeout_s: float = 2.0) -> bool:
    """Exit this process (``os._exit``) soon after its parent process goes away (idempotent):
    :func:`tensorpool.transport.process.watch_parent` on the parent seen now. Before exiting it
    closes the attachments (detaching driver leases) for at most ``close_timeout_s``. Returns
    whether a watch runs.
    """
    global _WATCH
    with _HOOKS_LOCK:
        if _WATCH is not None:
            return True
        parent = os.getppid()
        _WATCH = watch_parent_process(parent, lambda: _parent_gone(parent, close_timeout_s), poll_s)
        return True


def register(a: _Closeable) -> None:
    """Close ``a`` at exit; in a Spark worker, start the parent watch."""
    _OPEN.add(a)
    if is_spark_worker():
        watch_parent()


def unregister(a: _Closeable) -> None:
    _OPEN.discard(a)


atexit.register(close_all)


def also_close(closer: Callable[[], object]) -> None:
    """Run ``closer`` in :func:`close_all` too (the shared probes register theirs on import)."""
    with _HOOKS_LOCK:
        _ALSO_CLOSE.append(closer)


__all__ = [
    "EXIT_PARENT_GONE",
    "also_close",
    "close_all",
    "is_spark_worker",
    "register",
    "unregister",
    "watch_parent",
]
