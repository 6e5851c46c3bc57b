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
  ``close()`` unlinks it: only the creator deletes it (it can prove it made it). It stamps
  the file's mtime with its pid namespace and process start tick
  (:func:`.process.creator_stamp`), so that after a SIGKILL a sweeper can prove the file's
  creator is gone.
* :class:`WakePoster` (producer side) finds the semaphores of its stream by listing
  ``/dev/shm`` (glibc keeps a named semaphore ``/x`` as ``/dev/shm/sem.x``) every
  ``rescan_ns`` and posts each one after a descriptor went out. A consumer names its
  semaphore with its consumer id as the token; while it reads a per-consumer descriptor stream
  (Wire §10.1.3) the producer posts it only after descriptors on that stream
  (:meth:`WakePoster.set_own_streams`, :meth:`WakePoster.post_consumer`). It posts only while a
  semaphore's value is 0, so a consumer that is busy (never idles) does not accumulate posts:
  at most one spurious wakeup follows a busy period. No wakeup is lost: the descriptor is in
  the Aeron log before the value is read, and a consumer that finds the value non-zero polls
  after taking it.
* **Leave nothing behind** (:func:`remove_if_abandoned`): a consumer killed with SIGKILL
  cannot unlink its 32-byte file, so two sweepers remove it, on proof only (exact name layout,
  regular file of our uid, mode within 0600, 32 bytes, our pid namespace's stamp, and the pid
  dead, a zombie with no thread left, or reused by a process that started at another tick):
  the producer's rescan (every ``rescan_ns``, so within 1 s of the kill while a producer of
  the stream runs) and every new consumer of the namespace before it creates its own
  (:func:`sweep_abandoned`: a restarted consumer clears its predecessor's even with no
  producer). Both are off the per-frame path; each counts (``removed``) and logs one line when
  it removed something. A consumer the producer already posts is re-checked by its pid only
  (one ``stat`` a second), so its file goes once its pid is gone: a zombie waits for its
  reaping, a pid reused within one rescan for the next sweep by a new consumer.
  Why a stamp: a pid alone proves nothing across pid namespaces (containers of one pod share
  ``/dev/shm`` but not pids) nor after pid reuse; comparing the file's mtime with the pid's
  start time would need the wall clock, and a clock stepped forward after the file was made
  would make a live creator look younger than its file and lose it its semaphore.

Why one semaphore per consumer and not one per stream: Aeron IPC delivers every descriptor to
every subscriber, but a post wakes exactly one waiter, so one shared semaphore would wake one
consumer per frame and leave the others asleep until their timeout.

Limits: Linux (glibc's ``/dev/shm/sem.*`` layout is how a producer discovers consumers); a
SIGKILLed consumer's file stays until a producer of its stream or a new consumer of its
namespace runs in the same pid namespace and as the same user (files of older tensorpool
versions, unstamped, stay for good: remove them by hand once their pid, the field after the
stream id, is gone); a consumer that starts after the producer's last rescan sleeps up to
``max_wait_ns`` per frame until the next rescan (``rescan_ns``, 1 s by default). Same-user only
(mode 0600), like the SHM pools.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Final

from tensorpool.config_util import check_path_component
from tensorpool.transport.process import stamp_as_creator, stamped_creator_gone

log = logging.getLogger(__name__)

SEM_DIR: Final = Path("/dev/shm")
"""Where glibc keeps named semaphores: ``/name`` is the file ``/dev/shm/sem.name``."""
WAKE_PREFIX: Final = "tensorpool-wake-"
DEFAULT_MAX_WAIT_NS: Final = 10_000_000
"""Longest block per idle cycle: control duties run at least every 10 ms (keepalives and QoS
are 1 s periods; the consumer's control poll is rate-limited to every 100 us anyway)."""
DEFAULT_RESCAN_NS: Final = 1_000_000_000
_OWNER_RE: Final = re.compile(r"([1-9][0-9]{0,6})-[0-9a-f]{8}")
"""What follows a stream's prefix in a consumer's name: ``<pid>-<token>``, nothing else (so a
namespace with ``-`` in it cannot pass for another namespace's stream: ``a`` + stream 1 vs
``a-1`` + stream 5). The pid as ``str(os.getpid())`` writes it (no sign, no leading zero, at
most 7 digits: Linux's ``PID_MAX_LIMIT`` is 2**22); the token is ``secrets.token_hex(4)``."""
_NAME_RE: Final = re.compile(
    r"sem\.tensorpool-wake-([A-Za-z0-9._-]+)-(0|[1-9][0-9]{0,9})-([1-9][0-9]{0,6})-[0-9a-f]{8}"
)
"""A whole wake semaphore file name as :class:`SemaphoreIdleStrategy` writes it (namespace,
stream id, pid, token), ASCII only, matched with ``fullmatch``: the first proof before a sweep
removes a file (:func:`remove_if_abandoned`)."""
SEM_FILE_SIZE: Final = 32
"""``sizeof(sem_t)`` on 64-bit glibc: what ``sem_open`` writes into ``/dev/shm/sem.<name>``."""


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


def remove_if_abandoned(entry: str) -> bool:
    """Unlink ``/dev/shm/<entry>`` if every proof holds that a dead tensorpool consumer made
    it; True if this call removed it.

    Deleting is privileged, so each of these must hold, else the file is kept: the name is
    exactly the layout :class:`SemaphoreIdleStrategy` writes (:data:`_NAME_RE`, a valid
    namespace, a uint32 stream id); the entry is a regular file (not followed if a link) owned
    by this uid, mode within 0600, ``sizeof(sem_t)`` bytes; its mtime is the creator stamp
    (:func:`.process.creator_stamp`) of this pid namespace; and the pid is dead, or a zombie,
    or now a process that started at another tick (pid reused). A file of another pid namespace, of
    another user, of an older tensorpool (no stamp) or not stamped yet (the instant between
    ``sem_open`` and the stamp) is kept. A concurrent unlink (the creator closing, another
    sweeper) is not an error.
    """
    m = _NAME_RE.fullmatch(entry)
    if m is None or check_path_component(m[1]) is not None or int(m[2]) >= 2**32:
        return False
    path = f"{SEM_DIR}/{entry}"  # a str: pathlib would cost more than the checks
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.getuid()
        or stat.S_IMODE(st.st_mode) & ~0o600
        or st.st_size != SEM_FILE_SIZE
        or not stamped_creator_gone(int(m[3]), st.st_mtime_ns)
    ):
        return False
    try:
        os.unlink(path)
    except OSError:  # FileNotFoundError: someone was first
        return False
    return True


def _log_removed(removed: list[str]) -> None:
    if removed:
        log.info(
            "removed %d wake semaphore(s) of dead consumers: %s",
            len(removed),
            " ".join(removed),
        )


def sweep_abandoned(namespace: str) -> list[str]:
    """Remove the wake semaphores of every dead consumer of ``namespace`` (any stream), each
    only on :func:`remove_if_abandoned`'s proofs; return the entries removed (logged in one
    line). Run when a consumer creates its own: a restarted consumer clears what its killed
    predecessor left, even with no producer running."""
    head = "sem." + WAKE_PREFIX + namespace + "-"
    try:
        names = os.listdir(SEM_DIR)
    except OSError:
        return []
    removed = []
    for entry in names:
        if not entry.startswith(head):
            continue
        m = _NAME_RE.fullmatch(entry)
        if m is not None and m[1] == namespace and remove_if_abandoned(entry):
            removed.append(entry)
    _log_removed(removed)
    return removed


class SemaphoreIdleStrategy:
    """Idle strategy that blocks on this consumer's own wake semaphore (see module doc).

    ``idle(work)``: work > 0 returns at once; 0 blocks until the producer posts or
    ``max_wait_ns`` passes. Owns the semaphore: ``close()`` (or the context manager) unlinks it.
    Creating one first sweeps the namespace (:func:`sweep_abandoned`): ``removed`` counts the
    dead consumers' semaphores that removed.
    """

    __slots__ = (
        "_busy",
        "_sem",
        "_timeout_s",
        "max_wait_ns",
        "path",
        "removed",
        "sem_name",
        "wakeups",
    )
    name: Final = "semaphore"

    def __init__(
        self,
        namespace: str,
        stream_id: int,
        max_wait_ns: int = DEFAULT_MAX_WAIT_NS,
        consumer_id: int | None = None,
    ) -> None:
        if max_wait_ns <= 0:
            raise ValueError(f"max_wait_ns must be > 0, got {max_wait_ns}")
        ipc = _posix_ipc()
        prefix = f"/{wake_prefix(namespace, stream_id)}{os.getpid()}-"
        # the token is the consumer id when known: its producer then posts it only after the
        # descriptors it reads (its own stream's, once it has one, §10.1.3), not the shared ones
        token = secrets.token_hex(4) if consumer_id is None else f"{consumer_id & 0xFFFF_FFFF:08x}"
        self.sem_name = prefix + token
        self.path = SEM_DIR / f"sem.{self.sem_name[1:]}"
        self.max_wait_ns = max_wait_ns
        self._timeout_s = max_wait_ns / 1e9
        self.wakeups = 0
        """Idle cycles that ended by a post rather than the timeout."""
        # a signal (EINTR) ends the wait like the timeout: the loop then sees its stop flag
        # (a handler that raises, e.g. SIGINT's KeyboardInterrupt, still raises)
        self._busy: tuple[type[BaseException], ...] = (ipc.BusyError, ipc.SignalError)
        self.removed = len(sweep_abandoned(namespace))
        try:
            self._sem: Any = ipc.Semaphore(self.sem_name, ipc.O_CREX, 0o600, 0)
        except ipc.ExistentialError:  # a second strategy of the same consumer: a random token
            self.sem_name = prefix + secrets.token_hex(4)
            self.path = SEM_DIR / f"sem.{self.sem_name[1:]}"
            self._sem = ipc.Semaphore(self.sem_name, ipc.O_CREX, 0o600, 0)
        self._stamp()

    def _stamp(self) -> None:
        """Stamp the file so that a sweeper can prove, after a SIGKILL, that its creator is
        gone (:func:`.process.creator_stamp`). Without the stamp the file is never swept (safe
        side)."""
        try:
            stamp_as_creator(str(self.path))
        except OSError as exc:
            log.warning("%s: not stamped, a sweep will never remove it: %s", self.path, exc)

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
        except _posix_ipc().ExistentialError:
            pass  # removed by hand: nothing left to unlink
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
    cycle (it lists ``/dev/shm`` at most every ``rescan_ns``). The scan also removes the
    semaphores of the stream's dead consumers (:func:`remove_if_abandoned`), so a SIGKILLed
    consumer's file is gone within ``rescan_ns``; ``removed`` counts them.
    """

    __slots__ = (
        "_ipc",
        "_next_scan_ns",
        "_own",
        "_own_ids",
        "_prefix",
        "_sems",
        "_shared",
        "removed",
        "rescan_ns",
    )

    def __init__(self, namespace: str, stream_id: int, rescan_ns: int = DEFAULT_RESCAN_NS) -> None:
        self._ipc = _posix_ipc()
        self._prefix = "sem." + wake_prefix(namespace, stream_id)
        self.rescan_ns = rescan_ns
        self._next_scan_ns = 0
        self._sems: dict[str, Any] = {}
        self._own_ids: frozenset[int] = frozenset()
        self._shared: tuple[Any, ...] = ()  # posted after each shared-stream descriptor
        self._own: dict[int, Any] = {}  # consumer id -> its semaphore, on its own stream
        self.removed = 0
        """Dead consumers' semaphore files this poster removed."""

    @property
    def consumers(self) -> int:
        """Semaphores currently posted."""
        return len(self._sems)

    def rescan(self) -> int:
        """Open the semaphores of live consumers that appeared, close those of gone ones and
        remove the files of provably dead ones; return how many files it removed."""
        ipc = self._ipc
        found: set[str] = set()
        removed: list[str] = []
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
            proc = f"/proc/{owner.group(1)}"
            if entry in self._sems and os.path.exists(proc):
                # posted already: the full check kept it when first seen, and a pid reused
                # within one rescan needs the pid space to wrap (the next new consumer's
                # sweep catches that); saves ~50 us a consumer a rescan
                found.add(entry)
                continue
            if remove_if_abandoned(entry):
                removed.append(entry)  # creator gone (SIGKILL), proven: the handle closes below
                continue
            if not os.path.exists(proc):
                continue  # creator gone but not provably ours (no stamp): not posted, kept
            found.add(entry)
            if entry not in self._sems:
                try:
                    self._sems[entry] = ipc.Semaphore("/" + entry[4:])
                except (ipc.ExistentialError, ipc.PermissionsError):
                    found.discard(entry)  # unlinked meanwhile, or another user's
        for entry in [e for e in self._sems if e not in found]:
            self._sems.pop(entry).close()
        self.removed += len(removed)
        _log_removed(removed)
        self._route()
        return len(removed)

    def set_own_streams(self, consumer_ids: frozenset[int]) -> None:
        """The consumers that read their own descriptor stream now (§10.1.3): their
        semaphores (named with their consumer id as the token) are posted by
        :meth:`post_consumer` after a descriptor on their stream, no longer by :meth:`post`
        (a 10 Hz consumer of a 1 kHz stream is woken 10 times a second, not 1000)."""
        self._own_ids = consumer_ids
        self._route()

    def _route(self) -> None:
        shared: list[Any] = []
        own: dict[int, Any] = {}
        for entry, sem in self._sems.items():
            cid = int(entry[-8:], 16)  # the token (_OWNER_RE: 8 hex digits)
            if cid in self._own_ids:
                own[cid] = sem
            else:
                shared.append(sem)
        self._shared = tuple(shared)
        self._own = own

    def maybe_rescan(self, now_ns: int) -> int:
        """:meth:`rescan` when due; return the files it removed (0 when not due)."""
        if now_ns >= self._next_scan_ns:
            self._next_scan_ns = now_ns + self.rescan_ns
            return self.rescan()
        return 0

    def post(self) -> None:
        """Wake every blocked consumer of the shared stream (call after the descriptor was
        offered)."""
        for sem in self._shared:
            if sem.value == 0:
                sem.release()

    def post_consumer(self, consumer_id: int) -> None:
        """Wake a consumer on its own stream (after a descriptor went out on it)."""
        sem = self._own.get(consumer_id)
        if sem is not None and sem.value == 0:
            sem.release()

    def close(self) -> None:
        """Close (never unlink: the consumers own them) every semaphore."""
        sems, self._sems = self._sems, {}
        self._shared, self._own = (), {}
        for sem in sems.values():
            sem.close()
