"""FrameProgress policy on both sides, sans-IO (Wire §10.2.2, §10.1.2, §8.2, §8.3).

A producer may say how far it has filled a claimed slot while it writes it; a consumer that
opted in (``ConsumerHello.supportsProgress``) may then read the filled prefix before the
``FrameDescriptor`` arrives. The descriptor stays the only "frame available" signal: a
prefix read is never a frame (no ``frames`` count, no seq, no QoS), and a progress message is
advisory only.

Producer side, :class:`ProgressThrottle`: when a claimed frame's progress goes out.

* Off unless the producer is built with :class:`ProgressSettings` (the spec's "producers MAY
  omit FrameProgress entirely").
* §10.2.2 "only publish when at least one subscriber has ``supports_progress=true``": nothing is
  published until a ``ConsumerHello`` with ``supportsProgress`` arrived (``only_when_requested``,
  the default; turn it off to publish for consumers that never say hello, e.g. a ``tap``).
  A consumer's interest lasts while it is alive: until a hello without ``supportsProgress``,
  or until neither a hello nor a ``QosConsumer`` came from it for ``stale_ns`` (the producer's
  per-consumer stream window, §10.1.3), so a killed consumer stops costing progress messages.
* Per frame: ``STARTED`` once at the claim, then ``PROGRESS`` at most once per interval *and*
  only when the filled count advanced by at least the byte delta, then ``COMPLETE`` after the
  commit (with the descriptor, §15.18 step 8). The latest state held back by the interval is
  sent when the interval has passed (:meth:`ProgressThrottle.flush`, from the producer's duty
  cycle), so a writer that stops between steps is not left unreported.
* Hints (§10.1.2, §10.2.2): the smallest interval and byte delta any opted-in consumer asked for,
  never below the producer's floors; with no hints, the producer's own values (recommended
  250 µs and 64 KiB).
* ``bytes_filled`` must not go backwards and must not exceed the frame's ``values_len_bytes``
  (§10.2.2): a caller that breaks either gets a one-line ``ValueError`` and nothing is sent.

Consumer side, :class:`ProgressTracker`: which progress messages reach the application.
Dropped, each with a named reason counted in ``ConsumerStats.progress``:

* ``progress_epoch_mismatch``: not the mapped epoch (§10.2.1 applies to every data message);
* ``progress_header_index_mismatch``: ``headerIndex != frameId & (nslots - 1)`` (§10.2.1);
* ``progress_bad_state``: ``UNKNOWN`` or a value outside the enum;
* ``progress_regressed``: ``payloadBytesFilled`` or the state went backwards within a frame
  (§10.2.2 "consumers MUST drop if it regresses");
* ``progress_late``: ``STARTED``/``PROGRESS`` for a frame the consumer already took from its
  descriptor. A ``COMPLETE`` that arrives after its descriptor (they travel on different
  streams) is ignored without a count: it says nothing the descriptor did not.

The prefix read itself is the slot reader's (:meth:`tensorpool.shm.seqlock.SlotReader.
read_prefix`): seqlock-validated like any read, refused with a reason when the slot was reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tensorpool.counters import DropCounters
from tensorpool.specs.generated.wire import FrameProgressState

__all__ = [
    "PROGRESS_BAD_STATE",
    "PROGRESS_EPOCH_MISMATCH",
    "PROGRESS_HEADER_INDEX_MISMATCH",
    "PROGRESS_LATE",
    "PROGRESS_REGRESSED",
    "FrameProgress",
    "ProgressRequest",
    "ProgressSettings",
    "ProgressThrottle",
    "ProgressTracker",
]

STARTED: Final = int(FrameProgressState.STARTED)
PROGRESS: Final = int(FrameProgressState.PROGRESS)
COMPLETE: Final = int(FrameProgressState.COMPLETE)
_STATES: Final = frozenset({STARTED, PROGRESS, COMPLETE})
_NULL_U32: Final = 0xFFFFFFFF

PROGRESS_EPOCH_MISMATCH: Final = "progress_epoch_mismatch"
PROGRESS_HEADER_INDEX_MISMATCH: Final = "progress_header_index_mismatch"
PROGRESS_BAD_STATE: Final = "progress_bad_state"
PROGRESS_REGRESSED: Final = "progress_regressed"
PROGRESS_LATE: Final = "progress_late"

#: Frames whose progress the tracker remembers (one in flight is the common case).
_TRACKED_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class ProgressSettings:
    """A producer's FrameProgress policy; give one to ``Producer(progress=...)`` to turn it on.

    ``interval_us``/``bytes_delta``: the producer's defaults (Wire §10.2.2 recommends 250 µs and
    64 KiB); ``min_interval_us``/``min_bytes_delta``: the floors no consumer hint goes below.
    """

    interval_us: int = 250
    bytes_delta: int = 65_536
    min_interval_us: int = 0
    min_bytes_delta: int = 1
    only_when_requested: bool = True

    def __post_init__(self) -> None:
        for name in ("interval_us", "bytes_delta", "min_interval_us", "min_bytes_delta"):
            value = getattr(self, name)
            if not 0 <= value < _NULL_U32:
                raise ValueError(f"progress {name} must be in 0..{_NULL_U32 - 1}, got {value}")
        if self.min_bytes_delta < 1:
            raise ValueError("progress min_bytes_delta must be >= 1")


@dataclass(frozen=True, slots=True)
class ProgressRequest:
    """A consumer's opt-in (``Consumer(progress=...)``): ``supportsProgress`` in its hello, with
    optional throttling hints (None: the producer's defaults apply, §10.1.2)."""

    interval_us: int | None = None
    bytes_delta: int | None = None

    def __post_init__(self) -> None:
        for name in ("interval_us", "bytes_delta"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < _NULL_U32:
                raise ValueError(f"progress {name} must be in 0..{_NULL_U32 - 1}, got {value}")


@dataclass(frozen=True, slots=True)
class FrameProgress:
    """A progress message a consumer accepted: advisory, never a frame (§10.2.2)."""

    stream_id: int
    epoch: int
    frame_id: int
    header_index: int
    bytes_filled: int
    state: FrameProgressState


class ProgressThrottle:
    """When the producer publishes a claimed frame's progress (sans-IO; one frame at a time).

    The agent calls :meth:`start` at the claim, :meth:`update` per ``progress()`` call,
    :meth:`flush` from its duty cycle and :meth:`complete` after the commit; each returns the
    ``bytes_filled`` to publish, or None for nothing.
    """

    def __init__(self, settings: ProgressSettings, *, stale_ns: int | None = None) -> None:
        self.settings = settings
        self._hints: dict[int, tuple[int | None, int | None]] = {}
        self._stale_ns = stale_ns
        self._seen: dict[int, int] = {}  # an opted-in consumer's last hello or QoS
        self.interval_ns = settings.interval_us * 1000
        self.bytes_delta = settings.bytes_delta
        self.frame_id = -1
        self.header_index = 0
        self.limit = 0
        self._filled = 0  # the caller's latest count for the open frame
        self._sent = 0  # the count last published
        self._sent_ns = 0
        self.published = 0
        self.forgotten_stale = 0
        """Consumers whose interest was dropped because their QoS stopped (§10.1.3)."""

    # --- consumers' hellos and QoS ------------------------------------------------------------
    def on_hello(
        self,
        consumer_id: int,
        supports_progress: bool,
        interval_us: int | None,
        bytes_delta: int | None,
        now_ns: int = 0,
    ) -> None:
        """Remember who wants progress and with which hints (§10.1.2); a hello without
        ``supportsProgress`` withdraws that consumer's interest."""
        if supports_progress:
            self._hints[consumer_id] = (interval_us, bytes_delta)
            self._seen[consumer_id] = now_ns
        else:
            self._forget(consumer_id)
        self._choose_policy()

    def on_qos(self, consumer_id: int, now_ns: int) -> None:
        """A consumer's ``QosConsumer``: it is alive, so its interest holds (hellos are sent
        only on start and changes, §10.1.2)."""
        if consumer_id in self._seen:
            self._seen[consumer_id] = now_ns

    def forget_stale(self, now_ns: int) -> int:
        """Drop the interest of consumers with no hello or QoS for ``stale_ns`` (the
        producer's per-consumer stream window, §10.1.3): a killed consumer's hints must not
        keep progress going, or keep its finer interval. Returns how many were dropped."""
        if self._stale_ns is None:
            return 0
        stale = [c for c, seen in self._seen.items() if now_ns - seen > self._stale_ns]
        for consumer_id in stale:
            self._forget(consumer_id)
        if stale:
            self.forgotten_stale += len(stale)
            self._choose_policy()
        return len(stale)

    def _forget(self, consumer_id: int) -> None:
        self._hints.pop(consumer_id, None)
        self._seen.pop(consumer_id, None)

    def _choose_policy(self) -> None:
        s = self.settings
        intervals = [i for i, _ in self._hints.values() if i is not None]
        deltas = [d for _, d in self._hints.values() if d is not None]
        # §10.2.2: the most aggressive common policy within the producer's floors
        self.interval_ns = max(min(intervals, default=s.interval_us), s.min_interval_us) * 1000
        self.bytes_delta = max(min(deltas, default=s.bytes_delta), s.min_bytes_delta)

    @property
    def filled(self) -> int:
        """The open claim's latest reported count (0 when none is open)."""
        return self._filled if self.frame_id >= 0 else 0

    @property
    def interested(self) -> int:
        """Consumers whose latest hello asked for progress."""
        return len(self._hints)

    @property
    def active(self) -> bool:
        """Whether frames claimed now get progress at all."""
        return bool(self._hints) or not self.settings.only_when_requested

    # --- one frame --------------------------------------------------------------------------
    def start(self, frame_id: int, header_index: int, limit: int, now_ns: int) -> int | None:
        """A claim of ``limit`` bytes (its ``values_len_bytes``): ``STARTED`` with 0 bytes, or
        None when nobody wants progress (the frame then gets none at all)."""
        if not self.active:
            self.frame_id = -1
            return None
        self.frame_id = frame_id
        self.header_index = header_index
        self.limit = limit
        self._filled = self._sent = 0
        self._sent_ns = now_ns
        self.published += 1
        return 0

    def update(self, frame_id: int, filled: int, now_ns: int) -> int | None:
        """The writer reports ``filled`` bytes of ``frame_id`` final; the count to publish as
        ``PROGRESS`` now, or None (not started, below the delta, or inside the interval)."""
        if frame_id != self.frame_id:
            return None  # no progress for this frame (nobody wanted it at its claim)
        if filled < self._filled:
            raise ValueError(
                f"progress for frame {frame_id} went backwards: {filled} < {self._filled} bytes"
            )
        if filled > self.limit:
            raise ValueError(
                f"progress for frame {frame_id}: {filled} bytes exceed the frame's {self.limit}"
            )
        self._filled = filled
        return self.flush(now_ns)

    def flush(self, now_ns: int) -> int | None:
        """The latest count held back by the interval, once the interval has passed."""
        if self.frame_id < 0:
            return None
        filled = self._filled
        if filled - self._sent < self.bytes_delta and not (
            filled == self.limit and filled > self._sent
        ):
            return None  # below the delta (the last bytes of a frame always qualify)
        if now_ns - self._sent_ns < self.interval_ns:
            return None
        self._sent = filled
        self._sent_ns = now_ns
        self.published += 1
        return filled

    def cancel(self) -> None:
        """The open claim is gone (lease lost, epoch replaced): nothing more is said about it."""
        self.frame_id = -1

    def complete(self, frame_id: int, values_len: int) -> int | None:
        """After the commit: ``COMPLETE`` with the committed length, if the frame had progress."""
        if frame_id != self.frame_id:
            return None
        self.frame_id = -1
        self.published += 1
        return values_len


class ProgressTracker:
    """Which ``FrameProgress`` messages a consumer that opted in accepts (sans-IO)."""

    def __init__(self, counters: DropCounters) -> None:
        self.counters = counters
        # frame_id -> (bytes_filled, state) of the last accepted message
        self._frames: dict[int, tuple[int, int]] = {}

    def on_progress(
        self,
        stream_id: int,
        epoch: int,
        frame_id: int,
        header_index: int,
        bytes_filled: int,
        state_raw: int,
        *,
        mapped_epoch: int,
        mask: int,
        last_seq: int,
    ) -> FrameProgress | None:
        """Accept one message for the mapped epoch; None (counted) when it breaks a rule."""
        reason = None
        if epoch != mapped_epoch:
            reason = PROGRESS_EPOCH_MISMATCH
        elif header_index != frame_id & mask:
            reason = PROGRESS_HEADER_INDEX_MISMATCH
        elif state_raw not in _STATES:
            reason = PROGRESS_BAD_STATE
        elif frame_id <= last_seq:
            if state_raw == COMPLETE:
                return None
            reason = PROGRESS_LATE
        else:
            prev = self._frames.get(frame_id)
            if prev is not None and (bytes_filled < prev[0] or state_raw < prev[1]):
                reason = PROGRESS_REGRESSED
        if reason is not None:
            self.counters.increment(reason)
            return None
        frames = self._frames
        if len(frames) >= _TRACKED_MAX and frame_id not in frames:
            del frames[min(frames)]
        frames[frame_id] = (bytes_filled, state_raw)
        return FrameProgress(
            stream_id, epoch, frame_id, header_index, bytes_filled, FrameProgressState(state_raw)
        )

    def forget(self) -> None:
        """A new mapping: frame ids of the old epoch mean nothing any more."""
        self._frames.clear()
