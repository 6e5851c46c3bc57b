"""Offsets, admission control and loss accounting of the Spark source (sans-IO).

Offset model
------------
A source offset is, per stream, ``{"epoch", "seq", "frames", "lost", "lostLate"}``:

* ``epoch``/``seq`` -- a position in the stream's seq space: everything below ``seq`` in
  ``epoch`` has been planned. A batch ``[start, end)`` of one epoch reads *every frame
  committed in the ring with a seq in* ``[start.seq, end.seq)`` -- no more, no fewer. That
  definition needs no knowledge of which seqs exist: a normal producer publishes 0, 1, 2, ...;
  a relay (rate limiter, bridge) keeps its source's numbers, so its seqs have gaps. Because a
  single writer publishes in seq order, no frame can join a range after it was planned (the
  plan's ``end.seq`` never passes the highest committed seq + 1).
* ``frames`` -- cumulative count of frames admitted (planned to be read) since the query
  started. ``end.frames - start.frames`` is how many frames the batch had, so a replay in a new
  process (no memory of the plan) reads what is still in the ring and counts the rest as lost.
  Offsets written before this field existed decode with ``frames=None``: such a batch is read
  as "whatever is in the range", without that check.
* ``lost`` -- cumulative count of frames known, at planning, to have been published and
  overwritten before they were read (and unread frames of an epoch that ended). Informational:
  it does not define what a batch reads.
* ``lostLate`` -- cumulative count of planned frames that were gone when the executor read
  them (only with ``failOnDataLoss=false``); folded into the next offset.
* #17 (:mod:`.policy`; written only when non-zero): the cumulative counters ``late``,
  ``shedLag``, ``shedMemory`` (frames the source's policies flagged or left out on purpose,
  never loss), the batch's boundaries ``skipTo`` (frames of ``[start.seq, skipTo)`` are not
  read) and ``lateTo`` (frames below it get ``is_late``), and ``eventNs`` (the stream's
  watermark). Every policy decision is a seq prefix, so these make a replay exact.

Keys are written in that fixed order, streams by ascending id: Spark stores offsets verbatim
and compares them as text.

Planning
--------
The ring scan (:class:`RingState`: the seq held by every slot) is the authority for what is
readable. A plan takes, per stream, the committed seqs at or after ``start.seq`` in order and
admits the first ``n`` (``maxFramesPerTrigger``/``maxBytesPerTrigger`` count frames and
bytes, never seq span); ``end.seq`` is the last admitted seq + 1 (or the ring's head when
everything was admitted). Partitions carry the admitted seqs as compact runs ``[a, b)``: one
run for a normal stream (the executors' vectorized path), many for a relay.

Loss is found from the scan too: a seq ``s`` missing from the ring can only have been
overwritten if its slot (``s & (nslots-1)``) now holds a newer seq (slots only move forward).
How many of those candidates were really published:

* **dense stream** (the ring's committed seqs form one gap-free run): every seq was published,
  so every candidate is a lost frame -- exact.
* **sparse stream** (the ring shows gaps): the descriptors the driver received since it
  attached (:class:`DescriptorFeed`) say exactly which seqs were published, so the count is
  exact where that record is complete. Where it is not -- seqs published before the reader
  attached (after a restart), or descriptors dropped by the bounded intake -- the count is
  *unknown*: the plan reports it as a ``possible`` loss with an upper bound (the number of
  candidates), logs it, and does not add it to ``lost`` nor fail the query on it.

Descriptor intake: one queue per stream; each plan drains a stream's queue only as far as the
planned range reaches (the admitted frames' descriptors plus those of frames lost within the
range), so descriptors of later frames stay queued for the next trigger.

An epoch change (the Kafka analogue: a topic deleted and recreated) is planned as a one-off
*transition* batch that ends at the first readable frame of the new epoch and reads nothing for
that stream; unread frames of the old epoch count as ``lost``. If the reader never saw how far
the old epoch got (it restarted after the change), that number is unknown: with
``failOnDataLoss=true`` the query fails, otherwise it moves on and the unknown count is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

MAX_SEQ: Final = 2**63 - 1
_NO_RUNS: Final = np.empty((0, 2), np.int64)


class OffsetError(ValueError):
    """A checkpointed or user-supplied offset document is malformed."""


@dataclass(frozen=True, slots=True)
class StreamPos:
    """Per-stream offset: position ``seq`` in ``epoch``, frames admitted, loss counters."""

    epoch: int
    seq: int
    lost: int = 0
    lost_late: int = 0
    frames: int | None = 0  # None: an offset written before the field existed
    #: #17 (:mod:`.policy`), written only when non-zero so plain queries' offsets are unchanged:
    #: cumulative counters of late frames and frames shed for lag / the memory emergency ...
    late: int = 0
    shed_lag: int = 0
    shed_memory: int = 0
    #: ... this batch's boundaries: frames of ``[start.seq, skip_to)`` are not delivered (shed
    #: or late-dropped), frames below ``late_to`` are delivered with ``is_late`` ...
    skip_to: int = 0
    late_to: int = 0
    #: ... and the stream's watermark: highest event time delivered (ns, wall clock)
    event_ns: int = 0

    def to_json(self) -> dict[str, int]:
        if self.frames is None:
            out = {
                "epoch": self.epoch,
                "seq": self.seq,
                "lost": self.lost,
                "lostLate": self.lost_late,
            }
        else:
            out = {
                "epoch": self.epoch,
                "seq": self.seq,
                "frames": self.frames,
                "lost": self.lost,
                "lostLate": self.lost_late,
            }
        for key, value in (
            ("late", self.late),
            ("shedLag", self.shed_lag),
            ("shedMemory", self.shed_memory),
            ("skipTo", self.skip_to),
            ("lateTo", self.late_to),
            ("eventNs", self.event_ns),
        ):
            if value:
                out[key] = value
        return out


Offsets = dict[int, StreamPos]
#: the optional #17 fields, in StreamPos order
_POLICY_KEYS: Final = ("late", "shedLag", "shedMemory", "skipTo", "lateTo", "eventNs")


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
            _int_field(value, "frames", key) if "frames" in value else None,
            *(_int_field(value, k, key, 0) for k in _POLICY_KEYS),
        )
    if streams is not None and set(out) != set(streams):
        raise OffsetError(
            f"offset streams {sorted(out)} differ from the query's streams {sorted(streams)}; "
            "a checkpoint cannot be reused with another 'streams' option"
        )
    return out


def grow_offsets(offsets: Mapping[int, StreamPos], streams: Sequence[int]) -> Offsets:
    """A discovering query's offset over its grown stream set (#16.4).

    With ``streams="*"`` or a range, an offset (a checkpointed one included) may lack streams
    discovered after it was written: they have not started (:data:`NOT_STARTED`) and begin
    where a stream that appears later does, at its earliest frame. Streams of the offset
    that are not in ``streams`` are kept (the caller attaches them).
    """
    out = dict(offsets)
    for sid in streams:
        if sid not in out:
            out[sid] = StreamPos(NOT_STARTED, 0)
    return out


# --- seq runs ------------------------------------------------------------------------------------
def to_runs(seqs: np.ndarray) -> np.ndarray:
    """Sorted unique seqs -> ``(k, 2)`` int64 runs ``[a, b)`` (one run for a dense range)."""
    n = len(seqs)
    if n == 0:
        return _NO_RUNS
    seqs = np.asarray(seqs, np.int64)
    breaks = np.flatnonzero(np.diff(seqs) != 1) + 1
    starts = seqs[np.concatenate(([0], breaks))]
    ends = seqs[np.concatenate((breaks - 1, [n - 1]))] + 1
    return np.stack([starts, ends], axis=1)


def runs_count(runs: np.ndarray) -> int:
    return int((runs[:, 1] - runs[:, 0]).sum()) if len(runs) else 0


def runs_seqs(runs: np.ndarray) -> np.ndarray:
    if not len(runs):
        return np.empty(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs.tolist()])


def iter_seq_chunks(runs: np.ndarray, step: int) -> Iterator[np.ndarray]:
    """The seqs of ``runs`` in order, ``step`` at a time (a long dense run is sliced lazily)."""
    pending: list[np.ndarray] = []
    have = 0
    for a, b in runs.tolist():
        while a < b:
            k = min(b - a, step - have)
            pending.append(np.arange(a, a + k, dtype=np.int64))
            have += k
            a += k
            if have == step:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def _cut_runs(runs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``runs`` after its first ``n`` frames."""
    lens = runs[:, 1] - runs[:, 0]
    cum = np.cumsum(lens)
    i = int(np.searchsorted(cum, n))  # run holding frame n-1 (or the cut is a run boundary)
    if i >= len(runs):
        return runs, _NO_RUNS
    before = int(cum[i] - lens[i])
    inside = n - before
    if inside == 0:
        return runs[:i], runs[i:]
    a, b = int(runs[i, 0]), int(runs[i, 1])
    head = np.concatenate([runs[:i], [[a, a + inside]]]).astype(np.int64)
    tail = runs[i:].copy()
    tail[0, 0] = a + inside
    if a + inside == b:
        tail = tail[1:]
    return head, tail


# --- what the driver sees of a ring --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RingState:
    """One scan of a stream's header ring: committed frames lie in ``[oldest, head)``.

    ``slot_seq`` is the seq each slot holds (committed or being written; -1 empty), ``seqs``
    the committed seqs sorted when they do *not* form one gap-free run (None when they do),
    ``lens`` each slot's ``values_len_bytes``. States built without ``slot_seq`` describe a
    dense ring holding exactly ``[oldest, head)`` (used by tests and old callers).
    """

    epoch: int
    oldest: int
    head: int
    nslots: int
    slot_seq: np.ndarray | None = field(default=None, compare=False, repr=False)
    seqs: np.ndarray | None = field(default=None, compare=False, repr=False)
    lens: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: each slot's ``timestamp_ns`` (the start margin's rate forecast, #16.1), None if not scanned
    stamps: np.ndarray | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_slots(
        cls,
        epoch: int,
        slot_seq: np.ndarray,
        committed: np.ndarray,
        lens: np.ndarray | None = None,
        stamps: np.ndarray | None = None,
    ) -> RingState:
        """Build from per-slot seqs and committed flags (what :meth:`MappedStream.scan` reads)."""
        nslots = len(slot_seq)
        slot_seq = np.asarray(slot_seq, np.int64)
        c = slot_seq[np.asarray(committed, bool)]
        if c.size == 0:
            return cls(epoch, 0, 0, nslots, slot_seq, None, lens, stamps)
        oldest, last = int(c.min()), int(c.max())
        seqs = None if last - oldest + 1 == c.size else np.sort(c)
        return cls(epoch, oldest, last + 1, nslots, slot_seq, seqs, lens, stamps)

    @property
    def empty(self) -> bool:
        return self.head <= self.oldest

    @property
    def gapped(self) -> bool:
        """The committed seqs have holes: evidence of a sparse (relay) stream."""
        return self.seqs is not None

    def present(self, lo: int, hi: int) -> np.ndarray:
        """Committed seqs in ``[lo, hi)``, ascending."""
        if self.seqs is None:
            a, b = max(lo, self.oldest), min(hi, self.head)
            return np.arange(a, max(a, b), dtype=np.int64)
        s = self.seqs
        return s[np.searchsorted(s, lo) : np.searchsorted(s, hi)]

    def lens_of(self, seqs: np.ndarray) -> np.ndarray | None:
        if self.lens is None:
            return None
        return self.lens[np.asarray(seqs, np.int64) & (self.nslots - 1)].astype(np.int64)

    def maybe_overwritten(self, lo: int, hi: int) -> tuple[int, int, int]:
        """Seqs in ``[lo, hi)`` absent from the ring whose slot holds a newer seq.

        Only those can have been published and overwritten (a seq whose slot holds an older
        frame, or none, was never written). Returns ``(count, first, last)``; for a dense
        stream every one of them is a lost frame. Computed per slot in O(nslots).
        """
        if hi <= lo or self.empty:
            return 0, lo, lo
        if self.slot_seq is None:
            top = min(hi, self.oldest)
            return (top - lo, lo, top - 1) if top > lo else (0, lo, lo)
        n = self.nslots
        i = np.arange(n, dtype=np.int64)
        top = np.minimum(self.slot_seq, hi)
        f = lo + ((i - lo) % n)  # first seq >= lo that maps to slot i
        cnt = np.where(top > f, (top - f + n - 1) // n, 0)
        total = int(cnt.sum())
        if not total:
            return 0, lo, lo
        has = cnt > 0
        return total, int(f[has].min()), int((f + (cnt - 1) * n)[has].max())


@dataclass(frozen=True, slots=True)
class Loss:
    """Frames a plan found gone (reason ``overwritten`` or ``epoch_change``)."""

    stream_id: int
    epoch: int
    first_seq: int
    count: int | None  # None: unknown (see at_most)
    reason: str
    nslots: int = 0
    last_seq: int | None = None  # highest seq concerned, when known
    at_most: int | None = None  # upper bound of an unknown count (sparse streams)


#: Placeholder epoch of a stream that was not announced when the query started (real epochs
#: start at 1).
NOT_STARTED: Final = 0
OVERWRITTEN: Final = "overwritten"
EPOCH_CHANGE: Final = "epoch_change"
REGIONS_GONE: Final = "region_unavailable"


def _describe(ls: Loss) -> str:
    n = "an unknown number of" if ls.count is None else f"{ls.count}"
    slots = f" ({ls.nslots} slots)" if ls.nslots else ""
    if ls.at_most is not None:
        last = ls.last_seq if ls.last_seq is not None else ls.first_seq
        return (
            f"stream {ls.stream_id}: an unknown number (at most {ls.at_most}) of frame(s) of "
            f"epoch {ls.epoch} within seq {ls.first_seq}..{last} may have been overwritten in "
            f"the ring{slots} before the query read them (a sparse stream: the reader has no "
            "record of which of these seqs were published -- they predate it, or its descriptor "
            "intake overflowed)"
        )
    if ls.reason == EPOCH_CHANGE:
        return (
            f"stream {ls.stream_id}: {n} frame(s) of epoch {ls.epoch} from seq {ls.first_seq} "
            "were never read: the producer restarted (new epoch) before the query caught up"
        )
    if ls.reason == REGIONS_GONE:
        what = "" if ls.count is None else f"{ls.count} "
        return (
            f"stream {ls.stream_id}: {what}frames of epoch {ls.epoch} from seq {ls.first_seq} "
            "could not be read: that epoch's regions are gone (the producer exited or "
            "restarted before the query read them)"
        )
    if ls.count is None:
        return (
            f"stream {ls.stream_id}: frame {ls.first_seq} of epoch {ls.epoch} (and maybe "
            f"more) was overwritten in the ring{slots} after it was planned, before a task "
            "read it"
        )
    last = ls.last_seq if ls.last_seq is not None else ls.first_seq + ls.count - 1
    return (
        f"stream {ls.stream_id}: {n} frame(s) lost (epoch {ls.epoch}, seq "
        f"{ls.first_seq}..{last}) -- overwritten in the ring{slots} before the query read them"
    )


#: Why frames were lost, when a streaming query read slower than the producer wrote.
FELL_BEHIND_HINT: Final = (
    "The query fell behind the producer. Give the ring more slots (header_nslots), put "
    "a rate limiter with a deeper ring in front of the stream, trigger more often or raise "
    "maxFramesPerTrigger/maxBytesPerTrigger, or set failOnDataLoss=false to skip lost frames "
    "(they are then counted in the offsets' 'lost'/'lostLate' fields)."
)
#: Why frames were lost when their epoch's regions are gone (#16.3: not "fell behind").
REGIONS_GONE_HINT: Final = (
    "The producer exited or restarted: frames of an ended epoch cannot be read any more. Keep "
    "the producer running until the query has read its frames, or set failOnDataLoss=false to "
    "skip them (they are then counted in the offsets' 'lost'/'lostLate' fields)."
)


def loss_message(losses: Sequence[Loss], hint: str | None = None) -> str:
    """What was lost and what to change: the text users see when a query fails.

    ``hint`` says why and what to do; by default: the producer exited (every loss is of gone
    regions) or the query fell behind (#16.3: callers that know better pass their own).
    """
    if hint is None:
        gone = bool(losses) and all(ls.reason == REGIONS_GONE for ls in losses)
        hint = REGIONS_GONE_HINT if gone else FELL_BEHIND_HINT
    return "tensorpool data loss: " + "; ".join(_describe(ls) for ls in losses) + ". " + hint


def possible_loss_message(losses: Sequence[Loss]) -> str:
    """Loss that may have happened but cannot be counted (logged, never fails a query)."""
    return "tensorpool possible data loss (not counted in 'lost'): " + "; ".join(
        _describe(ls) for ls in losses
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


#: sizes(stream_id, epoch, seqs) -> byte size of each frame; used when a RingState has no lens
SizeFn = Callable[[int, int, np.ndarray], Sequence[int]]


@dataclass(frozen=True, slots=True)
class Cut:
    """What the source's policies (#17, :mod:`.policy`) decided for one stream's pending
    frames. Every part is a prefix of them, so the offsets record it as seq boundaries."""

    skip: int = 0  # leading frames not delivered: shed (lag, memory) or late and dropped
    flag: int = 0  # frames after those delivered with is_late
    cap: int | None = None  # most frames to deliver after ``skip`` (alignment, rate); None: all
    shed_lag: int = 0
    shed_memory: int = 0
    late: int = 0  # late frames among ``skip`` and ``flag``


# --- partition planning --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Range:
    """Frames of one stream epoch: all committed seqs in ``[first, end)``, or exactly ``runs``.

    ``expect`` is how many frames the plan admitted (None: unknown, an old offset).
    """

    stream_id: int
    epoch: int
    first: int
    end: int  # exclusive
    expect: int | None = None
    runs: np.ndarray | None = field(default=None, compare=False)

    @property
    def count(self) -> int:
        return self.end - self.first if self.runs is None else runs_count(self.runs)


def batch_ranges(start: Mapping[int, StreamPos], end: Mapping[int, StreamPos]) -> list[Range]:
    """Seq ranges a batch ``[start, end)`` covers, per stream (deterministic: replays match)."""
    out = []
    for sid in sorted(end):
        e = end[sid]
        s = start.get(sid)
        if s is None or s.epoch != e.epoch:
            continue  # epoch transition batch: nothing to read for this stream
        expect = None if e.frames is None else e.frames - (s.frames or 0)
        first = max(s.seq, e.skip_to)  # #17: frames below skip_to were shed / late-dropped
        if e.seq > first and expect != 0:
            out.append(Range(sid, e.epoch, first, e.seq, expect))
    return out


def split_ranges(ranges: Sequence[Range], min_partitions: int | None) -> list[Range]:
    """One piece per range, or more so that there are at least ``min_partitions`` pieces.

    Pieces are handed out to ranges in proportion to their frame count (each range at least
    one), then each range is cut into nearly equal consecutive chunks of frames.
    """
    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return []
    want = len(ranges) if min_partitions is None else max(min_partitions, len(ranges))
    extra = split_budget(want - len(ranges), [r.count - 1 for r in ranges])
    pieces: list[Range] = []
    for r, more in zip(ranges, extra, strict=True):
        k = min(r.count, 1 + more)
        base, rem = divmod(r.count, k)
        if r.runs is None:
            at = r.first
            for i in range(k):
                n = base + (1 if i < rem else 0)
                pieces.append(Range(r.stream_id, r.epoch, at, at + n))
                at += n
            continue
        rest = r.runs
        for i in range(k):
            n = base + (1 if i < rem else 0)
            part, rest = _cut_runs(rest, n)
            pieces.append(Range(r.stream_id, r.epoch, int(part[0, 0]), int(part[-1, 1]), n, part))
    return pieces


__all__ = [
    "EPOCH_CHANGE",
    "FELL_BEHIND_HINT",
    "NOT_STARTED",
    "OVERWRITTEN",
    "REGIONS_GONE",
    "REGIONS_GONE_HINT",
    "Cut",
    "Limits",
    "Loss",
    "OffsetError",
    "Offsets",
    "Range",
    "RingState",
    "StreamPos",
    "batch_ranges",
    "decode_offsets",
    "encode_offsets",
    "grow_offsets",
    "iter_seq_chunks",
    "loss_message",
    "possible_loss_message",
    "runs_count",
    "runs_seqs",
    "split_budget",
    "split_ranges",
    "to_runs",
]
