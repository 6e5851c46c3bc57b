"""Offsets, admission control and loss accounting of the Spark source (sans-IO).

Offset model
------------
A source offset is, per stream, ``{"epoch": E, "seq": S, "lost": L, "lostLate": T}``:

* ``epoch``/``seq`` -- the *next* frame to read: everything below ``seq`` in ``epoch`` has been
  handed to Spark (or counted lost). A new epoch is a new producer incarnation whose frames
  start again at seq 0 (Wire Spec §15.2: producers reset ``seq`` on an epoch change).
* ``lost`` -- cumulative count, since the query started, of frames that were already gone when a
  micro-batch was *planned*: overwritten in the ring before the reader got to them, or left
  unread in an epoch that ended. These are known exactly at planning time, so they are part of
  the batch's definition: a batch ``[start, end)`` reads ``[start.seq + (end.lost - start.lost),
  end.seq)`` when both are in the same epoch (planned loss is always a prefix of the range).
* ``lostLate`` -- cumulative count of frames overwritten between planning and the executor's
  read (only with ``failOnDataLoss=false``); executors report them and the driver folds them into
  the next planned offset. Informational: it never changes what a batch reads.

Offsets are written as JSON dicts with a stable key order (streams by ascending id, then
``epoch, seq, lost, lostLate``): Spark stores them verbatim and compares them as strings.

An epoch change (the Kafka analogue: a topic deleted and recreated) is planned as a one-off
*transition* batch that ends at the first readable frame of the new epoch and reads nothing for
that stream; the frames of the old epoch the query had not read yet, if any, count as ``lost``.
If the reader never saw how far the old epoch got (e.g. it restarted after the change), that
number is unknown: with ``failOnDataLoss=true`` the query fails, otherwise it moves on and the
unknown count is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MAX_SEQ: Final = 2**63 - 1


class OffsetError(ValueError):
    """A checkpointed or user-supplied offset document is malformed."""


@dataclass(frozen=True, slots=True)
class StreamPos:
    """Per-stream offset: next ``seq`` to read in ``epoch`` plus cumulative loss counters."""

    epoch: int
    seq: int
    lost: int = 0
    lost_late: int = 0

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seq": self.seq, "lost": self.lost, "lostLate": self.lost_late}


Offsets = dict[int, StreamPos]


def encode_offsets(offsets: Mapping[int, StreamPos]) -> dict[str, dict[str, int]]:
    """The JSON-ready dict, streams in ascending id order (stable text for Spark)."""
    return {str(sid): offsets[sid].to_json() for sid in sorted(offsets)}


def _int_field(doc: Mapping[str, Any], key: str, sid: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise OffsetError(f"stream {sid}: {key} must be an integer >= 0, got {value!r}")
    return value


def decode_offsets(doc: object, streams: Sequence[int] | None = None) -> Offsets:
    """Parse an offset dict; with ``streams``, every one must be present (and nothing else)."""
    if not isinstance(doc, Mapping):
        raise OffsetError(f"offset must be a JSON object, got {type(doc).__name__}")
    out: Offsets = {}
    for key, value in doc.items():
        try:
            sid = int(key)
        except (TypeError, ValueError):
            raise OffsetError(f"offset key {key!r} is not a stream id") from None
        if not isinstance(value, Mapping):
            raise OffsetError(f"stream {key}: expected an object, got {value!r}")
        out[sid] = StreamPos(
            _int_field(value, "epoch", key),
            _int_field(value, "seq", key),
            _int_field(value, "lost", key, 0),
            _int_field(value, "lostLate", key, 0),
        )
    if streams is not None and set(out) != set(streams):
        raise OffsetError(
            f"offset streams {sorted(out)} differ from the query's streams {sorted(streams)}; "
            "a checkpoint cannot be reused with another 'streams' option"
        )
    return out


# --- what the driver sees of a ring --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RingState:
    """One scan of a stream's header ring: committed frames are ``[oldest, head)``."""

    epoch: int
    oldest: int
    head: int
    nslots: int

    @property
    def empty(self) -> bool:
        return self.head <= self.oldest


@dataclass(frozen=True, slots=True)
class Loss:
    """Frames a batch plan had to skip (reason ``overwritten`` or ``epoch_change``)."""

    stream_id: int
    epoch: int
    first_seq: int
    count: int | None  # None: unknown (epoch changed before the reader saw the old head)
    reason: str
    nslots: int = 0


#: Placeholder epoch of a stream that was not announced when the query started (real epochs
#: start at 1).
NOT_STARTED: Final = 0
OVERWRITTEN: Final = "overwritten"
EPOCH_CHANGE: Final = "epoch_change"
REGIONS_GONE: Final = "region_unavailable"


def loss_message(losses: Sequence[Loss]) -> str:
    """What was lost and what to change: the text users see when a query fails."""
    parts = []
    for ls in losses:
        n = "an unknown number of" if ls.count is None else f"{ls.count}"
        if ls.reason == EPOCH_CHANGE:
            parts.append(
                f"stream {ls.stream_id}: {n} frame(s) of epoch {ls.epoch} from seq {ls.first_seq} "
                "were never read: the producer restarted (new epoch) before the query caught up"
            )
        elif ls.reason == REGIONS_GONE:
            parts.append(
                f"stream {ls.stream_id}: frames of epoch {ls.epoch} from seq {ls.first_seq} "
                "could not be read: that epoch's regions are gone (the producer exited or "
                "restarted) before the query read them"
            )
        elif ls.count is None:
            parts.append(
                f"stream {ls.stream_id}: frame {ls.first_seq} of epoch {ls.epoch} (and maybe "
                "more) was overwritten in the ring"
                + (f" ({ls.nslots} slots)" if ls.nslots else "")
                + " between planning and reading the micro-batch"
            )
        else:
            last = ls.first_seq + ls.count - 1
            parts.append(
                f"stream {ls.stream_id}: {n} frame(s) lost (epoch {ls.epoch}, seq "
                f"{ls.first_seq}..{last}) -- overwritten in the ring"
                + (f" ({ls.nslots} slots)" if ls.nslots else "")
                + " before the query read them"
            )
    return (
        "tensorpool data loss: "
        + "; ".join(parts)
        + ". The query fell behind the producer. Give the ring more slots (header_nslots), put "
        "a rate limiter with a deeper ring in front of the stream, trigger more often or raise "
        "maxFramesPerTrigger/maxBytesPerTrigger, or set failOnDataLoss=false to skip lost frames "
        "(they are then counted in the offsets' 'lost'/'lostLate' fields)."
    )


# --- admission control ---------------------------------------------------------------------------
def split_budget(budget: int, wants: Sequence[int]) -> list[int]:
    """Share ``budget`` among streams in proportion to what each wants (largest remainder).

    Proportional, as Kafka's source splits ``maxOffsetsPerTrigger`` by lag: the stream with the
    deepest backlog is the one closest to losing frames. Ties go to the lower stream id, so the
    split is deterministic.
    """
    total = sum(wants)
    if total <= budget:
        return list(wants)
    if budget <= 0:
        return [0] * len(wants)
    shares = [budget * w // total for w in wants]
    left = budget - sum(shares)
    order = sorted(range(len(wants)), key=lambda i: (-(budget * wants[i] % total), i))
    for i in order:
        if left <= 0:
            break
        if shares[i] < wants[i]:
            shares[i] += 1
            left -= 1
    return shares


@dataclass(frozen=True, slots=True)
class Limits:
    """Admission limits for one micro-batch (None = unlimited)."""

    max_frames: int | None = None
    max_bytes: int | None = None


#: sizes(stream_id, epoch, first_seq, count) -> byte size of each frame (list of ints)
SizeFn = Callable[[int, int, int, int], Sequence[int]]


@dataclass(slots=True)
class Plan:
    end: Offsets
    losses: list[Loss]
    unknown_epoch_loss: list[Loss]
    frames: int  # frames admitted (to read) in this plan


class StreamPlanner:
    """Per-query driver state: turns ``(start, ring states, limits)`` into the next end offset.

    Remembers, per stream, the highest head seen in each epoch (to size the loss when an epoch
    ends before it was fully read) and the ``Trigger.AvailableNow`` target.
    """

    def __init__(self, streams: Sequence[int], start_at: Mapping[int, str] | None = None) -> None:
        self.streams = tuple(sorted(streams))
        self._seen: dict[int, tuple[int, int]] = {}  # stream -> (epoch, highest head seen)
        self.target: dict[int, tuple[int, int]] | None = None
        # where a stream that was not there when the query started begins ("earliest"/"latest")
        self.start_at = dict(start_at or {})

    def observe(self, stream_id: int, state: RingState) -> None:
        """Remember the highest head of the newest epoch (older epochs are never re-entered)."""
        prev = self._seen.get(stream_id)
        if (
            prev is None
            or state.epoch > prev[0]
            or (state.epoch == prev[0] and state.head > prev[1])
        ):
            self._seen[stream_id] = (state.epoch, state.head)

    def seen_head(self, stream_id: int, epoch: int) -> int | None:
        prev = self._seen.get(stream_id)
        return prev[1] if prev is not None and prev[0] == epoch else None

    def set_target(self, states: Mapping[int, RingState | None]) -> None:
        """``prepareForTriggerAvailableNow``: never plan past what exists right now."""
        self.target = {sid: (st.epoch, st.head) for sid, st in states.items() if st is not None}

    def plan(
        self,
        start: Mapping[int, StreamPos],
        states: Mapping[int, RingState | None],
        limits: Limits,
        sizes: SizeFn | None = None,
        late: Mapping[int, int] | None = None,
    ) -> Plan:
        end: Offsets = {}
        losses: list[Loss] = []
        unknown: list[Loss] = []
        # (stream, epoch, first readable seq, available count, planned loss)
        ready: list[tuple[int, int, int, int, int]] = []
        for sid in self.streams:
            pos = start[sid]
            add_late = (late or {}).get(sid, 0)
            st = states.get(sid)
            # the old epoch's head must be read before a new epoch's scan replaces it
            old_head = self.seen_head(sid, pos.epoch)
            if st is not None:
                self.observe(sid, st)
            if st is None or st.epoch < pos.epoch:
                # Not mapped (producer gone / not yet announced) or an older incarnation still
                # announcing: nothing new for this stream.
                end[sid] = StreamPos(pos.epoch, pos.seq, pos.lost, pos.lost_late + add_late)
                continue
            head = st.head
            tgt = None if self.target is None else self.target.get(sid)
            if tgt is not None:
                if st.epoch > tgt[0]:
                    # Data after the AvailableNow target lives in a newer epoch: stop here.
                    if pos.epoch >= tgt[0]:
                        end[sid] = StreamPos(pos.epoch, pos.seq, pos.lost, pos.lost_late + add_late)
                        continue
                elif st.epoch == tgt[0]:
                    head = min(head, tgt[1])
            if pos.epoch == NOT_STARTED:
                # The stream was not announced when the query started: it begins now, where
                # startingOffsets says, and nothing before that point counts as lost.
                first = st.oldest if self.start_at.get(sid, "earliest") == "earliest" else st.head
                end[sid] = StreamPos(st.epoch, min(first, head), pos.lost, pos.lost_late + add_late)
                continue
            if st.epoch > pos.epoch:
                # Transition batch: account for the old epoch, start at the new one's oldest.
                lost = 0
                if old_head is None:
                    unknown.append(Loss(sid, pos.epoch, pos.seq, None, EPOCH_CHANGE))
                elif old_head > pos.seq:
                    lost = old_head - pos.seq
                    losses.append(Loss(sid, pos.epoch, pos.seq, lost, EPOCH_CHANGE))
                first = min(st.head if st.empty else st.oldest, head)
                if first > 0:
                    losses.append(Loss(sid, st.epoch, 0, first, OVERWRITTEN, st.nslots))
                end[sid] = StreamPos(
                    st.epoch, first, pos.lost + lost + first, pos.lost_late + add_late
                )
                continue
            first = pos.seq
            planned_loss = 0
            if not st.empty and first < st.oldest:
                planned_loss = st.oldest - first
                losses.append(Loss(sid, st.epoch, first, planned_loss, OVERWRITTEN, st.nslots))
                first = st.oldest
            avail = max(0, head - first)
            ready.append((sid, st.epoch, first, avail, planned_loss))
            end[sid] = StreamPos(
                pos.epoch, first, pos.lost + planned_loss, pos.lost_late + add_late
            )

        wants = [r[3] for r in ready]
        if limits.max_frames is not None:
            wants = split_budget(limits.max_frames, wants)
        if limits.max_bytes is not None and sizes is not None and any(wants):
            wants = self._cut_bytes(ready, wants, limits.max_bytes, sizes)
        frames = 0
        for (sid, epoch, first, _avail, _pl), n in zip(ready, wants, strict=True):
            e = end[sid]
            end[sid] = StreamPos(epoch, first + n, e.lost, e.lost_late)
            frames += n
        return Plan(end, losses, unknown, frames)

    @staticmethod
    def _cut_bytes(
        ready: list[tuple[int, int, int, int, int]],
        wants: list[int],
        max_bytes: int,
        sizes: SizeFn,
    ) -> list[int]:
        per_stream = [
            list(sizes(sid, epoch, first, n)) if n else []
            for (sid, epoch, first, _a, _p), n in zip(ready, wants, strict=True)
        ]
        totals = [sum(s) for s in per_stream]
        shares = split_budget(max_bytes, totals)
        out: list[int] = []
        for sz, share in zip(per_stream, shares, strict=True):
            acc = 0
            k = 0
            for b in sz:
                if acc + b > share:
                    break
                acc += b
                k += 1
            out.append(k)
        if not any(out):
            # Progress guarantee (as Spark's file sources do with maxBytes): a frame larger
            # than the whole budget is admitted alone rather than stalling the query.
            for i, n in enumerate(wants):
                if n:
                    out[i] = 1
                    break
        return out


# --- partition planning --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Range:
    stream_id: int
    epoch: int
    first: int
    end: int  # exclusive

    @property
    def count(self) -> int:
        return self.end - self.first


def batch_ranges(start: Mapping[int, StreamPos], end: Mapping[int, StreamPos]) -> list[Range]:
    """Frames a batch ``[start, end)`` reads, per stream (deterministic: replays match)."""
    out = []
    for sid in sorted(end):
        e = end[sid]
        s = start.get(sid)
        if s is None or s.epoch != e.epoch:
            continue  # epoch transition batch: nothing to read for this stream
        first = s.seq + (e.lost - s.lost)
        if e.seq > first:
            out.append(Range(sid, e.epoch, first, e.seq))
    return out


def split_ranges(ranges: Sequence[Range], min_partitions: int | None) -> list[Range]:
    """One piece per range, or more so that there are at least ``min_partitions`` pieces.

    Pieces are handed out to ranges in proportion to their size (each range at least one),
    then each range is cut into nearly equal consecutive chunks.
    """
    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return []
    want = len(ranges) if min_partitions is None else max(min_partitions, len(ranges))
    total = sum(r.count for r in ranges)
    extra = split_budget(want - len(ranges), [r.count - 1 for r in ranges])
    pieces: list[Range] = []
    for r, more in zip(ranges, extra, strict=True):
        k = min(r.count, 1 + more)
        base, rem = divmod(r.count, k)
        at = r.first
        for i in range(k):
            n = base + (1 if i < rem else 0)
            pieces.append(Range(r.stream_id, r.epoch, at, at + n))
            at += n
    assert sum(p.count for p in pieces) == total
    return pieces


__all__ = [
    "EPOCH_CHANGE",
    "NOT_STARTED",
    "OVERWRITTEN",
    "REGIONS_GONE",
    "Limits",
    "Loss",
    "OffsetError",
    "Offsets",
    "Plan",
    "Range",
    "RingState",
    "StreamPlanner",
    "StreamPos",
    "batch_ranges",
    "decode_offsets",
    "encode_offsets",
    "loss_message",
    "split_budget",
    "split_ranges",
]
