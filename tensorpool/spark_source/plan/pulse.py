"""``batching=pulse`` planning, sans-IO (#27.2): pulse offsets and the window planner.

A pulse offset records, per stream, how far the rate-aware batcher has been fed and the
batcher's own state, so one micro-batch is one closed pulse-aligned window across streams and a
replay cuts the same windows (:mod:`tensorpool.spark_source.spark.pulse` is the reader that
scans the rings and reads the windows' frames).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from tensorpool.batching import DEFAULT_TIMEOUT_FACTOR, RateAwareMessageBatcher
from tensorpool.spark_source.plan.offsets import (
    EPOCH_CHANGE,
    NOT_STARTED,
    OVERWRITTEN,
    Loss,
    RingState,
)
from tensorpool.spark_source.plan.offsets import loss_message as _loss_message

MAX_SEQ: Final = 2**63 - 1
PULSE_HINT: Final = (
    " With batching=pulse a frame must stay in its ring until its window closes and is read: "
    "give the ring room for several batchLengthS of frames."
)

#: (epoch, first, end) -- a run of consecutive frames of one stream, ``end`` exclusive
Run = tuple[int, int, int]


class PulseOffsetError(ValueError):
    """A checkpointed pulse offset is malformed or belongs to another query."""


# --- offsets (sans-IO) ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WindowRef:
    """The window one micro-batch delivers (times in the frames' clock domain).

    ``wall_offset_ns`` turns them into wall-clock time (``window_start`` / ``window_end``). It
    is sampled once, when the window is planned, and recorded: every stream's rows of the
    window -- and a replay in another process -- carry the very same wall-clock values, so a
    ``groupBy("window_start")`` never splits a window.
    """

    index: int
    start_ns: int
    end_ns: int
    reason: str
    wall_offset_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "reason": self.reason,
            "wall_offset_ns": self.wall_offset_ns,
        }


@dataclass(frozen=True, slots=True)
class StreamCursor:
    """Per stream: next frame to feed (``epoch``/``seq``), loss counters, the window's runs."""

    epoch: int
    seq: int
    lost: int = 0
    lost_late: int = 0
    frames: tuple[Run, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seq": self.seq,
            "lost": self.lost,
            "lostLate": self.lost_late,
            "frames": [list(r) for r in self.frames],
        }


@dataclass(frozen=True, slots=True)
class PulseOffset:
    window: WindowRef | None
    streams: Mapping[int, StreamCursor]
    batcher: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Stable key order: ``window``, streams by ascending id, ``batcher``."""
        doc: dict[str, Any] = {"window": None if self.window is None else self.window.to_json()}
        for sid in sorted(self.streams):
            doc[str(sid)] = self.streams[sid].to_json()
        doc["batcher"] = None if self.batcher is None else dict(self.batcher)
        return doc

    @classmethod
    def from_json(cls, doc: object, streams: Sequence[int]) -> PulseOffset:
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except json.JSONDecodeError as exc:
                raise PulseOffsetError(f"pulse offset is not JSON: {exc}") from None
        if not isinstance(doc, Mapping):
            raise PulseOffsetError(f"pulse offset must be a JSON object, got {type(doc).__name__}")
        if "window" not in doc or "batcher" not in doc:
            raise PulseOffsetError(
                "offset has no 'window'/'batcher': it was not written by a batching=pulse query "
                "(a checkpoint cannot switch between batching modes)"
            )
        window = _window(doc["window"])
        batcher = doc["batcher"]
        if batcher is not None and not isinstance(batcher, Mapping):
            raise PulseOffsetError("offset 'batcher' must be an object or null")
        cursors: dict[int, StreamCursor] = {}
        for key, value in doc.items():
            if key in ("window", "batcher"):
                continue
            try:
                sid = int(key)
            except (TypeError, ValueError):
                raise PulseOffsetError(f"offset key {key!r} is not a stream id") from None
            cursors[sid] = _cursor(key, value)
        if set(cursors) != set(streams):
            raise PulseOffsetError(
                f"offset streams {sorted(cursors)} differ from the query's streams "
                f"{sorted(streams)}; a checkpoint cannot be reused with another 'streams' option"
            )
        return cls(window, cursors, batcher)


def _nat(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise PulseOffsetError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def _window(value: object) -> WindowRef | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PulseOffsetError(f"offset 'window' must be an object or null, got {value!r}")
    try:
        start, end = value["start_ns"], value["end_ns"]
        reason = value["reason"]
        index = _nat(value["index"], "window index")
    except KeyError as exc:
        raise PulseOffsetError(f"offset 'window' has no {exc}") from None
    if type(start) is not int or type(end) is not int or end <= start:
        raise PulseOffsetError(f"offset 'window' needs integer start_ns < end_ns, got {value!r}")
    if not isinstance(reason, str):
        raise PulseOffsetError(f"offset 'window' reason must be a string, got {reason!r}")
    wall = value.get("wall_offset_ns", 0)
    if type(wall) is not int:
        raise PulseOffsetError(f"offset 'window' wall_offset_ns must be an integer, got {wall!r}")
    return WindowRef(index, start, end, reason, wall)


def _cursor(key: str, value: object) -> StreamCursor:
    if not isinstance(value, Mapping):
        raise PulseOffsetError(f"stream {key}: expected an object, got {value!r}")
    runs: list[Run] = []
    raw_runs = value.get("frames", [])
    if not isinstance(raw_runs, list):
        raise PulseOffsetError(f"stream {key}: 'frames' must be a list of [epoch, first, end]")
    for run in raw_runs:
        if not isinstance(run, list) or len(run) != 3:
            raise PulseOffsetError(f"stream {key}: frame run {run!r} is not [epoch, first, end]")
        e, a, b = (_nat(v, f"stream {key}: frame run") for v in run)
        if b <= a:
            raise PulseOffsetError(f"stream {key}: empty frame run {run!r}")
        runs.append((e, a, b))
    return StreamCursor(
        _nat(value.get("epoch"), f"stream {key}: epoch"),
        _nat(value.get("seq"), f"stream {key}: seq"),
        _nat(value.get("lost", 0), f"stream {key}: lost"),
        _nat(value.get("lostLate", 0), f"stream {key}: lostLate"),
        tuple(runs),
    )


def to_runs(frames: Iterable[Sequence[int]]) -> tuple[Run, ...]:
    """``(epoch, seq)`` pairs -> sorted runs of consecutive seqs ``(epoch, first, end)``.

    One run is one :func:`~tensorpool.spark_source.rings.mapped_rings.read_range` call on the
    executor; a dense stream's window is a single run, a relay with sequence gaps gives one per gap.
    """
    out: list[list[int]] = []
    for epoch, seq in sorted({(int(f[0]), int(f[1])) for f in frames}):
        last = out[-1] if out else None
        if last is not None and last[0] == epoch and last[2] == seq:
            last[2] = seq + 1
        else:
            out.append([epoch, seq, seq + 1])
    return tuple((e, a, b) for e, a, b in out)


# --- planning (sans-IO) --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamScan:
    """One scan of a stream's ring: the committed frames, intact across the scan.

    ``seqs`` ascending (int64) with their slot-header ``timestamps`` (int64, ns); ``head`` is one
    past the highest committed seq (0 for an empty ring).
    """

    epoch: int
    nslots: int
    seqs: np.ndarray
    timestamps: np.ndarray
    head: int

    @classmethod
    def of(cls, epoch: int, nslots: int, frames: Iterable[tuple[int, int]]) -> StreamScan:
        """From ``(seq, timestamp_ns)`` pairs (tests and tools)."""
        pairs = sorted(frames)
        seqs = np.asarray([s for s, _ in pairs], np.int64)
        ts = np.asarray([t for _, t in pairs], np.int64)
        return cls(epoch, nslots, seqs, ts, int(seqs[-1]) + 1 if seqs.size else 0)

    @classmethod
    def from_state(cls, st: RingState) -> StreamScan:
        """The frames a :class:`RingState` found committed and intact, with their stamps: what
        the pulse reader feeds, from the scan every reader shares (the ring port's, #27.2).

        ``st`` keeps the newest seq of every slot (a slot the producer rewrote during the scan
        holds its newer, uncommitted seq), but its committed seqs (:meth:`RingState.present`)
        are exactly the slots whose commit word was set and unchanged across the scan, and
        ``st.stamps`` are those slots' fields copied between the two loads: the same frames
        and timestamps a scan of the committed slots alone gives. A slot holds the frame whose
        ``seq & (nslots - 1)`` is its index (§15.18), which is how the stamps are looked up.
        """
        if st.stamps is None:
            raise ValueError(f"ring state of epoch {st.epoch} has no timestamps (not a scan)")
        seqs = st.present(st.oldest, st.head)
        stamps = np.asarray(st.stamps, np.int64)[seqs & (st.nslots - 1)]
        return cls(st.epoch, st.nslots, seqs, stamps, st.head)

    @property
    def empty(self) -> bool:
        return self.seqs.size == 0

    @property
    def oldest(self) -> int:
        return int(self.seqs[0]) if self.seqs.size else self.head


@dataclass(slots=True)
class Advance:
    """What one ``latestOffset`` found: the next offset (None: no window closed) and losses."""

    offset: PulseOffset | None
    losses: list[Loss] = field(default_factory=list)
    fed: int = 0  # frames offered to the batcher in this call


class PulsePlanner:
    """Turns ``(start offset, ring scans)`` into the offset of the next window (sans-IO).

    Holds only configuration; every call starts from the offset it is given, so the driver
    process can be replaced at any time (a restarted query, a replayed batch).
    """

    def __init__(
        self,
        streams: Sequence[int],
        gated: Iterable[int],
        batch_length_ns: int,
        *,
        timeout_factor: float = DEFAULT_TIMEOUT_FACTOR,
    ) -> None:
        self.streams = tuple(sorted(streams))
        self.gated = frozenset(gated)
        self.batch_length_ns = batch_length_ns
        self.timeout_factor = timeout_factor

    def new_batcher(self) -> RateAwareMessageBatcher[int, tuple[int, int]]:
        return RateAwareMessageBatcher(
            self.batch_length_ns, gated=self.gated, timeout_factor=self.timeout_factor
        )

    def batcher_from(
        self, state: Mapping[str, Any] | None
    ) -> RateAwareMessageBatcher[int, tuple[int, int]]:
        if state is None:
            return self.new_batcher()
        try:
            b: RateAwareMessageBatcher[int, tuple[int, int]] = RateAwareMessageBatcher.restore(
                state, gated=self.gated
            )
        except (ValueError, TypeError) as exc:
            raise PulseOffsetError(f"offset 'batcher': {exc}") from exc
        pending = b.pending_batch_length_ns
        if (b.batch_length_ns if pending is None else pending) != self.batch_length_ns:
            b.set_batch_length(self.batch_length_ns)  # batchLengthS changed across a restart
        return b

    def initial(
        self,
        scans: Mapping[int, StreamScan | None],
        starting: Callable[[int], str | tuple[int, int]],
    ) -> PulseOffset:
        """Where the query starts: per stream ``earliest`` / ``latest`` / ``(epoch, seq)``."""
        cursors: dict[int, StreamCursor] = {}
        for sid in self.streams:
            spec = starting(sid)
            sc = scans.get(sid)
            if isinstance(spec, tuple):
                cursors[sid] = StreamCursor(spec[0], spec[1])
            elif sc is None:
                cursors[sid] = StreamCursor(NOT_STARTED, 0)
            elif spec == "earliest":  # options.EARLIEST (plan/ never imports options)
                cursors[sid] = StreamCursor(sc.epoch, sc.oldest)
            else:
                assert spec == "latest"
                cursors[sid] = StreamCursor(sc.epoch, sc.head)
        return PulseOffset(None, cursors, None)

    def advance(
        self,
        start: PulseOffset,
        scans: Mapping[int, StreamScan | None],
        *,
        target: Mapping[int, tuple[int, int]] | None = None,
        late: Mapping[int, int] | None = None,
        wall_offset_ns: int = 0,
        heads: Mapping[tuple[int, int], int] | None = None,
    ) -> Advance:
        """The offset of the next window, or ``Advance(None)`` when none has closed.

        ``target`` (``Trigger.AvailableNow``): per stream ``(epoch, head)``; frames at or past
        it are not fed. ``late``: read-time losses reported by executors since ``start``.
        ``wall_offset_ns``: frames' clock -> wall clock, recorded in the window.
        ``heads``: ``(stream, epoch) -> head`` seen by earlier scans of this process, to size
        the unread rest of an epoch that ended (unknown after a restart: a loss of unknown size).
        """
        batcher = self.batcher_from(start.batcher)
        queued = batcher.take()
        losses: list[Loss] = []
        cursors = dict(start.streams)
        fed = 0
        if not queued:
            feeds: list[Iterator[tuple[int, int, int, int]]] = []
            for sid in self.streams:
                cur, feed, lost = self._stream_feed(
                    sid, cursors[sid], scans.get(sid), target, heads or {}
                )
                cursors[sid] = cur
                losses += lost
                if feed is not None:
                    feeds.append(feed)
            offer = batcher.offer
            reached: dict[int, tuple[int, int]] = {}
            for ts, sid, epoch, seq in heapq.merge(*feeds):
                fed += 1
                reached[sid] = (epoch, seq + 1)
                if offer(sid, ts, (epoch, seq)):
                    break
            else:
                batcher.settle()  # everything committed so far was fed: input drained
            for sid, (epoch, nxt) in reached.items():
                c = cursors[sid]
                cursors[sid] = StreamCursor(epoch, nxt, c.lost, c.lost_late)
            queued = batcher.take()
        if not queued:
            return Advance(None, losses, fed)
        win, rest = queued[0], queued[1:]
        state = batcher.snapshot()
        state["closed"] = [b.to_state() for b in rest]
        late = late or {}
        out: dict[int, StreamCursor] = {}
        for sid in self.streams:
            c = cursors[sid]
            out[sid] = StreamCursor(
                c.epoch,
                c.seq,
                c.lost,
                c.lost_late + late.get(sid, 0),
                to_runs(win.items(sid)),
            )
        ref = WindowRef(
            win.sequence, win.window_start_ns, win.window_end_ns, str(win.reason), wall_offset_ns
        )
        return Advance(PulseOffset(ref, out, state), losses, fed)

    @staticmethod
    def _stream_feed(
        sid: int,
        cur: StreamCursor,
        sc: StreamScan | None,
        target: Mapping[int, tuple[int, int]] | None,
        heads: Mapping[tuple[int, int], int],
    ) -> tuple[StreamCursor, Iterator[tuple[int, int, int, int]] | None, list[Loss]]:
        """Where feeding resumes for one stream, the frames to feed, and planned loss."""
        cur = StreamCursor(cur.epoch, cur.seq, cur.lost, cur.lost_late)  # drop the old runs
        losses: list[Loss] = []
        if sc is None or sc.epoch < cur.epoch:
            return cur, None, losses  # not announced, or an older incarnation still announcing
        if cur.epoch == NOT_STARTED:
            # Not announced when the query started: all it holds is newer than the start.
            cur = StreamCursor(sc.epoch, sc.oldest, cur.lost, cur.lost_late)
        elif sc.epoch > cur.epoch:
            # A new producer incarnation restarts at seq 0. Old-epoch frames already fed stay
            # in the batcher and are read (or found gone) with their own epoch's regions; those
            # never fed are lost with the old epoch (how many: the highest head seen of it), and
            # so is what the new ring no longer holds.
            unread = 0
            old_head = heads.get((sid, cur.epoch))
            if old_head is None:
                losses.append(Loss(sid, cur.epoch, cur.seq, None, EPOCH_CHANGE))
            elif old_head > cur.seq:
                unread = old_head - cur.seq
                losses.append(Loss(sid, cur.epoch, cur.seq, unread, EPOCH_CHANGE))
            gone = sc.oldest if not sc.empty else 0
            if gone:
                losses.append(Loss(sid, sc.epoch, 0, gone, OVERWRITTEN, sc.nslots))
            cur = StreamCursor(sc.epoch, gone, cur.lost + unread + gone, cur.lost_late)
        elif not sc.empty and cur.seq < sc.oldest:
            # Overwritten before they were even fed (exact for dense streams).
            gone = sc.oldest - cur.seq
            losses.append(Loss(sid, sc.epoch, cur.seq, gone, OVERWRITTEN, sc.nslots))
            cur = StreamCursor(cur.epoch, sc.oldest, cur.lost + gone, cur.lost_late)
        stop = MAX_SEQ
        if target is not None and sid in target:
            t_epoch, t_head = target[sid]
            if sc.epoch > t_epoch:
                return cur, None, losses  # AvailableNow: newer epoch, after the target
            if sc.epoch == t_epoch:
                stop = t_head
        seqs, stamps = sc.seqs, sc.timestamps
        lo = int(np.searchsorted(seqs, cur.seq, "left"))
        hi = int(np.searchsorted(seqs, stop, "left"))
        if hi <= lo:
            return cur, None, losses
        epoch = sc.epoch
        feed = (
            (ts, sid, epoch, seq)
            for ts, seq in zip(stamps[lo:hi].tolist(), seqs[lo:hi].tolist(), strict=True)
        )
        return cur, feed, losses


def pulse_loss_message(losses: Sequence[Loss]) -> str:
    return _loss_message(losses) + PULSE_HINT


__all__ = [
    "PULSE_HINT",
    "Advance",
    "PulseOffset",
    "PulseOffsetError",
    "PulsePlanner",
    "StreamCursor",
    "StreamScan",
    "WindowRef",
    "pulse_loss_message",
    "to_runs",
]
