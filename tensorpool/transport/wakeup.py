"""Blocking wakeup for idle consumers: one POSIX named semaphore per consumer of a stream.

Why: a consumer that polls Aeron must either spin (microsecond latency, one core at 100 %) or
back off into sleeps (``BackoffIdleStrategy``: near-zero CPU, but a frame that arrives while it
is parked waits for the rest of the park, up to ``max_park_ns`` = 1 ms plus the kernel's timer
slack). A semaphore gives both: the idle consumer blocks in ``sem_timedwait`` (a futex wait, no
CPU) and the producer's ``sem_post`` after each descriptor wakes it within the kernel's wakeup
latency. Measured (``bench/bench_wakeup.py``, docs/benchmarks/wakeup.md, loaded 2-vCPU VM) at
100 Hz / 1 kHz / 10 kHz: p50 65 / 23 / 15 us at 0.5 / 1.6 / 7.9 % of a core, against backoff's
552 / 151 / 27 us at 3.2 / 14.5 / 32.7 %; the producer pays ~6 us per post to a blocked
consumer (0.2 us to a busy one).

Model:

* :class:`SemaphoreIdleStrategy` (consumer side) creates its own semaphore
  ``/tensorpool-wake-<namespace>-<stream_id>-<pid>-<token>`` (``O_CREAT|O_EXCL``, mode 0600),
  and as an idle strategy blocks on it for at most ``max_wait_ns`` when a duty cycle found no
  work, so control-plane duties (announces, QoS, keepalives) still run at least that often.
  ``close()`` unlinks it: only the creator deletes it (it can prove it made it).
* :class:`WakePoster` (producer side) finds the semaphores of its stream by listing
  ``/dev/shm`` (glibc keeps a named semaphore ``/x`` as ``/dev/shm/sem.x``) every
  ``rescan_ns`` and posts each one after a descriptor went out. It posts only while a
  semaphore's value is 0, so a consumer that is busy (never idles) does not accumulate posts:
  at most one spurious wakeup follows a busy period. No wakeup is lost: the descriptor is in
  the Aeron log before the value is read, and a consumer that finds the value non-zero polls
  after taking it.

Why one semaphore per consumer and not one per stream: Aeron IPC delivers every descriptor to
every subscriber, but a post wakes exactly one waiter, so one shared semaphore would wake one
consumer per frame and leave the others asleep until their timeout.

Limits: Linux (glibc's ``/dev/shm/sem.*`` layout is how a producer discovers consumers); a
consumer killed with SIGKILL leaves its 32-byte ``/dev/shm/sem.tensorpool-wake-*`` entry behind
(the poster stops posting it once its pid is gone, and nothing deletes it because nothing can
prove who made it); a consumer that starts after the producer's last rescan sleeps up to
``max_wait_ns`` per frame until the next rescan (``rescan_ns``, 1 s by default). Same-user only
(mode 0600), like the SHM pools.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any, Final

from tensorpool.config_util import check_path_component

SEM_DIR: Final = Path("/dev/shm")
"""Where glibc keeps named semaphores: ``/name`` is the file ``/dev/shm/sem.name``."""
WAKE_PREFIX: Final = "tensorpool-wake-"
DEFAULT_MAX_WAIT_NS: Final = 10_000_000
"""Longest block per idle cycle: control duties run at least every 10 ms (keepalives and QoS
are 1 s periods; the consumer's control poll is rate-limited to every 100 us anyway)."""
DEFAULT_RESCAN_NS: Final = 1_000_000_000
_OWNER_RE: Final = re.compile(r"(\d+)-[0-9a-f]{8}")
"""What follows a stream's prefix in a consumer's name: ``<pid>-<token>``, nothing else (so a
namespace with ``-`` in it cannot pass for another namespace's stream: ``a`` + stream 1 vs
``a-1`` + stream 5)."""


def wake_prefix(namespace: str, stream_id: int) -> str:
    """Name prefix (without the leading ``/``) of every wake semaphore of one stream.

    The namespace follows the SHM directory rule (one path component: letters, digits, ``.``,
    ``_``, ``-``); the producer matches what follows the prefix exactly (:data:`_OWNER_RE`).
    """
    reason = check_path_component(namespace)
    if reason is not None:
        raise ValueError(f"wake semaphore namespace {reason}")
    if not 0 <= stream_id < 2**32:
        raise ValueError(f"stream_id must be a uint32, got {stream_id}")
    return f"{WAKE_PREFIX}{namespace}-{stream_id}-"


def _posix_ipc() -> Any:
    """The ``posix_ipc`` module, imported on first use so that importing this module is free."""
    try:
        import posix_ipc
    except ImportError as exc:  # pragma: no cover - posix-ipc is a declared dependency
        raise RuntimeError("the semaphore wakeup needs the posix-ipc package") from exc
    return posix_ipc


class SemaphoreIdleStrategy:
    """Idle strategy that blocks on this consumer's own wake semaphore (see module doc).

    ``idle(work)``: work > 0 returns at once; 0 blocks until the producer posts or
    ``max_wait_ns`` passes. Owns the semaphore: ``close()`` (or the context manager) unlinks it.
    """

    __slots__ = ("_busy", "_sem", "_timeout_s", "max_wait_ns", "path", "sem_name", "wakeups")
    name: Final = "semaphore"

    def __init__(
        self, namespace: str, stream_id: int, max_wait_ns: int = DEFAULT_MAX_WAIT_NS
    ) -> None:
        if max_wait_ns <= 0:
            raise ValueError(f"max_wait_ns must be > 0, got {max_wait_ns}")
        ipc = _posix_ipc()
        self.sem_name = f"/{wake_prefix(namespace, stream_id)}{os.getpid()}-{secrets.token_hex(4)}"
        self.path = SEM_DIR / f"sem.{self.sem_name[1:]}"
        self.max_wait_ns = max_wait_ns
        self._timeout_s = max_wait_ns / 1e9
        self.wakeups = 0
        """Idle cycles that ended by a post rather than the timeout."""
        # a signal (EINTR) ends the wait like the timeout: the loop then sees its stop flag
        # (a handler that raises, e.g. SIGINT's KeyboardInterrupt, still raises)
        self._busy: tuple[type[BaseException], ...] = (ipc.BusyError, ipc.SignalError)
        self._sem: Any = ipc.Semaphore(self.sem_name, ipc.O_CREX, 0o600, 0)

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            return
        sem = self._sem
        if sem is None:
            raise ValueError(f"{self.sem_name}: idle() after close()")
        try:
            sem.acquire(self._timeout_s)  # releases the GIL while blocked
        except self._busy:  # timed out or interrupted by a signal: run the duties
            return
        self.wakeups += 1

    def reset(self) -> None:
        pass

    def close(self) -> None:
        """Unlink and close the semaphore (idempotent). A producer still holding it open can
        post it harmlessly until its next rescan drops it."""
        sem, self._sem = self._sem, None
        if sem is None:
            return
        try:
            sem.unlink()
        finally:
            sem.close()

    def __enter__(self) -> SemaphoreIdleStrategy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WakePoster:
    """Producer side: post every consumer wake semaphore of one stream after each descriptor.

    ``post()`` costs one ``value`` read per consumer, plus one ``sem_post`` (an atomic
    increment, a ``futex`` wake only when the consumer is blocked) when the value is 0.
    ``maybe_rescan(now_ns)`` picks up new consumers and drops gone ones; call it from the duty
    cycle (it lists ``/dev/shm`` at most every ``rescan_ns``).
    """

    __slots__ = ("_ipc", "_next_scan_ns", "_prefix", "_sems", "rescan_ns")

    def __init__(self, namespace: str, stream_id: int, rescan_ns: int = DEFAULT_RESCAN_NS) -> None:
        self._ipc = _posix_ipc()
        self._prefix = "sem." + wake_prefix(namespace, stream_id)
        self.rescan_ns = rescan_ns
        self._next_scan_ns = 0
        self._sems: dict[str, Any] = {}

    @property
    def consumers(self) -> int:
        """Semaphores currently posted."""
        return len(self._sems)

    def rescan(self) -> None:
        """Open the semaphores of live consumers that appeared, close those of gone ones."""
        ipc = self._ipc
        found: set[str] = set()
        try:
            names = os.listdir(SEM_DIR)
        except OSError:
            names = []
        for entry in names:
            if not entry.startswith(self._prefix):
                continue
            owner = _OWNER_RE.fullmatch(entry[len(self._prefix) :])
            if owner is None:
                continue  # another stream whose namespace ends in "-<our stream id>"
            if not os.path.exists(f"/proc/{owner.group(1)}"):
                continue  # creator gone (SIGKILL): nothing to wake; its entry is not ours
            found.add(entry)
            if entry not in self._sems:
                try:
                    self._sems[entry] = ipc.Semaphore("/" + entry[4:])
                except (ipc.ExistentialError, ipc.PermissionsError):
                    found.discard(entry)  # unlinked meanwhile, or another user's
        for entry in [e for e in self._sems if e not in found]:
            self._sems.pop(entry).close()

    def maybe_rescan(self, now_ns: int) -> None:
        if now_ns >= self._next_scan_ns:
            self._next_scan_ns = now_ns + self.rescan_ns
            self.rescan()

    def post(self) -> None:
        """Wake every blocked consumer of the stream (call after the descriptor was offered)."""
        for sem in self._sems.values():
            if sem.value == 0:
                sem.release()

    def close(self) -> None:
        """Close (never unlink: the consumers own them) every semaphore."""
        sems, self._sems = self._sems, {}
        for sem in sems.values():
            sem.close()
